"""CocktailSGD (codecs/sparse.py) on kernels: compress's sampling and mask, and decompress in
three launches with the dense tensor written once.

Compress: one pass samples the rolling subset (`_sample_kernel`: each value in fp32 and its
magnitude, pads past the end 0 and -1), torch's topk and sort choose the kept positions, and
`_keep_kernel` gathers their values and sets their mask bits (an atomic OR into 32-bit words,
whose little-endian bytes are quant.pack_bits' 1-bit layout). The same payload bit for bit as the
eager compress.

Decompress: the j-th set bit of the mask holds kept value j, so a kept entry's value index is
the count of set bits before it. Per block of BLOCK subset positions: its set bits
(`_mask_counts_kernel`), their exclusive running sum (`_block_bases_kernel`, one program), then
every block at once (`_scatter_kernel`): its bits' running count from the block's base, the
b-bit code and scale of that value, and the block's whole stretch of the dense output (value or
zero), so the output needs no zero fill of its own. Bit-identical to the eager decompress, a
malformed mask's clamped value index included.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import LAUNCH, OUT_KIND, cdiv, next_pow2, read_width
from .fixpoint import grids_of, signed_grid, step_grid
from .primitives import read_bits, scale_value, store_as

BLOCK = 512          # subset positions per program (a multiple of 8: whole mask bytes)
SAMPLE_BLOCK = 1024  # subset positions (or kept values) per program of the compress kernels
SCAN_CHUNK = 1024    # block counts per step of the one-program running sum


@triton.jit
def _sample_kernel(x_ptr, vals_ptr, mag_ptr, NUMEL, N_RAND, OFFSET, STRIDE, MAG: tl.constexpr,
                   BLOCK: tl.constexpr):
    """vals[i] = x[OFFSET + STRIDE i] in fp32 (0 past the end); with MAG, mag[i] = |vals[i]|
    (-1 past the end: a pad loses against every real entry)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = i < N_RAND
    idx = OFFSET + STRIDE * i
    valid = idx < NUMEL
    v = tl.load(x_ptr + idx, mask=inb & valid, other=0).to(tl.float32)
    tl.store(vals_ptr + i, v, mask=inb)
    if MAG:
        tl.store(mag_ptr + i, tl.where(valid, tl.abs(v), -1.0), mask=inb)


@triton.jit
def _keep_kernel(vals_ptr, keep_ptr, kept_ptr, words_ptr, K, BLOCK: tl.constexpr):
    """kept[j] = vals[keep[j]]; bit keep[j] of the mask words set."""
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = j < K
    p = tl.load(keep_ptr + j, mask=ok, other=0)
    tl.store(kept_ptr + j, tl.load(vals_ptr + p, mask=ok, other=0), mask=ok)
    bit = tl.full((BLOCK,), 1, tl.int32) << (p % 32).to(tl.int32)
    tl.atomic_or(words_ptr + p // 32, bit, mask=ok)


def sample(codec, flat: torch.Tensor, step: int, need_mag: bool):
    """(vals, mag) of CocktailCodec.compress: the rolling subset of flat in fp32, and its
    magnitudes with -1 at pads (None unless need_mag)."""
    flat = flat.contiguous()
    n_rand, _ = codec.sizes(flat.numel())
    buf = torch.empty((2 if need_mag else 1, n_rand), dtype=torch.float32, device=flat.device)
    if n_rand:
        _sample_kernel[(cdiv(n_rand, SAMPLE_BLOCK),)](
            flat, buf[0], buf[-1], flat.numel(), n_rand, (codec.seed + step) % codec.stride,
            codec.stride, MAG=need_mag, BLOCK=SAMPLE_BLOCK, **LAUNCH)
    return buf[0], (buf[1] if need_mag else None)


def keep(vals: torch.Tensor, positions: torch.Tensor):
    """(packed 1-bit mask of len(vals) bits with `positions` set, vals[positions])."""
    n, k = vals.numel(), positions.numel()
    words = torch.zeros(cdiv(n, 32), dtype=torch.int32, device=vals.device)
    kept = torch.empty(k, dtype=torch.float32, device=vals.device)
    if k:
        _keep_kernel[(cdiv(k, SAMPLE_BLOCK),)](vals, positions, kept, words, k,
                                               BLOCK=SAMPLE_BLOCK, **LAUNCH)
    return words.view(torch.uint8)[:cdiv(n, 8)], kept


@triton.jit
def _mask_counts_kernel(mask_ptr, counts_ptr, NBYTES, BB: tl.constexpr):
    """Set bits of each block of BB mask bytes."""
    b = tl.program_id(0).to(tl.int64) * BB + tl.arange(0, BB)
    byte = tl.load(mask_ptr + b, mask=b < NBYTES, other=0).to(tl.int32)
    j = tl.arange(0, 8)
    bits = (byte[:, None] >> j[None, :]) & 1
    tl.store(counts_ptr + tl.program_id(0), tl.sum(tl.sum(bits, axis=1), axis=0))


@triton.jit
def _block_bases_kernel(counts_ptr, base_ptr, NBLK, CH: tl.constexpr):
    """base[p] = counts[0] + ... + counts[p - 1], in one program (integers: any order)."""
    carry = tl.zeros((), tl.int32)
    for c in range(tl.cdiv(NBLK, CH)):
        p = c * CH + tl.arange(0, CH)
        n = tl.load(counts_ptr + p, mask=p < NBLK, other=0)
        run = tl.cumsum(n, axis=0)
        tl.store(base_ptr + p, carry + run - n, mask=p < NBLK)
        carry += tl.sum(n, axis=0)


@triton.jit
def _scatter_kernel(mask_ptr, base_ptr, codes_ptr, s_ptr, out_ptr, NUMEL, N_RAND, K, OFFSET,
                    STRIDE, CODE_BYTES, BUCKET, C0, LPS, C0T, LPST,
                    MASK: tl.constexpr, BITS: tl.constexpr, BP: tl.constexpr,
                    BF16: tl.constexpr, SIGNED: tl.constexpr, OUT: tl.constexpr,
                    BLOCK: tl.constexpr, SP: tl.constexpr):
    pid = tl.program_id(0)
    i = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)      # subset positions
    inb = i < N_RAND
    if MASK:
        bit = (tl.load(mask_ptr + i // 8, mask=inb, other=0).to(tl.int32) >> (i % 8)) & 1
        rank = tl.load(base_ptr + pid) + tl.cumsum(bit, axis=0) - 1
        rank = tl.minimum(tl.maximum(rank, 0), K - 1).to(tl.int64)  # as the eager clamp
        keep = (bit == 1) & inb & (rank >= 0)    # k = 0: rank -1, nothing kept
    else:                # every sampled entry kept, in order
        rank = i
        keep = inb
    code = read_bits(codes_ptr, rank * BITS, keep, CODE_BYTES, BITS, BP)
    s = scale_value(tl.load(s_ptr + rank // BUCKET, mask=keep, other=0), BF16)
    c0, step = step_grid(s, C0, LPS, C0T, LPST, SIGNED)
    val = tl.where(keep, (code.to(tl.float32) - c0) * step, 0.0)
    # the block's stretch of the dense tensor: STRIDE positions per subset position, the
    # sampled one (OFFSET) carrying the value
    r = tl.arange(0, SP)
    pos = i[:, None] * STRIDE + r[None, :]
    v = tl.where(r[None, :] == OFFSET, val[:, None], 0.0)
    store_as(out_ptr + pos, v, (r[None, :] < STRIDE) & (pos < NUMEL), OUT)


def decompress(codec, payload, numel: int, step: int, dtype) -> torch.Tensor:
    """CocktailCodec.decompress(payload, numel, step, dtype) (deterministic rounding's payload
    layout; dtype fp32 / fp16 / bf16) on the kernels."""
    n_rand, k = codec.sizes(numel)
    codes, scales = payload[1], payload[2]
    device = codes.device
    out = torch.empty(numel, dtype=dtype, device=device)
    if numel == 0:
        return out
    masked = k < n_rand
    nblk = cdiv(n_rand, BLOCK)
    base = codes   # any pointer where there is no mask
    if masked:
        counts = torch.empty(2 * nblk, dtype=torch.int32, device=device)
        base = counts[nblk:]
        _mask_counts_kernel[(nblk,)](payload[0], counts, payload[0].numel(), BB=BLOCK // 8,
                                     **LAUNCH)
        _block_bases_kernel[(1,)](counts, base, nblk, CH=SCAN_CHUNK, **LAUNCH)
    (c0, lps), (c0t, lpst) = grids_of(codec.bits, codec.scheme)
    kind = OUT_KIND[dtype]
    _scatter_kernel[(nblk,)](
        payload[0] if masked else codes, base, codes, scales.view(torch.int16),
        out if kind < 2 else out.view(torch.int16), numel, n_rand, k,
        (codec.seed + step) % codec.stride, codec.stride, codes.numel(), codec.bucket_size,
        c0, lps, c0t, lpst, MASK=masked, BITS=codec.bits, BP=read_width(codec.bits),
        BF16=scales.dtype == torch.bfloat16, SIGNED=signed_grid(codec.bits, codec.scheme),
        OUT=kind, BLOCK=BLOCK, SP=next_pow2(codec.stride), **LAUNCH)
    return out
