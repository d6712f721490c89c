"""Speed by measurement: each convolution's implementation and the model's precision,
chosen for the machine at hand and cached per machine."""
from capsnet.tuning.hardware import cpu_info, machine_description, native_bf16
from capsnet.tuning.plan import (
                                 AUTO,
                                 INFERENCE_BATCH,
                                 SpeedPlan,
                                 apply_plan,
                                 choose_plan,
                                 conv_layers,
                                 current_plan,
                                 interleaved_medians,
                                 tune_for_inference,
)

__all__ = ["AUTO", "INFERENCE_BATCH", "SpeedPlan", "apply_plan", "choose_plan", "conv_layers",
           "cpu_info", "current_plan", "interleaved_medians", "machine_description",
           "native_bf16", "tune_for_inference"]
