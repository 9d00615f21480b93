"""Optimus-CC compressed backpropagation (CB) with lazy error propagation (LEP).

One PowerSGD step per message, no all-reduce: the gradient x of shape (..., m) is viewed as
M (n x m), n the product of all but the last dim;

    sender:   [M <- M + E]              (LEP, if error_feedback)
              orthogonalise Q; P = M Q; orthogonalise P; Q <- M^T P   (Q warm-started)
              payload = [P (n x r), Q (m x r)] in payload_dtype
              [E <- M - P Q^T]          (from the payload as sent)
    receiver: M_hat = P Q^T

At r >= min(n, m) the codec sends M itself (exact in the gradient's dtype), since r (n + m)
elements would cost more; the case depends on shape and r only. Q and E are kept per input
shape and are in state_dict. power_iters and flush_on_uncompressed are this project's
additions (docs/pipeline_compression.md).
"""
from __future__ import annotations

import math

import torch

from .base import Codec, parse_dtype, register


def orthogonalize_(p: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Orthonormalise the columns of p (..., n, r) in place by Gram-Schmidt, twice; returns p.

    Each column is divided by max(its norm, eps * the largest column norm of p), so a numerically
    zero column stays near zero and every other is normalised exactly, however small the
    gradient. Run it in fp32.
    """
    from megatron.cc.kernels import dispatch
    # one program per matrix: worth it where launches dominate (CB's messages, small dp
    # factors); a tall P stays on the eager matmuls, which spread over the whole GPU
    if p.dim() == 2 and p.dtype == torch.float32 and p.is_contiguous() \
            and p.shape[0] <= 16384 and dispatch.enabled(p):
        from megatron.cc.kernels import lowrank as fused_lowrank  # one launch, not ~450
        return fused_lowrank.orthogonalize_(p, eps)
    r = p.shape[-1]
    for _ in range(2):
        scale = torch.linalg.vector_norm(p, dim=-2, keepdim=True).amax(dim=-1, keepdim=True)
        floor = torch.where(scale > 0, eps * scale, torch.full_like(scale, eps))
        for i in range(r):
            col = p[..., i:i + 1]
            col.div_(torch.maximum(torch.linalg.vector_norm(col, dim=-2, keepdim=True), floor))
            if i + 1 < r:
                rest = p[..., i + 1:]
                rest.sub_(col @ (col.transpose(-1, -2) @ rest))
    return p


def matrix_dims(shape) -> tuple[int, int]:
    """(n, m): rows = product of all dims but the last, columns = the last dim."""
    shape = tuple(shape)
    m = shape[-1] if shape else 1
    return (math.prod(shape) // m if m else 0), m


def shape_key(shape) -> str:
    return "x".join(str(int(s)) for s in shape)


@register("lowrank")
class LowRankCodec(Codec):
    """Rank-r PowerSGD compression of one gradient message (Optimus-CC CB, with LEP).

    Args:
        rank: r, columns of P and Q (Optimus-CC --inter-grad-comp-rank; paper 16).
        error_feedback: keep the sender-side error buffer E (--use-error-feedback).
        payload_dtype: dtype of P and Q on the wire; None = the gradient's dtype.
        seed: seed of the generator that initialises every Q.
        eps: relative floor of column norms in `orthogonalize_`.
        flush_on_uncompressed: deliver E in full with the next uncompressed message.
        power_iters: power steps per message (1 = PowerSGD / the paper).
    """

    name = "lowrank"

    def __init__(self, rank: int = 12, error_feedback: bool = False, payload_dtype=None,
                 seed: int = 0, eps: float = 1e-8, flush_on_uncompressed: bool = False,
                 power_iters: int = 1):
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        if power_iters < 1:
            raise ValueError(f"power_iters must be >= 1, got {power_iters}")
        self.rank, self.error_feedback, self.seed, self.eps = rank, error_feedback, seed, eps
        self.flush_on_uncompressed, self.power_iters = flush_on_uncompressed, power_iters
        self.payload_dtype = parse_dtype(payload_dtype)
        self.qs: dict[str, torch.Tensor] = {}      # shape key -> Q (m x r), fp32
        self.errors: dict[str, torch.Tensor] = {}  # shape key -> E (n x m), fp32

    def full_rank(self, shape) -> bool:
        """True when the matrix itself is sent (r >= min(n, m))."""
        n, m = matrix_dims(shape)
        return self.rank >= min(n, m)

    def payload_spec(self, shape, dtype):
        n, m = matrix_dims(shape)
        pd = self.payload_dtype or dtype
        if self.full_rank(shape):
            return [((n, m), pd)]
        return [((n, self.rank), pd), ((m, self.rank), pd)]

    def error(self, shape) -> torch.Tensor | None:
        """The LEP error buffer for messages of `shape` (n x m, fp32), or None."""
        return self.errors.get(shape_key(shape))

    def _initial_q(self, m: int, device) -> torch.Tensor:
        # Drawn on the CPU (the same Q on every device), then moved: once per shape.
        g = torch.Generator().manual_seed(self.seed)
        return torch.randn(m, self.rank, generator=g).to(device)

    def _with_error(self, x, key, n, m) -> tuple[torch.Tensor, bool]:
        """(M, own): x as an (n, m) fp32 matrix plus the LEP error where there is one, summed in
        the error's own buffer (x.float() + E, the same sum), so the new error can be written
        back into it; own is False where M is x itself (an fp32 x and no error): not written."""
        E = self.errors.get(key) if self.error_feedback else None
        if E is not None:
            return E.to(x.device).add_(x.reshape(n, m)), True   # .to: if loaded elsewhere
        return x.reshape(n, m).float(), x.dtype != torch.float32

    def encode(self, x, ctx=None):
        n, m = matrix_dims(x.shape)
        key, pd = shape_key(x.shape), self.payload_dtype or x.dtype
        M, own = self._with_error(x, key, n, m)
        if self.full_rank(x.shape):
            payload = [M.to(pd).contiguous()]
            sent = (payload[0].float(), None)
        else:
            q_old = self.qs[key].to(M.device) if key in self.qs else self._initial_q(m, M.device)
            Q = q_old
            for _ in range(self.power_iters):
                # Q re-orthogonalised before every P = M Q: the Q kept from the last message
                # has columns scaled by the singular values, so M Q would be ill-conditioned
                # and Gram-Schmidt would lose the weak directions
                Q = orthogonalize_(Q.clone(), self.eps)
                P = orthogonalize_(M @ Q, self.eps)
                Q = M.t() @ P
            # a column that came out zero keeps its old value (a select: no host sync)
            if self._fused_finish(P, Q, q_old, pd):
                from megatron.cc.kernels import lowrank as fused_lowrank
                p_pd, q_pd, *sent = fused_lowrank.finish(P, Q, q_old, pd)
                payload = [p_pd, q_pd]
            else:
                dead = torch.linalg.vector_norm(Q, dim=0) == 0
                Q = torch.where(dead, q_old, Q)
                payload = [P.to(pd), Q.to(pd)]
                sent = (payload[0].float(), payload[1].float())
            self.qs[key] = Q
        if self.error_feedback:
            P_s, Q_s = sent
            # E = M - M_hat, with M_hat rebuilt from what was sent (as the receiver does); in
            # M's buffer where M is ours (the full-rank payload may be M itself: not there)
            if Q_s is None:
                self.errors[key] = M - P_s
            else:
                self.errors[key] = (M.addmm_(P_s, Q_s.t(), alpha=-1) if own
                                    else torch.addmm(M, P_s, Q_s.t(), alpha=-1))
        return payload

    @staticmethod
    def _fused_finish(P, Q, q_old, pd) -> bool:
        """kernels/lowrank.finish serves these: CUDA fp32 contiguous factors, a 16-bit
        payload (an fp32 payload is P and Q themselves: nothing to cast)."""
        from megatron.cc.kernels import dispatch
        return (pd in (torch.float16, torch.bfloat16) and dispatch.enabled(P, Q, q_old)
                and all(t.dtype == torch.float32 and t.is_contiguous() for t in (P, Q, q_old)))

    def pass_through(self, x, ctx=None):
        key = shape_key(x.shape)
        if not (self.error_feedback and self.flush_on_uncompressed and key in self.errors):
            return x
        M = x.reshape(self.errors[key].shape).float() + self.errors[key].to(x.device)
        sent = M.to(x.dtype)
        self.errors[key] = M - sent.float()     # zero unless the cast rounds
        return sent.reshape(x.shape)

    def decode(self, payload, shape, dtype, ctx=None):
        if len(payload) == 1:
            return payload[0].reshape(shape).to(dtype)
        P, Q = payload
        from megatron.cc.kernels import dispatch
        if dispatch.enabled(P, Q) and dtype in dispatch.OUT_KIND:
            from megatron.cc.kernels import lowrank as fused_lowrank   # one pass, no fp32 copy
            return fused_lowrank.low_rank_product(P, Q, tuple(shape), dtype)
        return (P.float() @ Q.float().t()).reshape(shape).to(dtype)

    def state_dict(self):
        return {"qs": {k: v.clone() for k, v in self.qs.items()},
                "errors": {k: v.clone() for k, v in self.errors.items()}}

    def load_state_dict(self, sd):
        self.qs = {k: v.clone().float() for k, v in sd.get("qs", {}).items()}
        self.errors = {k: v.clone().float() for k, v in sd.get("errors", {}).items()}
