"""Every picture capsnet draws, as PNG files (matplotlib ``Figure`` objects, never pyplot):
images (Figures 3 to 5 of the paper, predictions, an attack's diagnosis, examples), line
charts (training curves, accuracy against rotation and eps) and routing. Needs matplotlib
(``pip install "capsnet[plot]"``), else MissingExtraError."""
from capsnet.extras import require_extra

require_extra("plot")
# ruff: noqa: E402 (the imports below come after the check)
from capsnet.figures.charts import (
    accuracy_eps_figure,
    curve_series,
    rotation_figure,
    training_curves_figure,
)
from capsnet.figures.common import mosaic, save_figure
from capsnet.figures.images import (
    diagnosis_figure,
    examples_figure,
    manipulation_figure,
    pairs_figure,
    prediction_figure,
    reconstruction_figure,
)
from capsnet.figures.routing import routing_figure, routing_types_figure

__all__ = ["accuracy_eps_figure", "curve_series", "diagnosis_figure", "examples_figure",
           "manipulation_figure", "mosaic", "pairs_figure", "prediction_figure",
           "reconstruction_figure", "rotation_figure", "routing_figure", "routing_types_figure",
           "save_figure", "training_curves_figure"]
