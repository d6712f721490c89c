"""Every picture capsnet draws, as PNG files (matplotlib ``Figure`` objects, never pyplot).

- :func:`reconstruction_figure`: test images over their reconstructions (Figure 3);
- :func:`manipulation_figure`: each pose dimension of a capsule perturbed (Figure 4);
- :func:`prediction_figure`: one input as the model saw it, its reconstruction, the lengths;
- :func:`training_curves_figure`: loss and error per epoch from a run's metrics.csv;
- :func:`routing_figure`: where the winning capsule's support comes from, per iteration
  (:func:`routing_types_figure`: per capsule type, for children without a spatial grid);
- :func:`rotation_figure`, :func:`examples_figure`, :func:`pairs_figure`: robustness
  experiments and MultiMNIST.

Needs matplotlib (``pip install "capsnet[plot]"``): without it, importing this package raises
:class:`capsnet.extras.MissingExtraError` with that command.
"""
from capsnet.extras import require_extra

require_extra("plot")
# ruff: noqa: E402 (the imports below come after the check)
from capsnet.figures.capsules import manipulation_figure, prediction_figure, reconstruction_figure
from capsnet.figures.common import mosaic, save_figure
from capsnet.figures.curves import curve_series, training_curves_figure
from capsnet.figures.robustness import examples_figure, pairs_figure, rotation_figure
from capsnet.figures.routing import routing_figure, routing_types_figure

__all__ = ["curve_series", "examples_figure", "manipulation_figure", "mosaic", "pairs_figure",
           "prediction_figure", "reconstruction_figure", "rotation_figure", "routing_figure",
           "routing_types_figure", "save_figure", "training_curves_figure"]
