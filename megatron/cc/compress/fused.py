"""Fused quantise + pack and unpack + dequantise for CUDA messages (torch.compile -> Triton).

The eager functions in quant.py are the reference and run on the CPU (and wherever Triton is
missing). On a CUDA tensor the same functions are compiled once per (shape, bits, grouping): Inductor
turns the max-reduction into one pass and scaling, rounding and bit packing into another that
writes the payload once, instead of a dozen eager passes.

MEGATRON_CC_FUSED=0 turns the compiled path off (debugging, or to time the eager one).
"""
from __future__ import annotations

import functools
import importlib.util
import math
import os

import torch

from .quant import (dequantize, group_absmax, group_scales, pack_bits, quantize_with_scales,
                    store_scale, unpack_bits)


def encode_eager(x, bits, granularity, group_size, scale_dtype, scheme="fitted"):
    scales = group_scales(x, bits, granularity, group_size, scale_dtype, scheme)
    return _codes_packed(x, scales, bits, granularity, group_size, scheme), scales


def _codes_packed(x, scales, bits, granularity, group_size, scheme="fitted"):
    return pack_bits(quantize_with_scales(x, scales, bits, granularity, group_size,
                                          scheme=scheme), bits)


def _encode(x, bits, granularity, group_size, scale_dtype, absmax_fn, codes_fn):
    """max-reduction, then the scales' fp16 round-up (eager and tiny: Inductor keeps fp16
    intermediates in fp32 and would drop the rounding that store_scale checks), then
    quantise + pack in one pass (the "absmax" scheme)."""
    scales = store_scale(absmax_fn(x, granularity, group_size), scale_dtype)
    return codes_fn(x, scales, bits, granularity, group_size, "absmax"), scales


def decode_eager(packed, scales, bits, shape, granularity, group_size, dtype, scheme="fitted"):
    codes = unpack_bits(packed, bits, math.prod(shape))
    return dequantize(codes, scales, bits, shape, granularity, group_size, dtype, scheme)


@functools.lru_cache(maxsize=None)
def _have_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def enabled(t: torch.Tensor) -> bool:
    """Compile for CUDA tensors when Triton is there, unless MEGATRON_CC_FUSED=0."""
    return t.is_cuda and _have_triton() and os.environ.get("MEGATRON_CC_FUSED", "1") != "0"


@functools.lru_cache(maxsize=None)
def _compiled(fn):
    # One specialisation per (shape, dtype, bits, grouping): a run has a handful (fwd and bwd
    # messages), tests and benchmarks more; raise dynamo's per-function limit (default 8) so
    # that none silently falls back to eager.
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 64))
    # emulate_precision_casts: Inductor otherwise keeps fp16 intermediates in fp32, which
    # skips store_scale's round-up check (the scale must be rounded to fp16 and compared).
    return torch.compile(fn, dynamic=False, options={"emulate_precision_casts": True})


def encode(x, bits, granularity, group_size, scale_dtype, scheme="fitted"):
    """(packed codes, scales) of x; the same payload layout and scales as the eager path."""
    if not enabled(x):
        return encode_eager(x, bits, granularity, group_size, scale_dtype, scheme)
    if scheme != "absmax":  # scale search eager, quantise + pack compiled
        scales = group_scales(x, bits, granularity, group_size, scale_dtype, scheme)
        return _compiled(_codes_packed)(x, scales, bits, granularity, group_size, scheme), scales
    return _encode(x, bits, granularity, group_size, scale_dtype, _compiled(group_absmax),
                   _compiled(_codes_packed))


def decode(packed, scales, bits, shape, granularity, group_size, dtype, scheme="fitted"):
    fn = _compiled(decode_eager) if enabled(packed) else decode_eager
    return fn(packed, scales, bits, tuple(shape), granularity, group_size, dtype, scheme)
