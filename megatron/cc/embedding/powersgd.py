"""--emb-grad-comp: Optimus-CC's PowerSGD on the tied embedding gradient's sum (lossy),
over the plain or the fused group; exact during its warm-up."""
from dataclasses import dataclass

from megatron.cc.common.config_fields import ConfigError, flag
from megatron.cc.embedding.powersgd_sync import EmbPowerSGDSync
from megatron.cc.common.speed import CompSpeed


@dataclass
class EmbPowerSGD:
    emb_grad_comp: bool = flag(
        False, "PowerSGD on the tied embedding gradient's sum between the first and last "
               "stage: P and Q all-reduced over the embedding group (one replica, after the dp "
               "all-reduce), or with --emb-comm-opt over the fused group (every replica). Lossy; "
               "Q warm-started; exact during --emb-grad-comp-warm-up.")
    emb_grad_comp_type: str = flag(
        "PowerSGD", "Reducer of --emb-grad-comp (Optimus-CC implements PowerSGD only).",
        choices=["PowerSGD"])
    emb_grad_comp_rank: int = flag(
        4, "Rank r of the embedding PowerSGD (Optimus-CC default 4). Where r (V/tp + H) >= "
           "(V/tp) H the gradient is summed exactly instead.")
    emb_grad_comp_warm_up: float = flag(
        0.1, "Fraction of --train-iters (from the start) whose embedding sync is exact; in "
             "[0, 1).")
    emb_use_error_feedback: bool = flag(
        False, "--emb-grad-comp keeps each stage's share of the residual (E = M - M_hat / "
               "members; the shares sum to the whole residual) and adds it to its next "
               "gradient.")

    @staticmethod
    def on(c, pp: int) -> bool:
        return c.emb_grad_comp

    @staticmethod
    def check(c, pp: int) -> None:
        for name in ("emb_grad_comp_type", "emb_grad_comp_rank", "emb_grad_comp_warm_up",
                     "emb_use_error_feedback"):
            if getattr(c, name) != EmbPowerSGD.__dataclass_fields__[name].default and \
                    not c.emb_grad_comp:
                raise ConfigError(f"--{name.replace('_', '-')} configures --emb-grad-comp; add "
                                  f"--emb-grad-comp (or drop --{name.replace('_', '-')})")
        if not c.emb_grad_comp:
            return
        if pp < 2:
            raise ConfigError("--emb-grad-comp compresses the tied embedding gradient "
                              "between the first and last pipeline stage; with "
                              "--pipeline-model-parallel-size 1 there is none: drop it")
        if c.emb_grad_comp_rank < 1:
            raise ConfigError(f"--emb-grad-comp-rank must be >= 1, got {c.emb_grad_comp_rank}")
        if not 0.0 <= c.emb_grad_comp_warm_up < 1.0:
            raise ConfigError(f"--emb-grad-comp-warm-up is a fraction of --train-iters in "
                              f"[0, 1), got {c.emb_grad_comp_warm_up}")

    @staticmethod
    def build(c, topo, stats, run, exact):
        """Wraps the exact sum (plain or fused)."""
        return EmbPowerSGDSync(exact, stats, rank=c.emb_grad_comp_rank,
                               warm_up_iters=int(c.emb_grad_comp_warm_up * run.train_iters),
                               error_feedback=c.emb_use_error_feedback, seed=run.comp_seed,
                               speed=CompSpeed(stats) if run.speed is not None else None)
