"""A whole training run: data on the device, epochs, validation selection, checkpoints, resume."""
from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from capsnet.config import make_config
from capsnet.data.datasets import ImageDataset, load_dataset
from capsnet.data.splits import _mix, epoch_order, stratified_split
from capsnet.devices import tune_backends
from capsnet.models import build_model
from capsnet.training import distributed
from capsnet.training.checkpoint import load_checkpoint, save_checkpoint, unwrap
from capsnet.training.distributed import World
from capsnet.training.loop import NonFiniteLossError, StepOptions, evaluate, train_one_epoch
from capsnet.training.metrics_log import MetricsLog
from capsnet.training.settings import TrainSettings
from capsnet.tuning import SpeedPlan, apply_plan, choose_plan, machine_description


@dataclass
class RunData:
    """The dataset on the training device, with the index sets of the run's split."""

    train: ImageDataset  # the full training set (N, H, W) uint8
    test: ImageDataset
    train_idx: torch.Tensor  # (M,) indices used for training
    val_idx: torch.Tensor  # (V,) held-out validation indices, possibly empty


def prepare_data(settings: TrainSettings, device: torch.device) -> RunData:
    """Load the dataset, carve the validation split, apply --subset, move to ``device``."""
    train, test = load_dataset(settings.dataset, settings.data_dir, settings.download)
    train_idx, val_idx = stratified_split(train.labels, settings.val_size, settings.seed)
    if settings.subset is not None:
        train_idx = train_idx[: settings.subset]
    return RunData(train.to(device), test.to(device), train_idx.to(device), val_idx.to(device))


def make_optimizer(model: torch.nn.Module, lr: float, lr_decay: float):
    """Adam and an exponential learning-rate decay stepped once per epoch."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return optimizer, torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=lr_decay)


def build_for(settings: TrainSettings, data: RunData, device: torch.device,
              image_size: Optional[int] = None):
    """Model, optimiser and scheduler for a run on ``data``; ``image_size`` overrides the
    dataset's own (the protocols that place digits on a larger canvas)."""
    config = make_config(settings.model, settings.preset,
                         image_size=image_size or data.train.images.shape[-1],
                         num_classes=len(data.train.classes),
                         routing_iterations=settings.routing_iterations,
                         use_decoder=settings.reconstruction_weight > 0)
    model = build_model(config).to(device)
    return (model, *make_optimizer(model, settings.lr, settings.lr_decay))


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Inverse of :func:`rng_state`. RNG states must be CPU byte tensors, but a checkpoint
    loaded with map_location='cuda' has moved them to the GPU: bring them back."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def resolve_resume(path: str | Path) -> Path:
    """A run directory or checkpoint file -> the checkpoint to resume from."""
    path = Path(path)
    return path / "last.pt" if path.is_dir() else path


def fit(settings: TrainSettings, resume: Optional[str] = None, argv: Optional[list[str]] = None,
        log: Callable[[str], None] = print) -> dict:
    """Train as ``settings`` say, writing everything to ``settings.out_dir``.
    Returns the final results (also written to results.json).

    Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set) every process calls this: they train
    one DistributedDataParallel model, each rank on its shard of every epoch with a batch
    of ``batch_size / world``; only rank 0 logs and writes files, and every rank returns
    rank 0's results."""
    world = distributed.setup(settings.device)
    finished = False
    try:
        results = _fit(settings, resume, argv, log if world.is_main else _quiet, world)
        finished = True
        return results
    finally:
        distributed.teardown(world, wait_for_all=finished)


def _quiet(_: str) -> None:
    """The log of ranks other than 0."""


def _fit(settings: TrainSettings, resume: Optional[str], argv: Optional[list[str]],
         log: Callable[[str], None], world: World) -> dict:
    device = world.device
    tune_backends(device)
    torch.manual_seed(settings.seed)
    random.seed(settings.seed)
    run_dir = Path(settings.out_dir)
    if world.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    distributed.per_rank_batch(settings.batch_size, world)  # fail early if not divisible
    with distributed.local_main_first(world):  # one download per machine
        data = prepare_data(settings, device)
    model, optimizer, scheduler = build_for(settings, data, device)
    state = {"epoch": 0, "best_val_accuracy": -1.0, "best_epoch": None}
    saved_plan = None
    if resume is not None:
        state, saved_plan = _restore(resolve_resume(resume), model, optimizer, scheduler, device)
        scheduler.gamma = settings.lr_decay  # a resumed run may anneal at a new rate from here
        log(f"resuming {resume} after epoch {state['epoch']}")
    plan = speed_plan_for(settings, model, world, saved_plan)
    apply_plan(model, plan)
    log(f"speed: {plan.describe()}")
    if world.is_main:
        _describe_run(run_dir, settings, model, plan, argv)
    log(f"{settings.model} on {settings.dataset}: {len(data.train_idx)} training, "
        f"{len(data.val_idx)} validation, {len(data.test.labels)} test images; device {device}"
        + (f" x {world.size} processes" if world.distributed else ""))
    train_model = distributed.wrap_model(model, world)
    step_model = torch.compile(train_model) if settings.compile else train_model
    metrics = MetricsLog(run_dir) if world.is_main else None
    try:
        for epoch in range(state["epoch"] + 1, settings.epochs + 1):
            row = _run_epoch(settings, step_model, optimizer, data, epoch, world)
            scheduler.step()
            improved = _select(row, state, epoch)
            state["epoch"] = epoch
            if world.is_main:
                ckpt = dict(optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
                            rng=rng_state(), train_settings=settings.to_dict(), metrics=row,
                            speed_plan=plan.as_dict(), **state)
                save_checkpoint(run_dir / "last.pt", model, **ckpt)
                if improved:
                    save_checkpoint(run_dir / "best.pt", model, **ckpt)
                metrics.log(row)
            log(_epoch_line(row, improved))
    except NonFiniteLossError as exc:
        raise NonFiniteLossError(f"{exc}; stopped. The last good checkpoint is "
                                 f"{run_dir / 'last.pt'} (epoch {state['epoch']}).") from None
    finally:
        if metrics is not None:
            metrics.close()
    results = (_final_report(settings, model, plan, data, run_dir, state, log)
               if world.is_main else None)
    return distributed.broadcast_object(results, world)


def _restore(path: Path, model, optimizer, scheduler, device) -> tuple[dict, Optional[dict]]:
    """Load a checkpoint into the run's objects; returns the epoch state and the run's
    speed plan (None for checkpoints written before plans)."""
    payload = load_checkpoint(path, map_location=device)
    unwrap(model).load_state_dict(payload["state_dict"])
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    set_rng_state(payload["rng"])
    state = {k: payload[k] for k in ("epoch", "best_val_accuracy", "best_epoch")}
    return state, payload.get("speed_plan")


def speed_plan_for(settings: TrainSettings, model, world: World,
                   saved: Optional[dict] = None) -> SpeedPlan:
    """How the run computes: a resumed run on the same machine keeps its plan (the same
    kernels, so the same numbers); otherwise rank 0 measures (or reads its cache) and
    every rank follows it."""
    plan = None
    if world.is_main:
        if saved is not None and saved.get("machine") == machine_description(world.device):
            plan = SpeedPlan.from_dict({**saved, "source": "checkpoint"})
        else:
            plan = choose_plan(unwrap(model), world.device,
                               distributed.per_rank_batch(settings.batch_size, world),
                               precision=settings.precision, conv_impl=settings.conv_impl)
    return distributed.broadcast_object(plan, world)


def _describe_run(run_dir: Path, settings: TrainSettings, model, plan: SpeedPlan, argv) -> None:
    """Write the resolved settings, model config, speed plan and command line into the run
    directory."""
    from capsnet.config import config_to_dict

    (run_dir / "config.json").write_text(json.dumps(
        {"settings": settings.to_dict(), "model_config": config_to_dict(unwrap(model).config),
         "speed": plan.as_dict()}, indent=2) + "\n")
    command = " ".join(["capsnet", *(argv if argv is not None else sys.argv[1:])])
    with open(run_dir / "command.txt", "a") as f:
        f.write(command + "\n")


def _run_epoch(settings: TrainSettings, model, optimizer, data: RunData, epoch: int,
               world: World) -> dict:
    device = world.device
    order = data.train_idx[epoch_order(len(data.train_idx), settings.seed, epoch, device)]
    order = distributed.shard_order(order, world.rank, world.size)  # this rank's share
    generator = torch.Generator(device=device).manual_seed(
        _mix(settings.seed, epoch) + 1 + world.rank)
    options = StepOptions(distributed.per_rank_batch(settings.batch_size, world),
                          settings.max_shift, settings.reconstruction_weight)
    lr = optimizer.param_groups[0]["lr"]
    start = time.perf_counter()
    with _progress(settings.progress and world.is_main, epoch, len(order)) as on_progress:
        train = train_one_epoch(model, optimizer, data.train.images, data.train.labels, order,
                                options, generator, on_progress)
    seconds = time.perf_counter() - start
    loss, accuracy = distributed.all_reduce_mean([train["loss"], train["accuracy"]], world)
    row = {"epoch": epoch, "lr": lr, "train_loss": loss,
           "train_accuracy": accuracy, "epoch_seconds": round(seconds, 3),
           "images_per_second": round(len(order) * world.size / seconds, 1)}
    # The plain module: ranks evaluate different numbers of batches, outside DDP.
    eval_model = unwrap(model) if world.distributed else model
    kwargs = dict(world=world, num_classes=len(data.train.classes),
                  reconstruction_weight=settings.reconstruction_weight)
    if len(data.val_idx):
        val = distributed.evaluate_sharded(eval_model, data.train.images[data.val_idx],
                                           data.train.labels[data.val_idx], **kwargs)
        row.update(val_loss=val.loss, val_accuracy=val.accuracy)
    if settings.monitor_test:
        test = distributed.evaluate_sharded(eval_model, data.test.images, data.test.labels,
                                            **kwargs)
        row.update(test_accuracy_monitoring=test.accuracy)
    return row


def _select(row: dict, state: dict, epoch: int) -> bool:
    """Update the best epoch by validation accuracy (the last epoch when there is no validation)."""
    score = row.get("val_accuracy")
    if score is None:
        state.update(best_epoch=epoch)
        return True
    if score > state["best_val_accuracy"]:
        state.update(best_val_accuracy=score, best_epoch=epoch)
        return True
    return False


def _epoch_line(row: dict, improved: bool) -> str:
    parts = [f"epoch {row['epoch']}", f"loss {row['train_loss']:.4f}",
             f"train acc {row['train_accuracy']:.4f}"]
    if "val_accuracy" in row:
        parts.append(f"val acc {row['val_accuracy']:.4f}" + (" (best)" if improved else ""))
    if "test_accuracy_monitoring" in row:
        parts.append(f"test acc {row['test_accuracy_monitoring']:.4f} (monitoring only)")
    parts.append(f"{row['epoch_seconds']:.1f}s, {row['images_per_second']:.0f} img/s")
    return " | ".join(parts)


def _final_report(settings, model, plan: SpeedPlan, data: RunData, run_dir: Path, state: dict,
                  log) -> dict:
    """Evaluate the test set once for the final and the validation-selected model (both
    running as the run's plan says)."""
    from capsnet.training.checkpoint import model_from_checkpoint

    kwargs = dict(reconstruction_weight=settings.reconstruction_weight)
    final = evaluate(model, data.test.images, data.test.labels, **kwargs)
    results = {"epochs": state["epoch"], "final": final.as_dict()}
    best_path = run_dir / "best.pt"
    if len(data.val_idx) and best_path.exists():
        best = final  # the final epoch was the selected one: the same weights
        if state["best_epoch"] != state["epoch"]:
            best_model = model_from_checkpoint(best_path, map_location=data.test.images.device)
            apply_plan(best_model, plan)
            best = evaluate(best_model, data.test.images, data.test.labels, **kwargs)
        results.update(best_epoch=state["best_epoch"], best_val_accuracy=state["best_val_accuracy"],
                       best=best.as_dict())
        log(f"test accuracy {best.accuracy:.4f} (error {100 * best.error:.2f}%) for the "
            f"validation-selected epoch {state['best_epoch']}; "
            f"{final.accuracy:.4f} for the final epoch {state['epoch']}")
    else:
        log(f"test accuracy {final.accuracy:.4f} (error {100 * final.error:.2f}%) "
            f"after the final epoch {state['epoch']} (no validation split)")
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


class _progress:
    """Context manager yielding an on_progress callback that drives a tqdm bar."""

    def __init__(self, enabled: bool, epoch: int, total: int):
        self.enabled, self.epoch, self.total = enabled, epoch, total
        self.bar = None

    def __enter__(self):
        if not self.enabled:
            return None
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.total, desc=f"epoch {self.epoch}", unit="img",
                        leave=False, dynamic_ncols=True)

        def update(done: int, loss: float, accuracy: float) -> None:
            self.bar.update(done - self.bar.n)
            self.bar.set_postfix(loss=f"{loss:.4f}", acc=f"{accuracy:.4f}")

        return update

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
