"""Training and evaluation loops, checkpoints, metrics logs and whole runs."""
from capsnet.training.checkpoint import save_checkpoint
from capsnet.training.fit import fit
from capsnet.training.loop import (
                                   EvalResult,
                                   NonFiniteLossError,
                                   StepOptions,
                                   evaluate,
                                   predict_scores,
                                   train_one_epoch,
)
from capsnet.training.settings import TrainSettings

__all__ = ["EvalResult", "NonFiniteLossError", "StepOptions", "TrainSettings", "evaluate", "fit",
           "predict_scores", "save_checkpoint", "train_one_epoch"]
