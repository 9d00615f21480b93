"""Subspace coefficients on the pipeline wire (Subspace Networks, arXiv 2506.01260).

With the subspace-constrained model (megatron/training/model/subspace.py) a stage boundary
carries k coefficients per token instead of H values, both ways: c = U^T (x - x0) forward and
U^T g backward. The model makes those (S, B, k) tensors; this codec sends them as they are
(bits 0: exact for the constrained model) or as b-bit fixpoint with one scale per coefficient
channel. `raw_nbytes` is the (S, B, H) activation they stand for, so the log line's ratio is
against the uncompressed model.
"""
from __future__ import annotations

import math

import torch

from .base import Codec, register
from .fixpoint import FixpointCodec


@register("subspace")
class SubspaceCodec(Codec):
    """Coefficients (..., k) of an H-wide residual stream, sent raw or b-bit fixpoint.

    Args:
        hidden_size: H, the width of the message the coefficients stand for (byte ratio).
        rank: k, the last dimension of every message.
        bits: 0 (send as they are) or 1..8 (fixpoint, per-coefficient scales).
        scheme: the fixpoint grid (see fixpoint.py), "fitted" by default.
    """

    name = "subspace"

    def __init__(self, hidden_size: int, rank: int, bits: int = 0, scheme: str = "fitted"):
        if not 1 <= rank <= hidden_size:
            raise ValueError(f"rank must be in 1..hidden_size ({hidden_size}), got {rank}")
        if not 0 <= bits <= 8:
            raise ValueError(f"bits must be 0 (unquantised) or 1..8, got {bits}")
        self.hidden_size, self.rank, self.bits = hidden_size, rank, bits
        self.quant = FixpointCodec(bits, granularity="channel", scheme=scheme) if bits else None

    def _check(self, shape) -> None:
        if shape[-1] != self.rank:
            raise ValueError(f"subspace message's last dim is {shape[-1]}, expected the rank "
                             f"{self.rank}")

    def payload_spec(self, shape, dtype):
        self._check(shape)
        if self.quant is None:
            return [(tuple(shape), dtype)]
        return self.quant.payload_spec(shape, dtype)

    def encode(self, x, ctx=None):
        self._check(x.shape)
        return [x] if self.quant is None else self.quant.encode(x, ctx)

    def decode(self, payload, shape, dtype, ctx=None):
        if self.quant is None:
            return payload[0]
        return self.quant.decode(payload, shape, dtype, ctx)

    def raw_nbytes(self, x: torch.Tensor) -> int:
        """Bytes of the uncompressed (..., H) message these (..., k) coefficients replace."""
        return math.prod(x.shape[:-1]) * self.hidden_size * x.element_size()

    def describe(self) -> str:
        how = "as they are" if self.quant is None else f"{self.bits}-bit fixpoint"
        return f"subspace coefficients, rank {self.rank} of {self.hidden_size}, {how}"
