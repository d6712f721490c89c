"""Everything a training run is given, in one dataclass saved with the run."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional


@dataclass
class TrainSettings:
    model: str = "capsnet"  # 'capsnet' or 'cnn'
    preset: str = "paper"  # layer sizes: 'paper' or 'small'
    dataset: str = "mnist"  # 'mnist' or 'fashion-mnist'
    data_dir: Optional[str] = None
    download: bool = True
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    lr_decay: float = 0.96  # multiplied into the learning rate after each epoch
    routing_iterations: int = 3
    reconstruction_weight: float = 0.0005  # 0 trains CapsNet without its decoder
    max_shift: int = 2  # random translation augmentation, pixels
    subset: Optional[int] = None  # train on the first N images of the training pool
    val_size: int = 5000  # held out of the training set, stratified; 0 for none
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # 'auto' (measured), 'fp32' or 'bf16' (autocast; routing in float32)
    conv_impl: str = "auto"  # 'auto' (measured), 'gemm', 'native' or 'channels_last'
    compile: bool = False  # torch.compile the model
    monitor_test: bool = False  # also evaluate the test set after every epoch (never for selection)
    out_dir: str = "runs/latest"
    progress: bool = True

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainSettings":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})
