"""--mp-acti-comp / --mp-grad-comp: Optimus-CC's PowerSGD on the tensor-parallel all-reduces
(megatron/cc/tensor_parallel/tp_reduce.py)."""
from dataclasses import dataclass

from megatron.cc.common.config_fields import ConfigError, flag


@dataclass
class TpPowerSGD:
    mp_acti_comp: bool = flag(
        False, "PowerSGD (warm-started Q, no error feedback) on the forward all-reduce of the "
               "row-parallel layers (attention and MLP output projections); lossy. Needs "
               "--tensor-model-parallel-size > 1.")
    mp_acti_comp_rank: int = flag(16, "Rank r of --mp-acti-comp's P (tokens x r) and Q "
                                     "(hidden x r).", low=1)
    mp_acti_comp_warm_up: float = flag(
        0.0, "Fraction of --train-iters (from the start) whose forward tp sums are exact; "
             "in [0, 1).")
    mp_acti_comp_type: str = flag("PowerSGD", "Reducer of --mp-acti-comp.",
                                  choices=["PowerSGD"])
    mp_grad_comp: bool = flag(
        False, "PowerSGD (warm-started Q, no error feedback) on the backward all-reduce of the "
               "column-parallel layers' input gradients (QKV, MLP input, output layer); lossy. "
               "Needs --tensor-model-parallel-size > 1.")
    mp_grad_comp_rank: int = flag(16, "Rank r of --mp-grad-comp's factors.", low=1)
    mp_grad_comp_warm_up: float = flag(
        0.0, "Fraction of --train-iters (from the start) whose backward tp sums are exact; "
             "in [0, 1).")
    mp_grad_comp_type: str = flag("PowerSGD", "Reducer of --mp-grad-comp.",
                                  choices=["PowerSGD"])

    def check(self, tp: int) -> None:
        """--mp-acti-comp / --mp-grad-comp, and their options given without them."""
        for what in ("acti", "grad"):
            on = getattr(self, f"mp_{what}_comp")
            for part in ("rank", "warm_up", "type"):
                name = f"mp_{what}_comp_{part}"
                if getattr(self, name) != self.__dataclass_fields__[name].default and not on:
                    raise ConfigError(f"--{name.replace('_', '-')} configures --mp-{what}-comp; "
                                      f"add --mp-{what}-comp (or drop --{name.replace('_', '-')})")
            if on and tp == 1:
                raise ConfigError(f"--mp-{what}-comp compresses the tensor-parallel "
                                  f"all-reduces; with --tensor-model-parallel-size 1 there are "
                                  f"none (raise it, or drop --mp-{what}-comp)")
            if not 0.0 <= getattr(self, f"mp_{what}_comp_warm_up") < 1.0:
                raise ConfigError(f"--mp-{what}-comp-warm-up is a fraction of --train-iters in "
                                  f"[0, 1)")
