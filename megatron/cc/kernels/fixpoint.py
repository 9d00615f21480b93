"""Fixpoint codec kernels (quant.py's format): scales, quantise + pack, unpack + dequantise.

    group_scales       one program per block of groups: max |x| ("absmax", "seed" b > 1), or
                       sum-based scales in group_sums' order: mean |x| / RMS (1 bit) and the
                       "fitted" search (per grid, mid-rise then mid-tread: every candidate of
                       its ladder of clipping ratios, then quant._FIT_REFITS least-squares
                       refits, looping over the group's values from L1/L2; a mid-tread winner
                       stored negated), with store_scale's round-up in the kernel
    quantize_pack      one pass: x / step + c0, round half even, clamp, 8 codes -> `bits` bytes
    unpack_dequantize  one pass: `bits` bytes -> 8 codes -> (code - c0) * step -> dtype

The eager path is ~10 launches for quantise + pack, ~10 for unpack + dequantise and, for
"fitted", a pass of ~8 launches per candidate (two ladders and refits); here 1 + 1 + 1.

Groups (quant.py): "channel" = columns of x viewed (rows, C); "bucket" = runs of g values of
the flat x; "tile" = runs of g values inside each row; "tensor" = the whole x. Inputs are read
as fp32 from fp32 / bf16 / fp16; scales are stored as 16-bit patterns (fp16 or bf16).
"tensor" scales that need a sum (fitted, 1 bit) stay eager: one group is one program.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from megatron.cc.compress import quant

from . import group_sums
from .dispatch import LAUNCH, cdiv, next_pow2
from .primitives import (bf16_bits, pack_groups, round_half_even, scale_value,
                         store_scale_bits, tree_sum)

GRAN = {"tensor": 0, "channel": 1, "bucket": 2, "tile": 3}
ABSMAX, MEAN_ABS, RMS, FIT = 0, 1, 2, 3
SEG_BLOCK = 2048      # values per program and chunk in the group kernel
DEN_MIN = tl.constexpr(1e-30)   # quant._fit_scales: num / den.clamp_min(1e-30)
CODE_BLOCK = 256      # 8-code groups per program in the elementwise kernels (2048 values)


# ------------------------------------------------------------------------ group kernel
@triton.jit
def _chunk(x_ptr, base, lim, gmask, c, G, ESTRIDE, L: tl.constexpr):
    """Chunk c of every group of the block: (values fp32 (GB, L), valid (GB, L)). Positions
    < lim hold data; the rest (a last bucket's / tile's padding, lanes past G) adds nothing."""
    e = c * L + tl.arange(0, L)
    ld = gmask[:, None] & (e[None, :] < lim[:, None])
    x = tl.load(x_ptr + base[:, None] + e[None, :].to(tl.int64) * ESTRIDE, mask=ld, other=0.0)
    return x.to(tl.float32), ld


@triton.jit
def _levels(x, step, C0, QMAX):
    """Signed level index k of x on the grid: round(x / step + c0) clamped, minus c0."""
    v = round_half_even(tl.math.div_rn(x, step[:, None]) + C0)
    return tl.minimum(tl.maximum(v, 0.0), QMAX) - C0


@triton.jit
def _step(s, LPS):
    step = tl.math.div_rn(s, LPS)
    return tl.where(step > 0, step, 1.0)


@triton.jit
def _err(x_ptr, base, lim, gmask, s, G, ESTRIDE, C0, LPS, QMAX,
         GB: tl.constexpr, L: tl.constexpr, LOGL: tl.constexpr):
    """sum over the group of (x - k * step)^2 for scales s (GB,), in group_sums' order."""
    step = _step(s, LPS)
    acc = tl.zeros((GB, L), tl.float32)
    for c in range(tl.cdiv(G, L)):
        x, cnt = _chunk(x_ptr, base, lim, gmask, c, G, ESTRIDE, L)
        d = x - _levels(x, step, C0, QMAX) * step[:, None]
        acc = acc + tl.where(cnt, d * d, 0.0)
    return tree_sum(acc, L, LOGL)


@triton.jit
def _group_scale_kernel(x_ptr, out_ptr, ratio_ptr, n_rise, n_tread, refits,
                        NG, G, ROWLEN, NT, ESTRIDE, C0, LPS, C0T, LPST, QMAX,
                        MODE: tl.constexpr, COL: tl.constexpr, RAW: tl.constexpr,
                        BF16: tl.constexpr, GB: tl.constexpr, L: tl.constexpr,
                        LOGL: tl.constexpr):
    gi = tl.program_id(0).to(tl.int64) * GB + tl.arange(0, GB)
    gmask = gi < NG
    if COL:   # group gi: column gi of a (G, ESTRIDE) view
        base = gi
        lim = tl.zeros((GB,), tl.int64) + G
    else:     # group gi: segment gi % NT (G values) of row gi // NT of a (rows, ROWLEN) view
        t = gi % NT
        base = (gi // NT) * ROWLEN + t * G
        lim = tl.minimum(ROWLEN - t * G, G)
    if MODE == 0:      # max |x|, exact in any order
        m = tl.zeros((GB,), tl.float32)
        for c in range(tl.cdiv(G, L)):
            x, cnt = _chunk(x_ptr, base, lim, gmask, c, G, ESTRIDE, L)
            m = tl.maximum(m, tl.max(tl.abs(x), axis=1))
        s = m
    elif MODE == 3:    # "fitted": quant._fit_scales, one candidate after the other
        m = tl.zeros((GB,), tl.float32)
        for c in range(tl.cdiv(G, L)):
            x, cnt = _chunk(x_ptr, base, lim, gmask, c, G, ESTRIDE, L)
            m = tl.maximum(m, tl.max(tl.abs(x), axis=1))
        s = tl.zeros((GB,), tl.int32)
        s_err = tl.zeros((GB,), tl.float32)
        for grid in range(2):   # mid-rise, then mid-tread (stored with the sign bit set)
            c0 = tl.where(grid == 0, C0, C0T)
            lps = tl.where(grid == 0, LPS, LPST)
            n_ratios = n_rise + (n_tread - n_rise) * grid   # this grid's ladder
            first = n_rise * grid                           # ... and where it starts
            best = tl.zeros((GB,), tl.int32)
            best_err = tl.zeros((GB,), tl.float32)
            # candidates: max|x| * ratio (each ladder starts with 1: max|x| itself), refits
            for ci in range(n_ratios + refits):
                if ci < n_ratios:
                    cand = store_scale_bits(m * tl.load(ratio_ptr + first + ci), BF16)
                else:    # least-squares step on the best candidate's codes
                    step = _step(scale_value(best, BF16), lps)
                    num = tl.zeros((GB, L), tl.float32)
                    den = tl.zeros((GB, L), tl.float32)
                    for c in range(tl.cdiv(G, L)):
                        x, cnt = _chunk(x_ptr, base, lim, gmask, c, G, ESTRIDE, L)
                        k = _levels(x, step, c0, QMAX)
                        num = num + tl.where(cnt, x * k, 0.0)
                        den = den + tl.where(cnt, k * k, 0.0)
                    num = tree_sum(num, L, LOGL)
                    den = tree_sum(den, L, LOGL)
                    fit = tl.where(den > 0, tl.math.div_rn(num, tl.maximum(den, DEN_MIN)), 0.0)
                    cand = store_scale_bits(tl.where(fit < 0, 0.0, fit) * lps, BF16)
                e = _err(x_ptr, base, lim, gmask, scale_value(cand, BF16), G, ESTRIDE, c0, lps,
                         QMAX, GB, L, LOGL)
                better = (e < best_err) | (ci == 0)   # the first candidate is taken as it is
                best = tl.where(better, cand, best)
                best_err = tl.where(better, e, best_err)
            # mid-tread only when strictly better: ties keep the symmetric grid
            take = (grid == 0) | (best_err < s_err)
            s = tl.where(take, tl.where(grid == 0, best, best ^ 0x8000), s)
            s_err = tl.where(take, best_err, s_err)
    else:              # 1 bit: mean |x| ("fitted") or RMS ("seed")
        acc = tl.zeros((GB, L), tl.float32)
        for c in range(tl.cdiv(G, L)):
            x, cnt = _chunk(x_ptr, base, lim, gmask, c, G, ESTRIDE, L)
            if MODE == 1:
                acc = acc + tl.where(cnt, tl.abs(x), 0.0)
            else:
                acc = acc + tl.where(cnt, x * x, 0.0)
        s = tl.math.div_rn(tree_sum(acc, L, LOGL), lim.to(tl.float32))   # valid count
        if MODE == 2:
            s = tl.sqrt_rn(s)
    if RAW:
        tl.store(out_ptr + gi, s, mask=gmask)
    elif MODE == 3:   # bit pattern already
        tl.store(out_ptr + gi, s.to(tl.int16), mask=gmask)
    else:
        tl.store(out_ptr + gi, store_scale_bits(s, BF16).to(tl.int16), mask=gmask)


def _ratios(device) -> tuple[torch.Tensor, int, int]:
    """(ratios, n_rise, n_tread): the clipping ladders of quant._fit_scales for the mid-rise
    grid (_FIT_RATIOS) then the mid-tread grid (_TREAD_RATIOS), each
    as [1, ladder[1:]] (the first candidate is max|x| itself, whatever ladder[0] says), fp32
    on `device`. Read at call time, so edits of the module constants apply; cached per
    (device, values): no host-to-device copy per message."""
    rise = tuple(quant._FIT_RATIOS)
    tread = tuple(quant._TREAD_RATIOS)
    key = (str(device), rise, tread)
    if key not in _RATIO_CACHE:
        _RATIO_CACHE[key] = torch.tensor([1.0, *rise[1:], 1.0, *tread[1:]],
                                         dtype=torch.float32, device=device)
    return _RATIO_CACHE[key], len(rise), len(tread)


_RATIO_CACHE: dict = {}


def _grids(bits: int, scheme: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """((c0, lps) of a non-negative stored scale, (c0, lps) of a negative one): quant.group_grid
    ("fitted" above 1 bit: the sign bit picks the mid-tread grid of "seed")."""
    own = tuple(float(v) for v in quant.grid(bits, scheme))
    if _signed(bits, scheme):
        return own, tuple(float(v) for v in quant.grid(bits, "seed"))
    return own, own


def _signed(bits: int, scheme: str) -> bool:
    return scheme == "fitted" and bits > 1


def _group_view(shape, granularity: str, g: int) -> dict:
    """Groups of x (contiguous, `shape`) for the group kernel: count NG, size G, layout."""
    numel = math.prod(shape)
    c = shape[-1] if len(shape) else 1
    if granularity == "channel":
        return dict(NG=c, G=numel // max(c, 1), ROWLEN=c, NT=1, ESTRIDE=c, COL=True)
    if granularity == "tensor":
        return dict(NG=1, G=numel, ROWLEN=numel, NT=1, ESTRIDE=1, COL=False)
    if granularity == "bucket":
        return dict(NG=cdiv(numel, g), G=g, ROWLEN=numel, NT=cdiv(numel, g), ESTRIDE=1,
                    COL=False)
    nt = cdiv(c, g)
    return dict(NG=(numel // max(c, 1)) * nt, G=g, ROWLEN=c, NT=nt, ESTRIDE=1, COL=False)


def _launch_group(x, out, mode, view, bits, scheme, scale_dtype, raw=False):
    L = group_sums.lanes("channel" if view["COL"] else "tensor", view["G"])
    # channels: 16 adjacent columns (64-byte row segments) per program, for more programs
    GB = 16 if view["COL"] else max(1, SEG_BLOCK // L)
    ratios, n_rise, n_tread = _ratios(x.device)
    (c0, lps), (c0t, lpst) = _grids(bits, scheme)
    _group_scale_kernel[(cdiv(view["NG"], GB),)](
        x, out, ratios, n_rise, n_tread, quant._FIT_REFITS, view["NG"], view["G"], view["ROWLEN"],
        view["NT"], view["ESTRIDE"], c0, lps, c0t, lpst, float((1 << bits) - 1),
        MODE=mode, COL=view["COL"], RAW=raw, BF16=scale_dtype == torch.bfloat16, GB=GB, L=L,
        LOGL=L.bit_length() - 1, **LAUNCH)


def group_absmax_scales(x, granularity, group_size, scale_dtype) -> torch.Tensor:
    """store_scale(group_absmax(x)): (num_scales,) in scale_dtype."""
    x = x.contiguous()
    ns = quant.num_scales(x.shape, granularity, group_size)
    out = torch.empty(ns, dtype=scale_dtype, device=x.device)
    view = _group_view(x.shape, granularity, group_size)
    if granularity == "tensor" and x.numel() > SEG_BLOCK * 8:
        # one group, one program: first the max of every SEG_BLOCK values in parallel
        part = torch.empty(cdiv(x.numel(), SEG_BLOCK), dtype=torch.float32, device=x.device)
        _launch_group(x, part, ABSMAX, _group_view(x.shape, "bucket", SEG_BLOCK), 8, "absmax",
                      scale_dtype, raw=True)
        x, view = part, _group_view(part.shape, "tensor", 0)
    _launch_group(x, out.view(torch.int16), ABSMAX, view, 8, "absmax", scale_dtype)
    return out


def group_scales(x, bits, granularity, group_size=128, scale_dtype=torch.float16,
                 scheme="fitted") -> torch.Tensor:
    """quant.group_scales on the kernels (sums in group_sums' order)."""
    if scheme == "absmax" or (scheme == "seed" and bits > 1):
        return group_absmax_scales(x, granularity, group_size, scale_dtype)
    if granularity == "tensor" or x.numel() == 0:   # one group would be one program: eager
        return quant.group_scales(x, bits, granularity, group_size, scale_dtype, scheme)
    x = x.contiguous()
    out = torch.empty(quant.num_scales(x.shape, granularity, group_size), dtype=scale_dtype,
                      device=x.device)
    mode = FIT if bits > 1 else (RMS if scheme == "seed" else MEAN_ABS)
    _launch_group(x, out.view(torch.int16), mode, _group_view(x.shape, granularity, group_size),
                  bits, scheme, scale_dtype)
    return out


# ------------------------------------------------------------------- elementwise kernels
@triton.jit
def _scale_index(i, C, G, NT, GRAN: tl.constexpr):
    """Scale of flat element i (quant.py's group order)."""
    if GRAN == 0:
        return i * 0
    elif GRAN == 1:
        return i % C
    elif GRAN == 2:
        return i // G
    else:
        return (i // C) * NT + (i % C) // G


@triton.jit
def _grid(s, C0, LPS, C0T, LPST, SIGNED: tl.constexpr):
    """(c0, step = |s| / lps) of stored scales s (quant.group_grid / quant_step): with SIGNED
    ("fitted" above 1 bit) a negative scale selects the second grid (mid-tread)."""
    if SIGNED:
        neg = s < 0
        return tl.where(neg, C0T, C0), tl.math.div_rn(tl.abs(s), tl.where(neg, LPST, LPS))
    else:
        return C0, tl.math.div_rn(tl.abs(s), LPS)


@triton.jit
def _offset3(i, D1, D2, S0, S1, S2):
    """Address offset of flat element i of a (D0, D1, D2) tensor with strides S0, S1, S2."""
    return (i // (D1 * D2)) * S0 + ((i // D2) % D1) * S1 + (i % D2) * S2


@triton.jit
def _quant_pack_kernel(x_ptr, s_ptr, out_ptr, prev_ptr, new_ptr, N, NBYTES, C, G, NT,
                       D1, D2, PS0, PS1, PS2, NS0, NS1, NS2, C0, LPS, C0T, LPST, QMAX,
                       GRAN: tl.constexpr, BITS: tl.constexpr, BF16: tl.constexpr,
                       SIGNED: tl.constexpr, PREV: tl.constexpr, BLOCK: tl.constexpr,
                       BP: tl.constexpr):
    grp = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)   # 8-code groups
    j = tl.arange(0, 8)
    i = grp[:, None] * 8 + j[None, :]
    m = i < N
    x = tl.load(x_ptr + i, mask=m, other=0.0).to(tl.float32)
    s = scale_value(tl.load(s_ptr + _scale_index(i, C, G, NT, GRAN), mask=m, other=0), BF16)
    c0, raw_step = _grid(s, C0, LPS, C0T, LPST, SIGNED)
    step = tl.where(raw_step > 0, raw_step, 1.0)
    v = round_half_even(tl.math.div_rn(x, step) + c0)
    v = tl.where(m, tl.minimum(tl.maximum(v, 0.0), QMAX), 0.0)   # pad codes are 0 bits
    k = tl.arange(0, BP)
    addr = grp[:, None] * BITS + k[None, :]
    tl.store(out_ptr + addr, pack_groups(v, BITS, BP), mask=(k[None, :] < BITS) & (addr < NBYTES))
    if PREV:   # delta codecs: new cache = prev + dequantize(code), as decode computes it
        prev = tl.load(prev_ptr + _offset3(i, D1, D2, PS0, PS1, PS2), mask=m, other=0.0)
        tl.store(new_ptr + _offset3(i, D1, D2, NS0, NS1, NS2), prev + (v - c0) * raw_step,
                 mask=m)


@triton.jit
def _unpack_dequant_kernel(p_ptr, s_ptr, out_ptr, prev_ptr, N, NBYTES, C, G, NT,
                           D1, D2, PS0, PS1, PS2, C0, LPS, C0T, LPST,
                           GRAN: tl.constexpr, BITS: tl.constexpr, BF16: tl.constexpr,
                           SIGNED: tl.constexpr, OUT: tl.constexpr, PREV: tl.constexpr,
                           BLOCK: tl.constexpr, BP: tl.constexpr):
    grp = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    k = tl.arange(0, BP)
    addr = grp[:, None] * BITS + k[None, :]
    byte = tl.load(p_ptr + addr, mask=(k[None, :] < BITS) & (addr < NBYTES), other=0)
    word = tl.sum(byte.to(tl.uint64) << (k * 8).to(tl.uint64)[None, :], axis=1)
    j = tl.arange(0, 8)
    code = (word[:, None] >> (j * BITS).to(tl.uint64)[None, :]) & ((1 << BITS) - 1)
    i = grp[:, None] * 8 + j[None, :]
    m = i < N
    s = scale_value(tl.load(s_ptr + _scale_index(i, C, G, NT, GRAN), mask=m, other=0), BF16)
    c0, step = _grid(s, C0, LPS, C0T, LPST, SIGNED)
    val = (code.to(tl.float32) - c0) * step
    if PREV:
        val = tl.load(prev_ptr + _offset3(i, D1, D2, PS0, PS1, PS2), mask=m, other=0.0) + val
    if OUT == 0:
        tl.store(out_ptr + i, val, mask=m)
    elif OUT == 1:
        tl.store(out_ptr + i, val.to(tl.float16), mask=m)
    else:
        tl.store(out_ptr + i, bf16_bits(val).to(tl.int16), mask=m)


def _geometry(shape, granularity, group_size) -> tuple[int, int, int]:
    """(C, G, NT) of _scale_index for x of `shape`."""
    c = max(shape[-1], 1) if len(shape) else 1
    return c, group_size, cdiv(c, group_size)


def _dims3(shape) -> tuple[int, int]:
    """(D1, D2) of the 3-D view that prev / new strides refer to."""
    if len(shape) != 3:
        raise ValueError(f"prev / new take (S, B, H) messages, got shape {tuple(shape)}")
    return shape[1], shape[2]


def quantize_pack(x, scales, bits, granularity, group_size=128, scheme="fitted",
                  prev=None, new=None) -> torch.Tensor:
    """pack_bits(quantize_with_scales(x, scales, ...)): the packed uint8 stream.

    prev / new (delta codecs, x of shape (S, B, H), any strides): also writes
    new = prev + dequantize(codes) in fp32, as the receiver computes it."""
    x = x.contiguous()
    n = x.numel()
    out = torch.empty(quant.packed_nbytes(n, bits), dtype=torch.uint8, device=x.device)
    if n == 0:
        return out
    grids = _grids(bits, scheme)
    d1 = d2 = 1
    ps = ns = (0, 0, 0)
    if prev is not None:
        d1, d2 = _dims3(x.shape)
        ps, ns = prev.stride(), new.stride()
    _quant_pack_kernel[(cdiv(cdiv(n, 8), CODE_BLOCK),)](
        x, scales.view(torch.int16), out, prev if prev is not None else x,
        new if new is not None else x, n, out.numel(),
        *_geometry(x.shape, granularity, group_size), d1, d2, *ps, *ns, *grids[0], *grids[1],
        float((1 << bits) - 1), GRAN=GRAN[granularity], BITS=bits,
        BF16=scales.dtype == torch.bfloat16, SIGNED=_signed(bits, scheme),
        PREV=prev is not None, BLOCK=CODE_BLOCK,
        BP=next_pow2(bits), **LAUNCH)
    return out


def unpack_dequantize(packed, scales, bits, shape, granularity="channel", group_size=128,
                      dtype=torch.float32, scheme="fitted", prev=None) -> torch.Tensor:
    """dequantize(unpack_bits(packed), scales, ...).to(dtype), a tensor of `shape`.

    prev (delta codecs): returns prev + dequantize(...) in fp32 (dtype ignored)."""
    shape = tuple(shape)
    n = math.prod(shape)
    if packed.numel() != quant.packed_nbytes(n, bits):
        raise ValueError(f"{packed.numel()} packed bytes, expected ceil({n}*{bits}/8)")
    if prev is not None:
        dtype = torch.float32
    out = torch.empty(shape, dtype=dtype, device=packed.device)
    if n == 0:
        return out
    grids = _grids(bits, scheme)
    d1 = d2 = 1
    ps = (0, 0, 0)
    if prev is not None:
        d1, d2 = _dims3(shape)
        ps = prev.stride()
    kind = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dtype]
    _unpack_dequant_kernel[(cdiv(cdiv(n, 8), CODE_BLOCK),)](
        packed.contiguous(), scales.view(torch.int16), out if kind < 2 else out.view(torch.int16),
        prev if prev is not None else out, n, packed.numel(),
        *_geometry(shape, granularity, group_size), d1, d2, *ps, *grids[0], *grids[1],
        GRAN=GRAN[granularity], BITS=bits, BF16=scales.dtype == torch.bfloat16,
        SIGNED=_signed(bits, scheme), OUT=kind,
        PREV=prev is not None, BLOCK=CODE_BLOCK, BP=next_pow2(bits), **LAUNCH)
    return out


def encode(x, bits, granularity, group_size=128, scale_dtype=torch.float16, scheme="fitted"):
    """(packed codes, scales): fused.encode_eager's payload, on the kernels."""
    scales = group_scales(x, bits, granularity, group_size, scale_dtype, scheme)
    return quantize_pack(x, scales, bits, granularity, group_size, scheme), scales


def decode(packed, scales, bits, shape, granularity, group_size=128, dtype=torch.float32,
           scheme="fitted"):
    return unpack_dequantize(packed, scales, bits, shape, granularity, group_size, dtype,
                             scheme)


# ------------------------------------------------------------------ plain bit packing
@triton.jit
def _pack_kernel(c_ptr, out_ptr, N, NBYTES, BITS: tl.constexpr, BP: tl.constexpr,
                 BLOCK: tl.constexpr):
    grp = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    i = grp[:, None] * 8 + tl.arange(0, 8)[None, :]
    code = tl.load(c_ptr + i, mask=i < N, other=0)
    k = tl.arange(0, BP)
    addr = grp[:, None] * BITS + k[None, :]
    tl.store(out_ptr + addr, pack_groups(code, BITS, BP),
             mask=(k[None, :] < BITS) & (addr < NBYTES))


@triton.jit
def _unpack_kernel(p_ptr, out_ptr, N, NBYTES, BITS: tl.constexpr, BP: tl.constexpr,
                   BLOCK: tl.constexpr):
    grp = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    k = tl.arange(0, BP)
    addr = grp[:, None] * BITS + k[None, :]
    byte = tl.load(p_ptr + addr, mask=(k[None, :] < BITS) & (addr < NBYTES), other=0)
    word = tl.sum(byte.to(tl.uint64) << (k * 8).to(tl.uint64)[None, :], axis=1)
    j = tl.arange(0, 8)
    code = (word[:, None] >> (j * BITS).to(tl.uint64)[None, :]) & ((1 << BITS) - 1)
    i = grp[:, None] * 8 + j[None, :]
    tl.store(out_ptr + i, code.to(tl.uint8), mask=i < N)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """quant.pack_bits: uint8 codes (< 2^bits, any shape) -> 1-D little-endian bit stream."""
    quant._check_bits(bits)
    c = codes.reshape(-1).to(torch.uint8).contiguous()
    out = torch.empty(quant.packed_nbytes(c.numel(), bits), dtype=torch.uint8, device=c.device)
    if c.numel():
        _pack_kernel[(cdiv(cdiv(c.numel(), 8), CODE_BLOCK),)](
            c, out, c.numel(), out.numel(), BITS=bits, BP=next_pow2(bits), BLOCK=CODE_BLOCK,
            **LAUNCH)
    return out


def unpack(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """quant.unpack_bits: the first `numel` codes of a stream, 1-D uint8."""
    quant._check_bits(bits)
    p = packed.reshape(-1).contiguous()
    if p.numel() != quant.packed_nbytes(numel, bits):
        raise ValueError(f"{p.numel()} packed bytes, expected ceil({numel}*{bits}/8)")
    out = torch.empty(numel, dtype=torch.uint8, device=p.device)
    if numel:
        _unpack_kernel[(cdiv(cdiv(numel, 8), CODE_BLOCK),)](
            p, out, numel, p.numel(), BITS=bits, BP=next_pow2(bits), BLOCK=CODE_BLOCK,
            **LAUNCH)
    return out
