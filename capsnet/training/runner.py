"""The one epoch driver: every training run (the paper's recipe, affNIST, MultiMNIST) goes
through :func:`run_task`, whose epoch loop reads top to bottom (the run directory, DDP under
torchrun, the speed plan, resume, selection by validation, a target accuracy, a time limit,
atomic checkpoints, the metrics log, a stop on a non-finite loss, the memory measured at the
first step, the test once at the end); a :class:`Task` says what differs."""
from __future__ import annotations

import contextlib
import functools
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from capsnet.atomic import append_text, write_json
from capsnet.checkpoint import (
    CheckpointError,
    atomic_copy,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from capsnet.config import config_to_dict
from capsnet.devices import machine_description, tune_backends
from capsnet.models import unwrap
from capsnet.models.base import grad_scaler_for
from capsnet.models.sizing import peak_estimate, untraced
from capsnet.training import distributed
from capsnet.training.distributed import World, rng_state, set_rng_state
from capsnet.training.loop import (
    EVAL_BATCH,
    Batch,
    MakeBatch,
    NonFiniteLossError,
    classification_loss,
    cuda_graphed,
    run_epoch,
    train_step,
)
from capsnet.training.metrics_log import log_metrics, tensorboard_writer, trim_metrics
from capsnet.training.optimisation import Training, build_training, initialise_from_data
from capsnet.training.settings import TrainSettings, resume_checkpoint
from capsnet.tuning import (
    GIB,
    MemoryExceeded,
    SpeedPlan,
    apply_plan,
    choose_plan,
    measure_step_memory,
    memory_line,
    memory_now,
    out_of_memory_message,
    tune_for_inference,
)

Log = Callable[[str], None]
# on_progress(examples_done, mean_loss, accuracy), or None
Progress = Callable[[int, float, float], None] | None


class Task:
    """One kind of training run. :func:`run_task` calls, in order: :meth:`prepare` (once per
    machine first, as it may download), :meth:`model_overrides`, :meth:`describe`, then per
    epoch :meth:`epoch_batches` (its batches go through :meth:`batch_loss` in each step) and
    :meth:`validate`, and at the end :meth:`final_report`. ``epoch_size``: training examples
    per epoch, set by :meth:`prepare`."""

    name = "task"

    def __init__(self, settings: TrainSettings):
        self.settings = settings
        self.epoch_size: int | None = None

    def prepare(self, device: torch.device) -> None:
        """Load the data onto ``device``; set ``epoch_size``."""
        raise NotImplementedError

    def model_overrides(self) -> dict:
        """Config values the data decides (image size, channels, classes)."""
        raise NotImplementedError

    def describe(self, world: World) -> str:
        """One log line: what trains on what."""
        raise NotImplementedError

    def epoch_batches(self, model: nn.Module, epoch: int, world: World
                      ) -> tuple[torch.Tensor, MakeBatch]:
        """This rank's order of the epoch's examples (M,) and the function that makes the
        training batch of some of them (the augmentation)."""
        raise NotImplementedError

    def batch_loss(self, model: nn.Module, batch: Batch, run_fraction) -> tuple:
        """A training batch's loss (float32 scalar) and count of right answers: the
        classifier's (:func:`~capsnet.training.loop.classification_loss`) unless overridden."""
        return classification_loss(model, batch, run_fraction,
                                   self.settings.reconstruction_weight,
                                   self.settings.margin_weight)

    def validate(self, model: nn.Module, world: World) -> dict:
        """{'val_accuracy', ...} of the plain (unwrapped) model; {} without validation."""
        raise NotImplementedError

    def final_report(self, final: nn.Module, best: nn.Module | None, state: dict,
                     log: Log) -> dict:
        """Test once: results for results.json; ``best``: the validation-selected model
        (None when it is the final one or there is none)."""
        raise NotImplementedError

    def initialisation_images(self) -> torch.Tensor | None:
        """Training images (B, C, H, W) in [0, 1] for ``initialise_from_data``, or None."""
        return None


def run_task(task: Task, resume: str | None = None, argv: list[str] | None = None,
             log: Log = print) -> dict:
    """Train ``task`` as its settings say into ``settings.out_dir``; returns the results
    (also in results.json). Under torchrun every process calls this and trains its shard of
    each epoch at ``batch_size / world``; rank 0 alone logs and writes, and every rank
    returns its results. The epoch loop, top to bottom: stop for the target or the time
    limit, train an epoch, validate, select, checkpoint, log."""
    world = distributed.setup(task.settings.device)
    log = log if world.is_main else (lambda _: None)  # rank 0 alone logs
    settings, run_dir, device = task.settings, Path(task.settings.out_dir), world.device
    finished, memory, tensorboard = False, {}, None
    try:
        batch = distributed.per_rank_batch(settings.batch_size, world)  # fails if not divisible
        training, plan, state, grad_scaler = start_run(task, batch, resume, argv, log, world)
        step_model = distributed.wrap_model(training.model, world)
        loss_fn = torch.compile(task.batch_loss) if settings.compile else task.batch_loss
        step = functools.partial(train_step, step_model, training.optimizer, loss_fn,
                                 grad_scaler=grad_scaler, ema=training.ema)
        if settings.cuda_graph and device.type == "cuda":
            step = cuda_graphed(step)
        tensorboard = tensorboard_writer(run_dir) if world.is_main else None
        start = time.perf_counter()
        for epoch in range(state["epoch"] + 1, settings.epochs + 1):
            if state["reached_target"]:  # a resumed run that had reached it
                break
            lr = float(training.optimizer.param_groups[0]["lr"])  # the epoch's first step's
            order, make_batch = task.epoch_batches(step_model, epoch, world)
            step_model.train()
            tick = time.perf_counter()
            with progress_bar(task, world, epoch, memory, batch) as on_progress:
                train = run_epoch(step, order, make_batch, batch, training.scheduler,
                                  on_progress, sum_over_ranks=distributed.summer(world),
                                  run_span=((epoch - 1) / settings.epochs,
                                            epoch / settings.epochs))
            seconds = time.perf_counter() - tick
            loss, accuracy = distributed.all_reduce_mean([train["loss"], train["accuracy"]],
                                                         world)
            row = {"epoch": epoch, "lr": lr, "train_loss": loss, "train_accuracy": accuracy,
                   "epoch_seconds": round(seconds, 3),
                   "images_per_second": round(len(order) * world.size / seconds, 1),
                   **validate(task, training, world)}
            if memory and "logged" not in memory:  # the first epoch of this process
                memory.update(peak=memory_now(device)[1], logged=True)
                log(f"memory: {memory_line(memory, epoch)}")
            state["last_epoch_seconds"] = time.perf_counter() - start - state.get("spent", 0.0)
            state["spent"] = time.perf_counter() - start
            improved = _select(row, state, epoch)
            target = settings.target_accuracy
            state["epoch"] = epoch
            state["reached_target"] = target is not None and row.get("val_accuracy", -1) >= target
            log(epoch_line(row, improved))
            if state["reached_target"]:
                log(f"validation accuracy {row['val_accuracy']:.4f} reached the target "
                    f"{target:.4f}; stopping after epoch {epoch}")
            # rank 0 decides, every rank follows: ranks that stopped apart would hang
            stop = distributed.broadcast_object(world.is_main and (
                state["reached_target"] or _out_of_time(settings, start, state, epoch, log)),
                world)
            resumable = (stop or epoch == settings.epochs
                         or epoch % settings.checkpoint_every == 0)
            rng = rng_state(device, world)  # every rank's (a gather on GPUs)
            if world.is_main:
                _checkpoint(task, training, plan, grad_scaler, state, row, rng, improved,
                            resumable)
                log_metrics(run_dir, row, tensorboard)
            if resumable:
                state["saved_epoch"] = epoch
            if stop:
                break
        results = None
        if world.is_main:
            results = _report(task, training.evaluated, state, log)
        results = distributed.broadcast_object(results, world)
        finished = True
        return results
    except NonFiniteLossError as exc:
        raise NonFiniteLossError(f"{exc}; stopped. The last good checkpoint is "
                                 f"{run_dir / 'last.pt'} (epoch {state['saved_epoch']}).") from None
    except torch.cuda.OutOfMemoryError:
        raise MemoryExceeded(out_of_memory_message(device, settings.batch_size // world.size,
                                                   memory, world.size)) from None
    finally:
        if tensorboard is not None:
            tensorboard.close()
        distributed.teardown(world, wait_for_all=finished)


def start_run(task: Task, batch: int, resume: str | None, argv, log: Log, world: World
              ) -> tuple[Training, SpeedPlan, dict, torch.amp.GradScaler | None]:
    """Everything before the first epoch: the data, the model, Adam, the schedule, the EMA
    (restored when resuming, else initialised from the data), the speed plan, the run
    directory's description. Returns them with the epoch state and the fp16 gradient scaler
    (None in other precisions)."""
    settings, device, run_dir = task.settings, world.device, Path(task.settings.out_dir)
    if settings.cuda_graph and world.distributed:
        raise ValueError("cuda_graph runs in one process; under torchrun leave it off")
    tune_backends(device, deterministic=settings.deterministic)
    torch.manual_seed(settings.seed)
    random.seed(settings.seed)
    with distributed.local_main_first(world):  # one download per machine
        task.prepare(device)
    epoch_size = _epoch_size(task, world)
    steps = 1 if epoch_size is None else max(1, -(-epoch_size // batch))
    training = build_training(settings, task.model_overrides(), device, steps)
    if world.is_main:  # only now: bad data or an unworkable size leave no run directory
        run_dir.mkdir(parents=True, exist_ok=True)
    state = {"epoch": 0, "best_val_accuracy": -1.0, "best_epoch": None, "reached_target": False,
             "saved_epoch": 0}
    saved: dict = {}
    if resume is not None:
        state, saved = _restore(resume_checkpoint(resume), task, training, world)
        log(f"resuming {resume} after epoch {state['epoch']}")
        if world.is_main:  # rows of epochs after last.pt's (--checkpoint-every) are redone
            trim_metrics(run_dir, state["epoch"])
        if saved["schedule_change"]:
            log(saved["schedule_change"])
    else:  # every rank sees the same images: the same initialisation everywhere
        described = initialise_from_data(training, task.initialisation_images())
        if described:
            log(f"initialised from data: {described}")
    plan = speed_plan_for(settings, training.model, world, saved.get("speed_plan"))
    for computing in training.modules():
        apply_plan(computing, plan)
    grad_scaler = grad_scaler_for(device, training.model.compute_dtype)
    if grad_scaler is not None and saved.get("grad_scaler"):
        grad_scaler.load_state_dict(saved["grad_scaler"])
    log(f"speed: {plan.describe()}")
    if world.is_main:
        state["memory_estimate"], state["memory_tensors"] = estimated_memory(
            training, batch, world.device, log)
    if world.is_main:
        describe_run(run_dir, settings, training.model, plan, argv)
    log(task.describe(world))
    return training, plan, state, grad_scaler


def estimated_memory(training: Training, batch: int, device: torch.device,
                     log: Log) -> tuple[int | None, int | None]:
    """The run's peak memory per process and its tensors' part, as
    :func:`capsnet.models.sizing.peak_estimate` traces them (the process's resident memory
    on a CPU, the GPU's allocated on CUDA), logged in one line; None where the device does
    not say or the trace fails."""
    resident = memory_now(device)
    if resident is None:
        return None, None
    try:
        estimate, tensors = peak_estimate(unwrap(training.model), batch, EVAL_BATCH, resident)
    except Exception as exc:  # a model the fake-tensor trace cannot follow: train anyway
        log(f"memory: not estimated ({type(exc).__name__}: {str(exc)[:80]!r})")
        return None, None
    log(f"memory: about {estimate / GIB:.2f} GiB peak per process, estimated ("
        f"{resident[0] / GIB:.2f} GiB resident now plus a training step at batch {batch} and "
        f"an evaluation batch of {EVAL_BATCH}, traced on fake tensors"
        f"{untraced(device, estimate, tensors)})")
    return estimate, tensors


@contextlib.contextmanager
def progress_bar(task: Task, world: World, epoch: int, memory: dict,
                 batch: int) -> Iterator[Progress]:
    """The epoch's progress bar (rank 0, unless --no-progress) as an ``on_progress``; at
    the run's first read-back, after its first step, the step's memory is measured once
    (:func:`capsnet.tuning.measure_step_memory`)."""
    with tqdm(total=_epoch_size(task, world), desc=f"epoch {epoch}", unit="img", leave=False,
              dynamic_ncols=True, disable=not (task.settings.progress and world.is_main)) as bar:

        def on_progress(done: int, loss: float, accuracy: float) -> None:
            if not memory:
                memory.update(measure_step_memory(world.device, batch))
            bar.update(done - bar.n)
            bar.set_postfix(loss=f"{loss:.4f}", acc=f"{accuracy:.4f}")

        yield on_progress


def validate(task: Task, training: Training, world: World) -> dict:
    """The epoch's validation of the plain module (the EMA if any; ranks evaluate different
    numbers of batches, outside DDP) and, with an EMA, of the trained weights too (``_raw``)."""
    row = task.validate(training.evaluated, world)
    if training.ema is not None:  # the trained weights too, so one run ablates the average
        raw = task.validate(unwrap(training.model), world)
        row.update({f"{key}_raw": value for key, value in raw.items()})
    return row


def _checkpoint(task: Task, training: Training, plan: SpeedPlan, grad_scaler,
                state: dict, row: dict, rng: dict, improved: bool, resumable: bool) -> None:
    """When ``resumable`` (every --checkpoint-every epochs, the last and before a stop)
    last.pt (everything a resume needs); best.pt when the epoch improved (a copy of last.pt,
    else written as last.pt would be); with --keep-every the epoch's evaluated weights alone
    as epoch-NNN.pt."""
    settings, run_dir = task.settings, Path(task.settings.out_dir)
    kept = ("epoch", "best_val_accuracy", "best_epoch", "reached_target")  # not the timings
    described = dict(train_settings=settings.to_dict(), metrics=row, speed_plan=plan.as_dict(),
                     **{k: state[k] for k in kept})
    state_now = dict(**training.checkpoint_state(), rng=rng)
    if grad_scaler is not None:
        state_now["grad_scaler"] = grad_scaler.state_dict()
    if resumable:
        save_checkpoint(run_dir / "last.pt", training.evaluated, **state_now, **described)
        if improved:  # the same checkpoint under another name: copied, not re-serialised
            atomic_copy(run_dir / "last.pt", run_dir / "best.pt")
    elif improved:
        save_checkpoint(run_dir / "best.pt", training.evaluated, **state_now, **described)
    epoch = state["epoch"]
    if settings.keep_every and epoch % settings.keep_every == 0:
        # weights only: a third of last.pt (no Adam moments), enough to evaluate the epoch
        save_checkpoint(run_dir / f"epoch-{epoch:03d}.pt", training.evaluated, **described)


def _out_of_time(settings: TrainSettings, start: float, state: dict, epoch: int,
                 log: Log) -> bool:
    """With a time limit, True when another epoch as long as the last would overrun it."""
    if settings.time_limit is None or "last_epoch_seconds" not in state:
        return False
    elapsed = time.perf_counter() - start
    if elapsed + state["last_epoch_seconds"] <= settings.time_limit:
        return False
    state["stopped_for_time"] = True
    log(f"time limit of {settings.time_limit:.0f} s: stopping before epoch {epoch}; continue "
        f"with --resume {settings.out_dir}")
    return True


def _epoch_size(task: Task, world: World) -> int | None:
    """Training examples of an epoch on each rank (None: the task states none)."""
    return None if task.epoch_size is None else -(-task.epoch_size // world.size)


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


def epoch_line(row: dict, improved: bool) -> str:
    """One log line per epoch."""
    parts = [f"epoch {row['epoch']}", f"loss {row['train_loss']:.4f}",
             f"train acc {row['train_accuracy']:.4f}"]
    if "val_accuracy" in row:
        parts.append(f"val acc {row['val_accuracy']:.4f}" + (" (best)" if improved else ""))
    if "val_accuracy_raw" in row:
        parts.append(f"without EMA {row['val_accuracy_raw']:.4f}")
    if "test_accuracy_monitoring" in row:
        parts.append(f"test acc {row['test_accuracy_monitoring']:.4f} (monitoring only)")
    parts.append(f"{row['epoch_seconds']:.1f}s, {row['images_per_second']:.0f} img/s")
    return " | ".join(parts)


def _report(task: Task, model: nn.Module, state: dict, log: Log) -> dict:
    """results.json: where the run stands and, unless its time limit stopped it, the test
    set once for the final and (when it differs) the validation-selected model, both with
    the run's --precision and --conv-impl as `capsnet evaluate` runs them."""
    settings, run_dir = task.settings, Path(task.settings.out_dir)
    complete = not state.get("stopped_for_time")
    results = {"task": task.name, "complete": complete, "epochs": state["epoch"],
               "best_epoch": state["best_epoch"], "best_val_accuracy": state["best_val_accuracy"]}
    if complete:
        device, best = next(model.parameters()).device, None
        if state["best_epoch"] not in (None, state["epoch"]) and (run_dir / "best.pt").exists():
            best = model_from_checkpoint(run_dir / "best.pt", map_location=device)
        for m in (model, best):
            if m is not None:
                tune_for_inference(m.eval(), device, settings.precision, settings.conv_impl)
        results.update(reached_target=state["reached_target"],
                       **task.final_report(model, best, state, log))
    now = memory_now(next(model.parameters()).device)
    results["memory_peak_bytes"] = None if now is None else now[1]  # the test's too
    results["memory_estimate_bytes"] = state.get("memory_estimate")
    results["memory_tensors_bytes"] = state.get("memory_tensors")
    if now is not None:
        log(f"memory: {now[1] / GIB:.2f} GiB peak per process over the whole run")
    write_json(run_dir / "results.json", results)
    return results


def _restore(path: Path, task: Task, training: Training,
             world: World) -> tuple[dict, dict]:
    """Load a checkpoint into the run's objects; returns the epoch state and what else the
    run kept (speed plan, fp16 gradient scaler, the note of a re-planned schedule). Read onto
    the CPU: the state dicts move the weights and Adam's moments to the parameters' device,
    and Adam's step counts stay on the CPU (no host sync per parameter per step)."""
    payload = load_checkpoint(path, map_location="cpu")
    saved_task = payload.get("train_settings", {}).get("task", "classify")
    if saved_task != task.name:
        raise CheckpointError(f"{path}: a {saved_task} run; resume it with the command that "
                              f"started it, not as a {task.name} run")
    if "optimizer" not in payload:
        raise CheckpointError(f"{path}: the weights of one epoch only (--keep-every keeps "
                              f"no optimiser state); resume from last.pt")
    schedule_change = training.restore(payload, path)
    set_rng_state(payload["rng"], world.device, world.rank)
    state = {k: payload[k] for k in ("epoch", "best_val_accuracy", "best_epoch")}
    state["reached_target"] = payload.get("reached_target", False)
    state["saved_epoch"] = state["epoch"]
    return state, {**{k: payload.get(k) for k in ("speed_plan", "grad_scaler")},
                   "schedule_change": schedule_change}


def speed_plan_for(settings: TrainSettings, model, world: World,
                   saved: dict | None = None) -> SpeedPlan:
    """How the run computes: a resumed run on the same machine keeps its plan (the same
    kernels, so the same numbers); otherwise the rule of :func:`capsnet.tuning.choose_plan`,
    rank 0's, which every rank follows."""
    plan = None
    if world.is_main:
        if saved is not None and saved.get("machine") == machine_description(world.device):
            plan = SpeedPlan.from_dict({**saved, "source": "checkpoint"})
        else:
            plan = choose_plan(unwrap(model), world.device, precision=settings.precision,
                               conv_impl=settings.conv_impl)
    return distributed.broadcast_object(plan, world)


def describe_run(run_dir: Path, settings: TrainSettings, model, plan: SpeedPlan,
                 argv: list[str] | None) -> None:
    """Write the resolved settings, model config, speed plan and command line into the run
    directory."""
    write_json(run_dir / "config.json", {
        "settings": settings.to_dict(), "model_config": config_to_dict(unwrap(model).config),
        "speed": plan.as_dict()})
    command = " ".join(["capsnet", *(argv if argv is not None else sys.argv[1:])])
    append_text(run_dir / "command.txt", command + "\n")
