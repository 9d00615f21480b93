"""Fixpoint encode / decode: Triton kernels for CUDA messages, the eager functions elsewhere.

The eager functions in quant.py are the reference and run on the CPU (and wherever triton is
missing). On a CUDA tensor megatron/cc/kernels/fixpoint.py does the same work in three launches
(scales, quantise + pack, unpack + dequantise) instead of dozens of small ones: payload bytes
and decodes are bit-identical to the eager path; "fitted" and 1-bit scales sum in the order of
megatron/cc/kernels/group_sums.py (torch's own order differs by device, so they can differ
from the eager scales in the last bit of a near-tied candidate comparison).

MEGATRON_CC_FUSED=0 turns the kernels off (debugging, or to time the eager path).
"""
from __future__ import annotations

import math

import torch

from megatron.cc.kernels import dispatch

from .quant import dequantize, group_scales, pack_bits, quantize_with_scales, unpack_bits


def encode_eager(x, bits, granularity, group_size, scale_dtype, scheme="fitted"):
    scales = group_scales(x, bits, granularity, group_size, scale_dtype, scheme)
    codes = quantize_with_scales(x, scales, bits, granularity, group_size, scheme=scheme)
    return pack_bits(codes, bits), scales


def decode_eager(packed, scales, bits, shape, granularity, group_size, dtype, scheme="fitted"):
    codes = unpack_bits(packed, bits, math.prod(shape))
    return dequantize(codes, scales, bits, shape, granularity, group_size, dtype, scheme)


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
