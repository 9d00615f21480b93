"""Configuration of every compression channel (fwd, bwd, dp, emb), one dataclass; the dp,
pipeline and emb channels' fields come from their plug-ins (megatron/cc/data_parallel/, one file
per --dp-mode; megatron/cc/pipeline/, one per --forward- / --backward-compress-method;
megatron/cc/embedding/).

The library (megatron.cc) receives this object in constructors and never reads flags itself;
the training driver generates the flags from these fields (megatron.training.config.config_flags).
"""
from dataclasses import dataclass
from typing import Optional

from megatron.cc.common.config_fields import ConfigError, check_bounds, flag
from megatron.cc.data_parallel.registry import DpConfig
from megatron.cc.embedding.registry import EmbConfig
from megatron.cc.pipeline.registry import LowRank, PpConfig, Subspace


@dataclass
class CompressionConfig(DpConfig, PpConfig, EmbConfig):
    check_comp_ratio: bool = flag(
        False, "Log bytes sent per channel and the ratio against uncompressed bytes "
               "(always counted; this also prints a per-channel summary at the end).")
    check_comp_speed: bool = flag(
        False, "Log compression / decompression speed per channel on the log line (GB/s of "
               "uncompressed bytes, mean over messages and ranks; codec compute only, not the "
               "collectives): every pipeline codec, --grad-comp-type RandomizedSVD and "
               "--emb-grad-comp. CUDA events read once complete (no sync); wall clock on CPU.")
    comp_seed: Optional[int] = flag(
        None, "Seed of the low-rank compressors' random draws, equal on every rank: the "
              "initial Q of CB, of --grad-comp's PowerSGD and of --emb-grad-comp, and the "
              "RandomizedSVD projections. Default: --seed (Optimus-CC: 714, independent of "
              "--seed). Saved in checkpoints; a resume must keep it.")

    # ---- --compression auto: the planner chooses the codecs
    #      (megatron/training/compression/auto_compression.py)
    compression: str = flag(
        "manual", "manual: the compression flags given (today's behaviour). auto: at start-up "
                  "probe every channel's link (bandwidth, latency) and the compute rate, run the "
                  "planner of tools/plan_compression.py on the launched tp/pp/dp layout, print "
                  "the plan and train with its fastest candidate within --quality-budget "
                  "(codecs, dp mode and --overlap-* flags; give none of them by hand).",
        choices=["manual", "auto"])
    quality_budget: float = flag(
        2.0, "--compression auto: largest expected validation-loss gap in percent "
             "(megatron/cc/plan/quality.py's measured gaps; unmeasured schemes are left out).")

    # ---- tp channel: Optimus-CC's tensor-parallel compression (megatron/cc/tensor_parallel/tp_reduce.py)
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

    def __post_init__(self):
        DpConfig.__post_init__(self)
        LowRank.fold(self)
        Subspace.fold(self)

    def validate(self, pp: int, dp: int, tp: int) -> None:
        self.validate_auto()
        check_bounds(self)   # the fields' declared bounds, whichever method is on
        self.validate_pipeline_codecs(pp)
        self.validate_dp_mode(pp, dp)
        self.validate_emb(pp)
        self.validate_tp_comp(tp)

    def validate_tp_comp(self, tp: int) -> None:
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

    # fields --compression auto leaves to the user: logging, seeds, transports, emulation
    AUTO_KEEPS = ("compression", "quality_budget", "check_comp_ratio", "check_comp_speed",
                  "comp_seed", "dp_backend", "hetero")

    def validate_auto(self) -> None:
        """--compression auto owns every codec field: one given by hand would be overridden
        or would change what the planner predicted, so it is refused by name."""
        import dataclasses
        if self.quality_budget < 0:
            raise ConfigError(f"--quality-budget is a loss gap in percent, >= 0; got "
                              f"{self.quality_budget}")
        if self.compression == "manual":
            if self.quality_budget != type(self).quality_budget:   # the field's default
                raise ConfigError("--quality-budget is the budget of --compression auto; add "
                                  "--compression auto or drop it")
            return
        # the spellings folded at parse time first, so the message names the flag given
        for f in sorted(dataclasses.fields(self), key=lambda f: f.name not in LowRank.FOLDED):
            value = getattr(self, f.name)
            if f.name not in self.AUTO_KEEPS and value != f.default:
                given = value if f.metadata.get("spellings") else f"--{f.name.replace('_', '-')}"
                raise ConfigError(f"{given} is chosen by --compression auto; drop it, or use "
                                  f"--compression manual")
