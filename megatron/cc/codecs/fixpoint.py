"""The "fixpoint" codec: symmetric b-bit fixpoint codes, bit-packed, with one 16-bit scale
per group (quant.py has the format, fused.py runs it on kernels for CUDA messages).

Codec "fixpoint" payload = [packed codes uint8 (ceil(numel*b/8),), scales (num_scales,)]:

    payload bytes = ceil(numel * b / 8) + 2 * num_scales
"""
from __future__ import annotations

import math

import torch

from . import fused
from .base import Codec, parse_dtype, register
from megatron.cc.numerics.quant import (GRANULARITIES, check_bits, check_scheme, dequantize,
                                        num_scales, pack_bits, packed_nbytes, quantize)
from megatron.cc.numerics.rng import DeviceGenerator


@register("fixpoint")
class FixpointCodec(Codec):
    """Symmetric b-bit fixpoint with bit packing; see the module docstring for the format.

    Args:
        bits: 1..8 bits per value.
        granularity: "channel" (AC-SGD), "bucket" (CocktailSGD), "tile" (TAH backward)
            or "tensor".
        group_size: bucket size k or tile size t (a power of two for tiles).
        scale_dtype: "float16" (default) or "bfloat16" for the stored scales.
        stochastic: unbiased stochastic rounding instead of round-to-nearest.
        seed: seed of the stochastic-rounding generator (its state is in state_dict).
        scheme: "fitted" (default), "absmax" or "seed" (module docstring).
    """

    name = "fixpoint"

    def __init__(self, bits: int = 8, granularity: str = "channel", group_size: int = 128,
                 scale_dtype="float16", stochastic: bool = False, seed: int = 0,
                 scheme: str = "fitted"):
        check_bits(bits)
        check_scheme(scheme)
        self.scheme = scheme
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        if group_size < 1 or (granularity == "tile" and group_size & (group_size - 1)):
            raise ValueError(f"group_size must be >= 1 (a power of two for tiles), got {group_size}")
        self.bits, self.granularity, self.group_size = bits, granularity, group_size
        self.scale_dtype = parse_dtype(scale_dtype)
        if self.scale_dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"scale_dtype must be float16 or bfloat16, got {scale_dtype!r}")
        self.rng = DeviceGenerator(seed) if stochastic else None

    def payload_spec(self, shape, dtype):
        numel = math.prod(shape)
        return [((packed_nbytes(numel, self.bits),), torch.uint8),
                ((num_scales(shape, self.granularity, self.group_size),), self.scale_dtype)]

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Unpacked (codes, scales) of x."""
        gen = None if self.rng is None else self.rng.get(x.device)
        return quantize(x, self.bits, self.granularity, self.group_size, self.scale_dtype, gen,
                        self.scheme)

    def dequantize(self, codes, scales, shape, dtype=torch.float32) -> torch.Tensor:
        return dequantize(codes, scales, self.bits, shape, self.granularity, self.group_size,
                          dtype, self.scheme)

    def encode(self, x, ctx=None):
        if self.rng is None:  # deterministic rounding: fused kernels on CUDA (fused.py)
            return list(fused.encode(x, self.bits, self.granularity, self.group_size,
                                     self.scale_dtype, self.scheme))
        codes, scales = self.quantize(x)
        return [pack_bits(codes, self.bits), scales]

    def decode(self, payload, shape, dtype, ctx=None):
        return fused.decode(payload[0], payload[1], self.bits, tuple(shape), self.granularity,
                            self.group_size, dtype, self.scheme)

    def state_dict(self):
        return {} if self.rng is None else self.rng.state_dict()

    def load_state_dict(self, sd):
        if self.rng is not None:
            self.rng.load_state_dict(sd)
