"""The first minute of benchmarks/gpu_campaign.py: is this machine healthy, and what will it run?

Before any long stage a call prints and records (health.json) the device, its compute
capability, the torch / CUDA / cuDNN versions, the 16-bit precisions it computes natively,
the speed plan chosen for the paper CapsNet at the campaign's batch, one timed training step
and the memory: the estimate of capsnet.tuning.memory against the peak the steps allocated
(``torch.cuda.max_memory_allocated`` on a GPU; live CPU tensors on a CPU).
"""
from __future__ import annotations

import time

import torch

from benchmarks.memory_check import measured_peak
from capsnet.config import make_config
from capsnet.devices import synchronize, tune_backends
from capsnet.losses import model_loss
from capsnet.models import build_model
from capsnet.models.precision import grad_scaler_for
from capsnet.training.loop import backward_and_step
from capsnet.training.settings import TrainSettings
from capsnet.tuning import apply_plan, choose_plan, cpu_info, native_bf16
from capsnet.tuning.memory import GIB, measure_training_memory

MIB = 2**20


def device_facts(device: torch.device) -> dict:
    """What the device is: name, capability, versions, native 16-bit precisions, memory."""
    facts = {"device": str(device), "torch": str(torch.__version__),
             "low_precisions": ["bf16"] if native_bf16(device) else []}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(name=props.name, capability=list(torch.cuda.get_device_capability(device)),
                     memory_gib=round(props.total_memory / GIB, 1), cuda=torch.version.cuda,
                     cudnn=torch.backends.cudnn.version(), devices=torch.cuda.device_count())
    else:
        facts.update(name=cpu_info()[0], threads=torch.get_num_threads())
    return facts


def timed_steps(model, device: torch.device, batch: int, steps: int) -> float:
    """Seconds per training step (forward, loss, backward, Adam; fp16 with a scaler) over
    ``steps`` steps after one warm-up step, on random images."""
    cfg = model.config
    x = torch.rand(batch, cfg.in_channels, cfg.image_size, cfg.image_size, device=device)
    y = torch.randint(0, cfg.num_classes, (batch,), device=device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = grad_scaler_for(device, model.compute_dtype)

    def step():
        loss = model_loss(model(x, y), x, y)
        optimizer.zero_grad(set_to_none=True)
        backward_and_step(loss, optimizer, scaler)

    model.train()
    step()  # cuDNN's autotuning, the allocator's growth
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - start) / steps


def health_check(device: torch.device, settings: TrainSettings, batch: int,
                 steps: int = 3) -> dict:
    """The checks above for the CapsNet of ``settings.preset`` at ``batch``; a record."""
    start = time.perf_counter()
    record = device_facts(device)
    tune_backends(device)
    config = make_config("capsnet", settings.preset)
    model = build_model(config).to(device)
    plan = choose_plan(model, device, batch, precision=settings.precision,
                       conv_impl=settings.conv_impl)
    apply_plan(model, plan)
    seconds = timed_steps(model, device, batch, steps)
    if device.type == "cuda":
        measured, how = torch.cuda.max_memory_allocated(device), "max_memory_allocated"
    else:
        measured = measured_peak(config, batch, plan.precision, plan.conv_impls)
        how = "live CPU tensors"
    estimate = measure_training_memory(model, batch)  # after: it resets the CUDA peak
    record.update(preset=settings.preset, batch=batch, plan=plan.describe(),
                  precision=plan.precision, conv_impls=plan.conv_impls,
                  step_ms=round(1000 * seconds, 2), images_per_second=round(batch / seconds, 1),
                  memory_estimate_mib=round(estimate.total / MIB, 1),
                  memory_measured_mib=round(measured / MIB, 1), memory_measured_by=how,
                  estimate_over_measured=round(estimate.total / measured, 3),
                  seconds=round(time.perf_counter() - start, 1))
    return record


def print_health(record: dict) -> None:
    if "error" in record:
        print(f"health: FAILED: {record['error'].strip().splitlines()[-1]}")
        return
    where = (f"sm_{''.join(map(str, record['capability']))}, {record['memory_gib']} GiB, "
             f"CUDA {record['cuda']}, cuDNN {record['cudnn']}" if "capability" in record
             else f"{record['threads']} threads")
    print(f"health: {record['device']} = {record['name']} ({where}); torch {record['torch']}; "
          f"native 16-bit: {', '.join(record['low_precisions']) or 'none'}")
    print(f"health: plan for the {record['preset']} CapsNet at batch {record['batch']}: "
          f"{record['plan']}")
    print(f"health: one training step {record['step_ms']:.1f} ms "
          f"({record['images_per_second']:.0f} img/s); memory estimate "
          f"{record['memory_estimate_mib']:.0f} MiB, measured {record['memory_measured_mib']:.0f} "
          f"MiB ({record['memory_measured_by']}; x{record['estimate_over_measured']}); "
          f"{record['seconds']:.0f} s for these checks")
