"""Fused quantise + pack and unpack + dequantise for CUDA messages (torch.compile -> Triton).

The eager functions in quant.py are the reference and run on the CPU (and wherever Triton is
missing). On a CUDA tensor the same functions are compiled once per (shape, bits, grouping):
Inductor fuses the max-reduction, scaling, rounding and bit packing into a few kernels that
read the message once and write the payload once, instead of a dozen eager passes.

MEGATRON_CC_FUSED=0 turns the compiled path off (debugging, or to time the eager one).
"""
from __future__ import annotations

import functools
import importlib.util
import math
import os

import torch

from .quant import dequantize, pack_bits, quantize, unpack_bits


def encode_eager(x, bits, granularity, group_size, scale_dtype):
    codes, scales = quantize(x, bits, granularity, group_size, scale_dtype)
    return pack_bits(codes, bits), scales


def decode_eager(packed, scales, bits, shape, granularity, group_size, dtype):
    codes = unpack_bits(packed, bits, math.prod(shape))
    return dequantize(codes, scales, bits, shape, granularity, group_size, dtype)


@functools.lru_cache(maxsize=None)
def _have_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def enabled(t: torch.Tensor) -> bool:
    """Compile for CUDA tensors when Triton is there, unless MEGATRON_CC_FUSED=0."""
    return t.is_cuda and _have_triton() and os.environ.get("MEGATRON_CC_FUSED", "1") != "0"


@functools.lru_cache(maxsize=None)
def _compiled(fn):
    return torch.compile(fn, dynamic=False)


def encode(x, bits, granularity, group_size, scale_dtype):
    """(packed codes, scales) of x; bit-compatible payload layout with the eager path."""
    fn = _compiled(encode_eager) if enabled(x) else encode_eager
    return fn(x, bits, granularity, group_size, scale_dtype)


def decode(packed, scales, bits, shape, granularity, group_size, dtype):
    fn = _compiled(decode_eager) if enabled(packed) else decode_eager
    return fn(packed, scales, bits, tuple(shape), granularity, group_size, dtype)
