"""Training and evaluation loops, checkpoints, metrics logs and whole runs."""
from capsnet.training.checkpoint import (CheckpointError, load_checkpoint, model_from_checkpoint,
                                         save_checkpoint)
from capsnet.training.fit import fit
from capsnet.training.loop import (EvalResult, NonFiniteLossError, StepOptions, evaluate,
                                   predict_scores, train_one_epoch)
from capsnet.training.settings import TrainSettings

__all__ = ["CheckpointError", "EvalResult", "NonFiniteLossError", "StepOptions", "TrainSettings",
           "evaluate", "fit", "load_checkpoint", "model_from_checkpoint", "predict_scores",
           "save_checkpoint", "train_one_epoch"]
