"""Fixpoint encode / decode: Triton kernels for CUDA messages, the eager functions elsewhere.

quant.py's eager functions are the reference and the CPU path; on a CUDA tensor
megatron/cc/kernels/fixpoint.py does the same work in three launches, with bit-identical
payloads and decodes ("fitted" and 1-bit scales sum in kernels/group_sums.py's order).
`pack_bits` / `unpack_bits` are dispatched the same way for the other codecs' bit streams.
MEGATRON_CC_FUSED=0 turns the kernels off.
"""
from __future__ import annotations

import math

import torch

from megatron.cc.kernels import dispatch

from megatron.cc.numerics import quant


def encode_eager(x, bits, granularity, group_size, scale_dtype, scheme="fitted"):
    scales = quant.group_scales(x, bits, granularity, group_size, scale_dtype, scheme)
    codes = quant.quantize_with_scales(x, scales, bits, granularity, group_size, scheme=scheme)
    return quant.pack_bits(codes, bits), scales


def decode_eager(packed, scales, bits, shape, granularity, group_size, dtype, scheme="fitted"):
    codes = quant.unpack_bits(packed, bits, math.prod(shape))
    return quant.dequantize(codes, scales, bits, shape, granularity, group_size, dtype, scheme)


def enabled(t: torch.Tensor) -> bool:
    """Kernels for CUDA tensors when triton is there, unless MEGATRON_CC_FUSED=0."""
    return dispatch.enabled(t)


def encode(x, bits, granularity, group_size, scale_dtype, scheme="fitted"):
    """(packed codes, scales) of x: quant.py's payload layout."""
    if not enabled(x):
        return encode_eager(x, bits, granularity, group_size, scale_dtype, scheme)
    from megatron.cc.kernels import fixpoint
    return fixpoint.encode(x, bits, granularity, group_size, scale_dtype, scheme)


def decode(packed, scales, bits, shape, granularity, group_size, dtype, scheme="fitted"):
    if not enabled(packed):
        return decode_eager(packed, scales, bits, tuple(shape), granularity, group_size, dtype,
                            scheme)
    from megatron.cc.kernels import fixpoint
    return fixpoint.decode(packed, scales, bits, tuple(shape), granularity, group_size, dtype,
                           scheme)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """quant.pack_bits, in one launch on CUDA (the eager one is ~2 * bits small ops)."""
    if not enabled(codes):
        return quant.pack_bits(codes, bits)
    from megatron.cc.kernels import fixpoint
    return fixpoint.pack(codes, bits)


def unpack_bits(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """quant.unpack_bits, in one launch on CUDA."""
    if not enabled(packed):
        return quant.unpack_bits(packed, bits, numel)
    from megatron.cc.kernels import fixpoint
    return fixpoint.unpack(packed, bits, numel)
