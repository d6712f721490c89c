"""How a model computes on the machine at hand (precision and convolution path, by a rule)
and how much memory its training step takes (measured)."""
from capsnet.devices import cpu_info, machine_description, native_bf16
from capsnet.tuning.plan import (
    AUTO,
    SpeedPlan,
    apply_plan,
    choose_plan,
    conv_layers,
    current_plan,
    rule_precision,
    tune_for_inference,
)

__all__ = ["AUTO", "SpeedPlan", "apply_plan", "choose_plan", "conv_layers", "cpu_info",
           "current_plan", "machine_description", "native_bf16", "rule_precision",
           "tune_for_inference"]
