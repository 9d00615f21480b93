"""Randomized SVD (Halko, Martinsson & Tropp 2011): the CB codec 'rsvd' and its shared pieces.

Every message starts from a fresh Gaussian test matrix Omega (m x r), not a warm-started Q:

    Y = M Omega;  P = orth(Y)                      range finder
    repeat `niter` times: P = orth(M orth(M^T P))  subspace (power) iterations
    B = M^T P;    M_hat = P B^T                    payload (P, B): r (n + m) values

Omega is drawn from a generator on the message's device seeded with (seed, iteration,
micro-batch) (`seeded_gaussian`): no state, and reproducible on the same kind of device.
Gram-Schmidt runs twice (lowrank.orthogonalize_) because Y is rank-deficient whenever M's rank
is below r. See docs/pipeline_compression.md.
"""
from __future__ import annotations

import torch

from .base import register
from .lowrank import LowRankCodec, matrix_dims, orthogonalize_, shape_key

_MIX = 0x9E3779B97F4A7C15   # odd 64-bit constant: distinct (seed, i, j) give distinct seeds


def message_seed(seed: int, *counters: int) -> int:
    """A 63-bit generator seed from the compressor seed and message counters (iteration, ...)."""
    s = seed & (2**63 - 1)
    for c in counters:
        s = (s * _MIX + int(c) + 1) % (2**63 - 1)
    return s


class SeededGaussian:
    """Gaussian test matrices from one generator per device type, reseeded per message."""

    def __init__(self):
        self._gens: dict[str, torch.Generator] = {}

    def draw(self, shapes, like: torch.Tensor, seed: int) -> list[torch.Tensor]:
        """One standard normal tensor per shape, on like's device and dtype, in order."""
        gen = self._gens.get(like.device.type)
        if gen is None:
            gen = self._gens[like.device.type] = torch.Generator(device=like.device)
        gen.manual_seed(seed)   # host-side: no device work, no sync
        return [torch.randn(s, generator=gen, device=like.device, dtype=like.dtype)
                for s in shapes]


def range_and_coefficients(M: torch.Tensor, omega: torch.Tensor, niter: int, eps: float):
    """Local randomized SVD of M (n x m): (P, B) with P (n x r) orthonormal, M_hat = P B^T."""
    P = orthogonalize_(M @ omega, eps)
    for _ in range(niter):
        P = orthogonalize_(M @ orthogonalize_(M.t() @ P, eps), eps)
    return P, M.t() @ P


@register("rsvd")
class RandomizedSVDCodec(LowRankCodec):
    """CB with a randomized SVD per message (`--inter-grad-comp-type RandomizedSVD`), with LEP.

    The keyword arguments are the 'lowrank' codec's, with the same meaning; power_iters counts
    matmul pairs per message (1 = range finder only). Full rank (r >= min(n, m)) sends M itself.
    State: E per message shape (and the seed, checked on load).
    """

    name = "rsvd"

    def __init__(self, rank: int = 12, error_feedback: bool = False, payload_dtype=None,
                 seed: int = 0, eps: float = 1e-8, flush_on_uncompressed: bool = False,
                 power_iters: int = 1):
        super().__init__(rank, error_feedback, payload_dtype, seed, eps, flush_on_uncompressed,
                         power_iters)
        self._gaussian = SeededGaussian()   # Omega drawn per message: no Q to keep

    def encode(self, x, ctx=None):
        n, m = matrix_dims(x.shape)
        key, pd = shape_key(x.shape), self.payload_dtype or x.dtype
        M, own = self._with_error(x, key, n, m)
        if self.full_rank(x.shape):
            payload = [M.to(pd).contiguous()]
            sent = payload[0].float()
            own = False   # the payload may be M itself
        else:
            it, mb = (ctx.iteration, ctx.microbatch) if ctx is not None else (0, 0)
            omega, = self._gaussian.draw([(m, self.rank)], M, message_seed(self.seed, it, mb))
            P, B = range_and_coefficients(M, omega, self.power_iters - 1, self.eps)
            payload = [P.to(pd), B.to(pd)]
            from megatron.cc.kernels import dispatch
            if self.error_feedback and dispatch.enabled(M) and M.is_contiguous():
                # M - what the receiver rebuilds, in one pass (the same fp32 sums)
                from megatron.cc.kernels import lowrank as fused_lowrank
                self.errors[key] = fused_lowrank.low_rank_residual(M, *payload,
                                                                   out=M if own else None)
                return payload
            sent = self.decode(payload, (n, m), torch.float32)   # as the receiver rebuilds it
        if self.error_feedback:
            self.errors[key] = M.sub_(sent) if own else M - sent
        return payload

    def state_dict(self):
        return {"errors": {k: v.clone() for k, v in self.errors.items()}, "seed": self.seed}

    def load_state_dict(self, sd):
        check_seed(sd, self.seed, "the randomized-SVD CB codec")
        self.errors = {k: v.clone().float() for k, v in sd.get("errors", {}).items()}


def check_seed(sd: dict, seed: int, what: str) -> None:
    """A compressor whose random draws continue from a checkpoint must keep its seed."""
    saved = sd.get("seed")
    if saved is not None and saved != seed:
        raise ValueError(f"{what} was checkpointed with --comp-seed {saved}, this run has "
                         f"{seed}: resume with --comp-seed {saved} (or start a new run)")
