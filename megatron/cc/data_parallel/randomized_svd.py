"""Optimus-CC `--grad_comp_type RandomizedSVD`: the dp channel by a distributed randomized SVD.

A randomized SVD (Halko et al. 2011) of the replicas' *mean* gradient, each product
all-reduced (M_d: the replica's gradient viewed as n x m, plus its error E_d):

    Omega ~ N(0, 1) (m x r)            seeded by (--comp-seed, iteration): alike on every replica
    Y = M_d Omega;  all-reduce(Y)      one flat buffer for every parameter (as P in PowerSGD)
    niter times:    P = orth(Y);  Z = M_d^T P, all-reduce(Z);  Y = M_d orth(Z), all-reduce(Y)
    P = orth(Y);    B = M_d^T P;  all-reduce(B) / dp
    M_hat = P B^T  (= P P^T M)    E_d <- M_d - M_hat;   main_grad <- M_hat (x DDP's factor)

niter = 0 sends exactly PowerSGD's bytes. Everything else (which tensors are compressed,
warm-up, scaling, byte counting) is PowerSGDDataParallelSync's. State: E per parameter and
the seed. How it differs from the seed's: docs/seed_commands.md.
"""
import torch
import torch.distributed as dist

from megatron.cc.codecs.lowrank import orthogonalize_
from megatron.cc.codecs.rsvd import SeededGaussian, check_seed, message_seed
from megatron.cc.data_parallel.powersgd import NamedMatrices, PowerSGDDataParallelSync
from megatron.cc.common.speed import record


class RandomizedSVDDataParallelSync(PowerSGDDataParallelSync):
    """dp channel: randomized SVD of the mean gradient (rank r, `niter` subspace iterations).

    Args as PowerSGDDataParallelSync, plus:
        niter: subspace iterations after the first projection (--grad-comp-niter).
        speed: optional megatron.cc.common.speed.CompSpeed (--check-comp-speed).
    """

    def __init__(self, group, stats, rank: int = 128, warm_up_iters: int = 0,
                 exclude_embedding: bool = False, seed: int = 0, niter: int = 1,
                 speed=None, eps: float = 1e-8):
        if niter < 0:
            raise ValueError(f"randomized SVD niter must be >= 0, got {niter}")
        super().__init__(group, stats, rank=rank, warm_up_iters=warm_up_iters,
                         exclude_embedding=exclude_embedding, seed=seed, eps=eps)
        self.niter, self.speed = niter, speed
        self.iteration = 0
        self._gaussian = SeededGaussian()

    def __call__(self, model, iteration: int) -> None:
        self.iteration = iteration   # Omega's seed
        super().__call__(model, iteration)

    # PowerSGDDataParallelSync.reduce calls this for the compressed matrices
    def _powersgd(self, compress: NamedMatrices, post: float) -> int:
        self.init_state(compress)   # P / Q-sized flat buffers (its initial Qs go unused)
        Ps, Qs = self._views(compress)
        raw = sum(M.numel() * M.element_size() for _, M in compress)
        rec = record(self.speed, "dp", "comp", self._p_flat, raw)
        with rec:
            for name, M in compress:
                if name in self.errors:
                    M.add_(self.errors[name])
            omegas = self._gaussian.draw([Q.shape for Q in Qs], self._q_flat,
                                         message_seed(self.seed, self.iteration))
            for (_, M), P, omega in zip(compress, Ps, omegas):
                torch.mm(M, omega, out=P)
        dist.all_reduce(self._p_flat, group=self.group)
        for _ in range(self.niter):
            self._half_step(compress, Ps, Qs, rec, transpose=True)     # Q-side: M^T orth(P)
            self._half_step(compress, Qs, Ps, rec, transpose=False)    # P-side: M orth(Q)
        self._half_step(compress, Ps, Qs, rec, transpose=True)
        self._q_flat.div_(self.world)   # B = P^T (mean of M_d)
        rec.done()
        dec = record(self.speed, "dp", "decomp", self._p_flat, raw)
        with dec:
            for (name, M), P, B in zip(compress, Ps, Qs):
                self._rebuild(name, M, P, B, None, post)
        dec.done()
        per_round = (self._p_flat.numel() * self._p_flat.element_size()
                     + self._q_flat.numel() * self._q_flat.element_size())
        return (1 + self.niter) * per_round

    def _half_step(self, compress, srcs, dsts, rec, transpose: bool) -> None:
        """dst = M^T orth(src) (or M orth(src)) for every matrix, then all-reduce dst's buffer."""
        with rec:
            for (_, M), src, dst in zip(compress, srcs, dsts):
                orthogonalize_(src, self.eps)
                torch.mm(M.t() if transpose else M, src, out=dst)
        dist.all_reduce(self._q_flat if transpose else self._p_flat, group=self.group)

    # ---------------------------------------------------------------- checkpoint state
    def state_dict(self) -> dict:
        errors = self.errors if self._q_flat is not None else self._pending.get("errors", {})
        return {"errors": {n: e.clone() for n, e in errors.items()}, "seed": self.seed}

    def load_state_dict(self, sd: dict) -> None:
        check_seed(sd, self.seed, "the RandomizedSVD dp reducer (--grad-comp-type)")
        super().load_state_dict({"errors": sd.get("errors", {})})
