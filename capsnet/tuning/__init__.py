"""Speed by measurement: each convolution's implementation and the model's precision,
chosen for the machine at hand and cached per machine; and how much memory a run needs."""
from capsnet.tuning.conv_timer import ConvTimer, conv_layers
from capsnet.tuning.hardware import (
    cpu_info,
    low_precisions,
    machine_description,
    native_bf16,
    native_low_precisions,
)
from capsnet.tuning.plan import (
    AUTO,
    INFERENCE_BATCH,
    SpeedPlan,
    apply_plan,
    choose_plan,
    current_plan,
    tune_for_inference,
)
from capsnet.tuning.timing import interleaved_medians, timing_schedule

__all__ = ["AUTO", "INFERENCE_BATCH", "ConvTimer", "SpeedPlan", "apply_plan", "choose_plan",
           "conv_layers", "cpu_info", "current_plan", "interleaved_medians", "low_precisions",
           "machine_description", "native_bf16", "native_low_precisions", "timing_schedule",
           "tune_for_inference"]
