"""Training: one epoch and evaluation (loop), the one epoch driver for every run (runner),
classification (fit), several seeds (repeat), settings and recipes (settings), the model,
Adam, schedule and moving average (optimisation), DDP (distributed), metrics (metrics_log)."""
from capsnet.checkpoint import save_checkpoint
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
