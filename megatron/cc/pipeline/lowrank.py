"""--backward-compress-method lowrank (= --inter-grad-comp): Optimus-CC's compressed
backpropagation (CB), one PowerSGD step per activation gradient, with lazy error propagation
(LEP) and epilogue-only compression as options."""
from dataclasses import dataclass
from typing import Optional

from megatron.cc.codecs.lowrank import LowRankCodec
from megatron.cc.codecs.rsvd import RandomizedSVDCodec
from megatron.cc.common.config_fields import ConfigError, flag
from megatron.cc.pipeline.policy import BackwardCompressionPolicy
from megatron.cc.pipeline.base import PpMethod

# --inter-grad-comp-type -> the codec that implements it (same keyword arguments)
CB_CODECS = {"PowerSGD": LowRankCodec, "RandomizedSVD": RandomizedSVDCodec}


@dataclass
class LowRank(PpMethod):
    name = "lowrank"
    backward_rank: Optional[int] = flag(
        None, "lowrank gradients: rank r of the CB factors; default --inter-grad-comp-rank.")
    inter_grad_comp: bool = flag(
        False, "Compress the activation gradients sent back between pipeline stages with one "
               "PowerSGD step (low-rank P, Q; Q warm-started across messages).")
    inter_grad_comp_rank: int = flag(12, "Rank r of the CB factors (paper runs 16). Ratio in "
                                         "elements = n*m / (r*(n+m)); r >= min(n, m) is exact.",
                                     low=1)
    inter_grad_comp_power_iters: int = flag(
        1, "Power steps per CB message (ours; the paper does 1). Each extra step costs two "
           "local matmuls on the sender and no bytes, and brings P Q^T closer to the best "
           "rank-r approximation of the gradient.", low=1)
    inter_grad_comp_warm_up: float = flag(
        0.0, "Fraction of --train-iters (from the start) whose backward sends go uncompressed.")
    inter_grad_comp_epilogue_only: bool = flag(
        False, "Compress only the backward sends on 1F1B's critical path: the last send of the "
               "steady phase and every send of the cool-down. Both ends decide from (stage, "
               "micro-batch, pp, M) alone.")
    inter_grad_comp_dtype: Optional[str] = flag(
        None, "dtype of P and Q on the wire (float32|bfloat16|float16); default: the "
              "gradient's dtype, so the byte ratio equals the element ratio.",
        choices=["float32", "bfloat16", "float16"])
    inter_grad_comp_type: str = flag(
        "PowerSGD", "CB codec: PowerSGD (the 'lowrank' codec, Q warm-started across messages) "
                    "or RandomizedSVD (the 'rsvd' codec: a fresh Gaussian projection per "
                    "message, seeded by --comp-seed, iteration and micro-batch; "
                    "--inter-grad-comp-power-iters - 1 subspace iterations). Same bytes. "
                    "Optimus-CC accepts this flag and always runs PowerSGD.",
        choices=["PowerSGD", "RandomizedSVD"])
    use_error_feedback: bool = flag(
        False, "Lazy error propagation for CB: the sender keeps E = M - P Q^T and adds it to the "
               "next message (across micro-batches and iterations); E is never sent alone. "
               "With --grad-comp and no CB it is Optimus-CC's PowerSGD error feedback, which "
               "--grad-comp always applies here.")
    lep_flush_on_uncompressed: bool = flag(
        False, "LEP: when a backward send goes uncompressed (the steady phase under "
               "--inter-grad-comp-epilogue-only, or CB warm-up), add the pending error E to it "
               "and send it exactly (E <- 0) instead of holding E for the next compressed send.")
    check_orth_error_acti: bool = flag(
        False, "Optimus-CC Fig. 11 diagnostic: on the last stage, log the cosine between the "
               "LEP error and the change of the stage's input activation between consecutive "
               "micro-batches, and the mean magnitude of both.")

    FOLDED = ("inter_grad_comp", "backward_rank")

    @staticmethod
    def fold(c) -> None:
        """One spelling from here on: --inter-grad-comp is the method lowrank, --backward-rank
        its --inter-grad-comp-rank (both kept where they contradict, for `check` to refuse)."""
        if c.inter_grad_comp and c.backward_compress_method == "none":
            c.backward_compress_method = "lowrank"
        if c.backward_rank is not None and not c.inter_grad_comp:
            c.inter_grad_comp_rank = c.backward_rank

    @staticmethod
    def profile(c) -> str:
        return CB_CODECS[c.inter_grad_comp_type].name

    @staticmethod
    def check(c, pp: int) -> None:
        if c.backward_rank is not None:
            if c.backward_compress_method != "lowrank":
                raise ConfigError(f"--backward-rank is the rank of --backward-compress-method "
                                  f"lowrank, but the method is {c.backward_compress_method}")
            if c.backward_rank < 1:
                raise ConfigError(f"--backward-rank must be >= 1, got {c.backward_rank}")
            if c.inter_grad_comp and c.backward_rank != c.inter_grad_comp_rank:
                raise ConfigError(f"--backward-rank {c.backward_rank} and "
                                  f"--inter-grad-comp-rank {c.inter_grad_comp_rank} give the "
                                  f"same CB codec two ranks; drop --inter-grad-comp or make "
                                  f"them equal")

    @staticmethod
    def check_options(c) -> None:
        """CB's modifiers (after every method's `check` and the shared pipeline rules)."""
        if c.inter_grad_comp_type != "PowerSGD" and not c.compressed_backprop:
            raise ConfigError("--inter-grad-comp-type configures --inter-grad-comp; add "
                              "--inter-grad-comp (or drop --inter-grad-comp-type)")
        if not 0.0 <= c.inter_grad_comp_warm_up < 1.0:
            raise ConfigError(f"--inter-grad-comp-warm-up is a fraction of --train-iters in "
                              f"[0, 1), got {c.inter_grad_comp_warm_up}")
        if c.use_error_feedback and not (c.compressed_backprop or c.grad_comp):
            raise ConfigError("--use-error-feedback switches on error feedback of compressed "
                              "backpropagation (LEP) or of --grad-comp's PowerSGD; add "
                              "--inter-grad-comp or --grad-comp")
        for name in ("inter_grad_comp_epilogue_only",
                     "lep_flush_on_uncompressed", "check_orth_error_acti"):
            if getattr(c, name) and not c.compressed_backprop:
                raise ConfigError(f"--{name.replace('_', '-')} modifies compressed "
                                  f"backpropagation; add --inter-grad-comp")
        if c.lep_flush_on_uncompressed and not c.use_error_feedback:
            raise ConfigError("--lep-flush-on-uncompressed delivers the LEP error; add "
                              "--use-error-feedback")
        if c.check_orth_error_acti and not c.use_error_feedback:
            raise ConfigError("--check-orth-error-acti measures the LEP error; add "
                              "--use-error-feedback")

    @staticmethod
    def codec(c, spec):
        return CB_CODECS[c.inter_grad_comp_type](
            rank=c.inter_grad_comp_rank, error_feedback=c.use_error_feedback,
            payload_dtype=c.inter_grad_comp_dtype, seed=spec.comp_seed,
            flush_on_uncompressed=c.lep_flush_on_uncompressed,
            power_iters=c.inter_grad_comp_power_iters)

    @staticmethod
    def policy(c, spec):
        """Uncompressed during its own warm-up (a fraction of --train-iters) and the pipeline's,
        then every send or (--inter-grad-comp-epilogue-only) the critical-path ones."""
        return BackwardCompressionPolicy(
            sender_stage=spec.sender_stage, pp=spec.pp, num_microbatches=spec.num_microbatches,
            warmup_iters=max(int(c.inter_grad_comp_warm_up * spec.train_iters),
                             spec.warmup_iters),
            epilogue_only=c.inter_grad_comp_epilogue_only, sender_chunk=spec.sender_chunk,
            vp=spec.vp)
