"""AC-SGD delta step (codecs/delta.py) with the cache update fused into the quantisation.

For a message x (S, B, H) and the cached c of its samples (fp32, any strides):
    encode_update   sender:   d = x - c; scales of d; ONE pass writes the packed codes of d
                    and c <- c + deQ(codes) in place
    decode_update   receiver: ONE pass unpacks, dequantises, adds c, writes c <- x_hat (fp32)
                    in place and x_hat in the message's dtype
Both ends compute c + deQ with the same fp32 operations (no FMA: dispatch.LAUNCH), so their
caches stay bit-identical. On CPU tensors these run the eager steps; stochastic rounding (q.rng)
stays eager.

encode_in_cache / decode_in_cache do the same steps on a device-resident fp32 cache in place:
c is the cache's rows (rows, S, H) and sample b's row is slots[b], so no row is gathered into
a (S, B, H) copy and written back (kernels/delta.py). The payloads and caches are the ones
encode_update / decode_update give on the gathered rows.
"""
from __future__ import annotations

import math

import torch

from megatron.cc.codecs.fixpoint import FixpointCodec
from megatron.cc.kernels import dispatch
from megatron.cc.numerics.quant import pack_bits, unpack_bits


def _fused(q: FixpointCodec, *tensors) -> bool:
    return q.rng is None and dispatch.enabled(*tensors)


def encode_update(x: torch.Tensor, prev: torch.Tensor, q: FixpointCodec):
    """([packed codes, scales], new cache) for the delta x - prev; prev is updated in place
    and returned as the new cache (fp32, prev's strides)."""
    if not _fused(q, x, prev):   # delta.py's own eager lines
        codes, scales = q.quantize(x.float() - prev)
        new = prev.add_(q.dequantize(codes, scales, x.shape))
        return [pack_bits(codes, q.bits), scales], new
    from megatron.cc.kernels import fixpoint
    # x's dtype widens to fp32 inside the subtraction (exact, as x.float() is): no fp32 copy
    d = torch.sub(x, prev, out=torch.empty(x.shape, device=x.device))
    scales = fixpoint.group_scales(d, q.bits, q.granularity, q.group_size, q.scale_dtype,
                                   q.scheme)
    packed = fixpoint.quantize_pack(d, scales, q.bits, q.granularity, q.group_size, q.scheme,
                                    prev=prev, new=prev)
    return [packed, scales], prev


def decode_update(payload, prev: torch.Tensor, q: FixpointCodec, shape, dtype):
    """prev += deQ(payload) in place (fp32 (S, B, H): the receiver's new cache); returns the
    message x_hat, that sum in `dtype`."""
    shape = tuple(shape)
    if not dispatch.enabled(payload[0], prev):   # dequantising needs no random draw
        codes = unpack_bits(payload[0], q.bits, math.prod(shape))
        return prev.add_(q.dequantize(codes, payload[1], shape)).to(dtype)
    from megatron.cc.kernels import fixpoint
    return fixpoint.unpack_dequantize(payload[0], payload[1], q.bits, shape, q.granularity,
                                      q.group_size, dtype, q.scheme, prev=prev, new=prev)


def in_cache(q: FixpointCodec, *tensors) -> bool:
    """encode_in_cache / decode_in_cache can serve these tensors (kernels, deterministic)."""
    return _fused(q, *tensors)


def encode_in_cache(x: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
                    q: FixpointCodec) -> list:
    """encode_update against the cache rows[slots[b]] of sample b, updated in place; slots
    (B,) int64 on the device, all distinct (a repeated sample would race with itself)."""
    from megatron.cc.kernels import delta, fixpoint
    d = delta.sub_cached(x, rows, slots)
    scales = fixpoint.group_scales(d, q.bits, q.granularity, q.group_size, q.scale_dtype,
                                   q.scheme)
    packed = fixpoint.quantize_pack(d, scales, q.bits, q.granularity, q.group_size, q.scheme,
                                    prev=rows, new=rows, slots=slots)
    return [packed, scales]


def decode_in_cache(payload, rows: torch.Tensor, slots: torch.Tensor, q: FixpointCodec, shape,
                    dtype) -> torch.Tensor:
    """decode_update against rows[slots[b]], updated in place (as encode_in_cache)."""
    from megatron.cc.kernels import fixpoint
    return fixpoint.unpack_dequantize(payload[0], payload[1], q.bits, tuple(shape),
                                      q.granularity, q.group_size, dtype, q.scheme, prev=rows,
                                      new=rows, slots=slots)
