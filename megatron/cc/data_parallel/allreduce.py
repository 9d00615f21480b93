"""--dp-mode allreduce: gradients averaged before every optimizer step, exactly or, with
--grad-comp, by PowerSGD / RandomizedSVD on the first k stages (Optimus-CC's SC)."""
from dataclasses import dataclass
from typing import Optional

from megatron.cc.common.config_fields import ConfigError, flag
from megatron.cc.data_parallel.base import GRAD_BYTES, DpMode, exact_bytes
from megatron.cc.data_parallel.overlap import OverlappedExactSync, OverlappedPowerSGDSync
from megatron.cc.data_parallel.powersgd import PowerSGDDataParallelSync, sent_values
from megatron.cc.data_parallel.randomized_svd import RandomizedSVDDataParallelSync
from megatron.cc.grad_sync.sync import ExactDataParallelSync


@dataclass
class AllReduce(DpMode):
    name = "allreduce"
    syncs_parameters = False
    own_group = True
    grad_comp: bool = flag(
        False, "PowerSGD (with error feedback and warm-started Q) on data-parallel gradients. "
               "1-D tensors, small matrices and the embedding/output weights stay exact. "
               "No effect with data-parallel size 1 (nothing crosses the dp group).")
    grad_comp_rank: int = flag(128, "Rank r of the PowerSGD factors P (n x r) and Q (m x r) "
                                    "(Optimus-CC paper: 128).", low=1)
    grad_comp_warm_up: float = flag(
        0.1, "Fraction of --train-iters (from the start) that all-reduce gradients exactly "
             "before PowerSGD begins; in [0, 1).")
    grad_comp_type: str = flag(
        "PowerSGD", "Reducer of --grad-comp: PowerSGD (Q warm-started; one all-reduce of P and "
                    "one of Q per step) or RandomizedSVD (a randomized SVD of the replicas' "
                    "mean gradient from a fresh Gaussian projection seeded by --comp-seed and "
                    "the iteration; 1 + --grad-comp-niter all-reduces of each). Both keep "
                    "error feedback and leave the same tensors exact.",
        choices=["PowerSGD", "RandomizedSVD"])
    grad_comp_niter: Optional[int] = flag(
        None, "--grad-comp-type RandomizedSVD: subspace iterations after the first projection "
              "(torch.svd_lowrank's niter; Optimus-CC passes 1, the default here); each costs "
              "one more all-reduce of P and of Q. 0 sends PowerSGD's bytes.")
    selective_grad_comp: bool = flag(
        False, "Only pipeline stages 0..k-1 (k = --selective-grad-comp-way) compress their dp "
               "gradients (their all-reduce ends last, on the critical path); later stages "
               "all-reduce exactly. Needs --grad-comp.")
    selective_grad_comp_way: Optional[int] = flag(
        None, "k for --selective-grad-comp, k >= 1; default max(1, pp - 1) (paper: pp=4, "
              "k=3). k >= pipeline size compresses every stage, as in Optimus-CC.")

    @classmethod
    def owned(cls):
        return ()   # --grad-comp's options are checked against --grad-comp, in `check`

    def compressed_stages(self, pp: int) -> int:
        """How many leading pipeline stages run PowerSGD on their dp gradients."""
        if not self.grad_comp:
            return 0
        if not self.selective_grad_comp:
            return pp
        # way > pp compresses every stage, as Optimus-CC's `stage < way` test does
        return min(self.selective_grad_comp_way or max(1, pp - 1), pp)

    @staticmethod
    def check(c, pp: int, dp: int) -> None:
        if c.selective_grad_comp and not c.grad_comp:
            raise ConfigError("--selective-grad-comp chooses which stages run --grad-comp; "
                              "add --grad-comp (or drop --selective-grad-comp)")
        k = c.selective_grad_comp_way
        if k is not None and k < 1:
            raise ConfigError(f"--selective-grad-comp-way {k} must be >= 1 (values above the "
                              f"pipeline size {pp} compress every stage)")
        if not 0.0 <= c.grad_comp_warm_up < 1.0:
            raise ConfigError(f"--grad-comp-warm-up is a fraction of --train-iters in [0, 1), "
                              f"got {c.grad_comp_warm_up}")
        for name, needs, flag_ in (("grad_comp_type", c.grad_comp, "--grad-comp"),
                                   ("grad_comp_niter", c.grad_comp_type == "RandomizedSVD",
                                    "--grad-comp-type RandomizedSVD")):
            if getattr(c, name) != AllReduce.__dataclass_fields__[name].default and not needs:
                raise ConfigError(f"--{name.replace('_', '-')} configures {flag_}; add "
                                  f"{flag_} (or drop --{name.replace('_', '-')})")
        if c.grad_comp_niter is not None and c.grad_comp_niter < 0:
            raise ConfigError(f"--grad-comp-niter must be >= 0, got {c.grad_comp_niter}")
        if c.dp_mode != "allreduce" and c.grad_comp:
            raise ConfigError(f"--dp-mode {c.dp_mode} replaces the gradient all-reduce that "
                              f"--grad-comp compresses; drop one of them")

    @staticmethod
    def profile(c) -> str:
        return "powersgd" if c.grad_comp else "none"

    @staticmethod
    def stage_bytes(c, params, layout, stage, iteration):
        """Exact (sync.py) or, on the first k stages after the warm-up, PowerSGD (powersgd.py):
        1-D, embedding/output and matrices where r (n + m) >= n m exact, the rest as P (n x r)
        and Q (m x r); RandomizedSVD sends P and Q 1 + niter times."""
        if c.emb_comm_opt and layout.pp > 1:   # fused: the emb channel carries the tied weight
            params = [p for p in params if not p.shared_embedding]
        warm = int(c.grad_comp_warm_up * layout.train_iters)
        compressed = c.of(AllReduce).compressed_stages(layout.pp)
        if stage >= compressed or (iteration is not None and iteration < warm):
            return exact_bytes(params)
        exact = lowrank = 0
        for p in params:   # embedding / output weights stay exact (powersgd.py's rule)
            e, f = (p.numel, 0) if p.embedding_or_output else \
                sent_values(p.shape, c.grad_comp_rank)
            exact, lowrank = exact + e, lowrank + f
        if c.grad_comp_type == "RandomizedSVD":
            lowrank *= 1 + (1 if c.grad_comp_niter is None else c.grad_comp_niter)
        return {"sent": GRAD_BYTES * (exact + lowrank), "messages": 1,
                "raw": GRAD_BYTES * sum(p.numel for p in params)}

    @staticmethod
    def build(c, topo, stats, run):
        group = topo.channel_group(topo.dp_group, c.dp_backend)   # collective
        exclude, overlap = run.exclude_embedding, run.overlap_grad_reduce
        buckets = dict(bucket_size=run.bucket_size, num_microbatches=run.num_microbatches)
        if topo.dp_size > 1 and topo.pp_rank < c.of(AllReduce).compressed_stages(topo.pp_size):
            kw = dict(rank=c.grad_comp_rank, exclude_embedding=exclude, seed=run.comp_seed,
                      warm_up_iters=int(c.grad_comp_warm_up * run.train_iters))
            if c.grad_comp_type == "RandomizedSVD":   # after backward only (flags check)
                niter = 1 if c.grad_comp_niter is None else c.grad_comp_niter
                return RandomizedSVDDataParallelSync(group, stats, niter=niter, speed=run.speed,
                                                     **kw)
            if overlap:
                return OverlappedPowerSGDSync(group, stats, **kw, **buckets)
            return PowerSGDDataParallelSync(group, stats, **kw)
        if overlap:
            return OverlappedExactSync(group, stats, exclude, **buckets)
        return ExactDataParallelSync(group, stats, exclude_embedding=exclude,
                                     use_group=group is not topo.dp_group)
