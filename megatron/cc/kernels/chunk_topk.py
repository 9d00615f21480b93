"""SparseLoCo's chunked top-k codec (codecs/chunk_topk.py) around torch's topk and sort.

Compress: `_magnitude_kernel` writes |x| in fp32 into the chunk-padded buffer (-1 at pads) in
one pass over x; torch's topk and sort pick each chunk's kept positions; `_gather_pack_kernel`
reads their values from x and writes the packed position stream (ceil(log2 C) bits each).
Decompress: `_scatter_kernel` decodes each kept value (code and chunk scale) and its position
and writes it into the dense output in the message's dtype (zero-filled first unless every
entry is kept). Payloads and decodes bit-identical to the eager codec.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import LAUNCH, OUT_KIND, cdiv, read_width
from .fixpoint import grids_of, signed_grid, step_grid
from .primitives import read_bits, scale_value, store_as

BLOCK = 1024


@triton.jit
def _magnitude_kernel(x_ptr, mag_ptr, NUMEL, TOTAL, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    real = i < NUMEL
    v = tl.load(x_ptr + i, mask=real, other=0).to(tl.float32)
    tl.store(mag_ptr + i, tl.where(real, tl.abs(v), -1.0), mask=i < TOTAL)


@triton.jit
def _gather_pack_kernel(x_ptr, keep_ptr, vals_ptr, idx_ptr, NUMEL, NKEEP, K, C, IDX_BYTES,
                        IBITS: tl.constexpr, BLOCK: tl.constexpr):
    """vals[j] = x[(j // K) C + keep[j]] in fp32 (0 for a pad); byte b of the position stream
    from bits 8b .. 8b + 7, bit t of value j at stream bit j IBITS + t."""
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = j < NKEEP
    at = (j // K) * C + tl.load(keep_ptr + j, mask=ok, other=0)
    v = tl.load(x_ptr + at, mask=ok & (at < NUMEL), other=0).to(tl.float32)
    tl.store(vals_ptr + j, v, mask=ok)
    # the same programs write the position bytes (there are at least as many when IBITS >= 8)
    t = tl.arange(0, 8)
    s = j[:, None] * 8 + t[None, :]                 # stream bits of byte j
    src = s // IBITS
    inb = (j[:, None] < IDX_BYTES) & (src < NKEEP)
    pos = tl.load(keep_ptr + src, mask=inb, other=0)
    bit = ((pos >> (s % IBITS)) & 1).to(tl.int32)
    tl.store(idx_ptr + j, tl.sum(bit << t[None, :], axis=1).to(tl.uint8), mask=j < IDX_BYTES)


@triton.jit
def _scatter_kernel(idx_ptr, codes_ptr, s_ptr, out_ptr, NUMEL, NKEEP, K, C, IDX_BYTES,
                    CODE_BYTES, C0, LPS, C0T, LPST, DENSE: tl.constexpr, IBITS: tl.constexpr,
                    IB: tl.constexpr, BITS: tl.constexpr, BP: tl.constexpr,
                    BF16: tl.constexpr, SIGNED: tl.constexpr, OUT: tl.constexpr,
                    BLOCK: tl.constexpr):
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = j < NKEEP
    code = read_bits(codes_ptr, j * BITS, ok, CODE_BYTES, BITS, BP)
    s = scale_value(tl.load(s_ptr + j // K, mask=ok, other=0), BF16)
    c0, step = step_grid(s, C0, LPS, C0T, LPST, SIGNED)
    val = (code.to(tl.float32) - c0) * step
    if DENSE:
        at = j
        ok = ok & (at < NUMEL)
    else:
        pos = read_bits(idx_ptr, j * IBITS, ok, IDX_BYTES, IBITS, IB).to(tl.int64)
        at = (j // K) * C + pos
        ok = ok & (pos < C) & (at < NUMEL)
    store_as(out_ptr + at, val, ok, OUT)


def compress(codec, flat: torch.Tensor):
    """(position stream, kept values in fp32 (m * k,)) of ChunkTopKCodec.compress for a flat
    message of any float dtype (k < C)."""
    flat = flat.contiguous()
    n, m, k, c = flat.numel(), codec.chunks(flat.numel()), codec.k, codec.C
    mag = torch.empty(m * c, dtype=torch.float32, device=flat.device)
    _magnitude_kernel[(cdiv(m * c, BLOCK),)](flat, mag, n, m * c, BLOCK=BLOCK, **LAUNCH)
    keep = mag.view(m, c).topk(k, dim=1, sorted=False).indices.sort(dim=1).values
    nkeep, nbytes = m * k, cdiv(m * k * codec.ibits, 8)
    vals = torch.empty(nkeep, dtype=torch.float32, device=flat.device)
    idx = torch.empty(nbytes, dtype=torch.uint8, device=flat.device)
    _gather_pack_kernel[(cdiv(max(nkeep, nbytes), BLOCK),)](
        flat, keep, vals, idx, n, nkeep, k, c, nbytes, IBITS=codec.ibits, BLOCK=BLOCK,
        **LAUNCH)
    return idx, vals


def decompress(codec, payload, numel: int, dtype) -> torch.Tensor:
    """ChunkTopKCodec.decompress (round-to-nearest payload layout; dtype fp32 / fp16 / bf16)."""
    idx, codes, scales = payload
    m, k, c = codec.chunks(numel), codec.k, codec.C
    dense = codec.dense()
    kind = OUT_KIND[dtype]
    out = (torch.empty if dense else torch.zeros)(numel, dtype=dtype, device=codes.device)
    nkeep = m * k
    if nkeep == 0 or numel == 0:
        return out
    (c0, lps), (c0t, lpst) = grids_of(codec.bits, codec.scheme)
    ibits = max(codec.ibits, 1)
    _scatter_kernel[(cdiv(nkeep, BLOCK),)](
        idx if idx.numel() else codes, codes, scales.view(torch.int16),
        out if kind < 2 else out.view(torch.int16), numel, nkeep, k, c, idx.numel(),
        codes.numel(), c0, lps, c0t, lpst, DENSE=dense, IBITS=ibits, IB=read_width(ibits),
        BITS=codec.bits, BP=read_width(codec.bits), BF16=scales.dtype == torch.bfloat16,
        SIGNED=signed_grid(codec.bits, codec.scheme), OUT=kind, BLOCK=BLOCK, **LAUNCH)
    return out
