"""Fixpoint codec kernels (quant.py's format): group scales, quantise + pack, unpack +
dequantise, each bit-identical to the eager code.

Channel groups split the rows over programs too (per-block partials, then a small reduction
kernel); bucket and tile groups run one program per block of groups. Inputs are read as fp32
from fp32 / bf16 / fp16; scales are stored as 16-bit patterns. "tensor" scales that need a sum
stay eager: one group would be one program.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Tuple

import torch
import triton
import triton.language as tl

from megatron.cc.numerics import quant

from . import group_sums
from .dispatch import LAUNCH, OUT_KIND, cdiv, next_pow2
from .primitives import (pack_groups, round_half_even, scale_value, store_as,
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
                        MODE: tl.constexpr, RAW: tl.constexpr,
                        BF16: tl.constexpr, GB: tl.constexpr, L: tl.constexpr,
                        LOGL: tl.constexpr):
    gi = tl.program_id(0).to(tl.int64) * GB + tl.arange(0, GB)
    gmask = gi < NG
    # group gi: segment gi % NT (G values) of row gi // NT of a (rows, ROWLEN) view
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


# ------------------------------------------------------- channel scales, rows split
# A channel group is a whole column (every row of the message): one program per column block
# would read it alone, leaving few programs each looping over every row.
# Here the rows are split over programs too: each pass writes per-block partial sums of up to
# NCP terms per column, and a small reduction kernel adds the blocks and advances the search.
#
# Stages of the "fitted" search (quant._fit_scales, both grids at once):
#   MAX     max |x| per block                     -> reduce: m
#   LADDER  err of every ladder candidate         -> reduce: best (and its err) per grid
#   FIT     x*k, k*k of each grid's best codes    -> reduce: num / den, the refit candidate
#   REFIT   err, x*k, k*k of the refit candidates -> reduce: keep the better, next candidate
# (REFIT once per quant._FIT_REFITS); absmax stops after MAX, 1-bit after SUM_ABS / SUM_SQ.
ST_MAX, ST_LADDER, ST_FIT, ST_REFIT, ST_SUM_ABS, ST_SUM_SQ = 0, 1, 2, 3, 4, 5
COL_CB = 16           # adjacent columns per program
COL_REDUCE_CB = 64    # columns per program of the reduction
COL_WARPS = 8
MAX_ROWS = 64         # rows per chunk of the max |x| pass
# per-column search state: int32 bit patterns and fp32 values
SB_BEST_R, SB_BEST_T, SB_CAND_R, SB_CAND_T = (tl.constexpr(i) for i in range(4))
SV_M, SV_ERR_R, SV_ERR_T, SV_NUM_R, SV_DEN_R, SV_NUM_T, SV_DEN_T = (tl.constexpr(i)
                                                                    for i in range(7))


@triton.jit
def _set_slots(st_ptr, c0_ptr, j0, n, s_bits, lps, c0, cols, cm, C, BF16: tl.constexpr):
    """Slots j0 .. j0 + n - 1 of the next pass sum the codes of stored scales s_bits on the
    grid (c0, lps): their step and c0 per column."""
    step = _step(scale_value(s_bits, BF16), lps)
    for j in tl.static_range(n):
        tl.store(st_ptr + (j0 + j) * C + cols, step, mask=cm)
        tl.store(c0_ptr + (j0 + j) * C + cols, step * 0.0 + c0, mask=cm)


@triton.jit
def _col_pass_kernel(x_ptr, part_ptr, st_ptr, c0_ptr, N, C, NB, QMAX,
                     STAGE: tl.constexpr, NK: tl.constexpr, CB: tl.constexpr,
                     L: tl.constexpr, LOGL: tl.constexpr, CHUNKS: tl.constexpr,
                     NCP: tl.constexpr):
    """One block of rows x CB columns: per column the block's partial of NK terms, stored at
    part[k, block, column] (group_sums.block_sum's order inside the block). The codes of
    slot k are on the grid (c0, step) the last reduction stored for it."""
    cols = tl.program_id(0) * CB + tl.arange(0, CB)
    cm = cols < C
    blk = tl.program_id(1)
    lane = tl.arange(0, L)
    row0 = blk.to(tl.int64) * (CHUNKS * L)
    if STAGE == 0:
        m = tl.zeros((CB,), tl.float32)
        for c in range(CHUNKS):
            r = row0 + c * L + lane
            ok = cm[:, None] & (r < N)[None, :]
            x = tl.load(x_ptr + r[None, :] * C + cols[:, None], mask=ok, other=0.0)
            m = tl.maximum(m, tl.max(tl.abs(x.to(tl.float32)), axis=1))
        tl.store(part_ptr + blk * C + cols, m, mask=cm)
    else:
        slot = tl.arange(0, NCP)[None, :]
        sm = cm[:, None] & (slot < NK)
        step3 = tl.load(st_ptr + slot * C + cols[:, None], mask=sm, other=1.0)[:, None, :]
        c03 = tl.load(c0_ptr + slot * C + cols[:, None], mask=sm, other=0.0)[:, None, :]
        slot = slot[:, None, :]
        acc = tl.zeros((CB, L, NCP), tl.float32)
        for c in range(CHUNKS):
            r = row0 + c * L + lane
            ok = cm[:, None] & (r < N)[None, :]
            x = tl.load(x_ptr + r[None, :] * C + cols[:, None], mask=ok,
                        other=0.0).to(tl.float32)[:, :, None]
            if STAGE == 4:
                t = tl.abs(x)
            elif STAGE == 5:
                t = x * x
            else:
                v = round_half_even(tl.math.div_rn(x, step3) + c03)
                k = tl.minimum(tl.maximum(v, 0.0), QMAX) - c03
                if STAGE == 1:
                    d = x - k * step3
                    t = d * d
                elif STAGE == 2:   # even slots x * k, odd k * k
                    t = tl.where(slot % 2 == 0, x * k, k * k)
                else:              # slot % 3: error, x * k, k * k
                    d = x - k * step3
                    t = tl.where(slot % 3 == 0, d * d, tl.where(slot % 3 == 1, x * k, k * k))
            acc = acc + tl.where(ok[:, :, None], t, 0.0)
        tot = tree_sum(tl.reshape(tl.permute(acc, (0, 2, 1)), (CB * NCP, L)), L, LOGL)
        tot = tl.reshape(tot, (CB, NCP))
        k2 = tl.arange(0, NCP)[None, :]
        tl.store(part_ptr + k2 * (NB * C) + blk * C + cols[:, None], tot,
                 mask=cm[:, None] & (k2 < NK))


@triton.jit
def _block_total(part_ptr, k, cols, cm, C, NB, NBP: tl.constexpr, LOGNB: tl.constexpr):
    b = tl.arange(0, NBP)
    v = tl.load(part_ptr + k * (NB * C) + b[None, :] * C + cols[:, None],
                mask=cm[:, None] & (b < NB)[None, :], other=0.0)
    return tree_sum(v, NBP, LOGNB)


@triton.jit
def _refit_bits(num, den, LPS, BF16: tl.constexpr):
    """The least-squares candidate of (num, den): quant._fit_scales' refit, stored."""
    fit = tl.where(den > 0, tl.math.div_rn(num, tl.maximum(den, DEN_MIN)), 0.0)
    return store_scale_bits(tl.where(fit < 0, 0.0, fit) * LPS, BF16)


@triton.jit
def _col_reduce_kernel(part_ptr, sb_ptr, sv_ptr, st_ptr, c0_ptr, out_ptr, ratio_ptr, N, C, NB,
                       C0, LPS, C0T, LPST,
                       STAGE: tl.constexpr, LAST: tl.constexpr, NRISE: tl.constexpr,
                       NCAND: tl.constexpr, BF16: tl.constexpr, CB: tl.constexpr,
                       NBP: tl.constexpr, LOGNB: tl.constexpr, RAW: tl.constexpr):
    """Adds the blocks' partials of CB columns and advances their search (module comment)."""
    cols = tl.program_id(0) * CB + tl.arange(0, CB)
    cm = cols < C
    if STAGE == 0:     # max |x|: exact in any order
        b = tl.arange(0, NBP)
        v = tl.load(part_ptr + b[None, :] * C + cols[:, None],
                    mask=cm[:, None] & (b < NB)[None, :], other=0.0)
        m = tl.max(v, axis=1)
        if LAST:       # absmax scales
            tl.store(out_ptr + cols, store_scale_bits(m, BF16).to(tl.int16), mask=cm)
        else:          # the ladder's candidates: mid-rise ratios, then mid-tread
            tl.store(sv_ptr + SV_M * C + cols, m, mask=cm)
            for j in tl.static_range(NCAND):
                cand = store_scale_bits(m * tl.load(ratio_ptr + j), BF16)
                if j < NRISE:
                    _set_slots(st_ptr, c0_ptr, j, 1, cand, LPS, C0, cols, cm, C, BF16)
                else:
                    _set_slots(st_ptr, c0_ptr, j, 1, cand, LPST, C0T, cols, cm, C, BF16)
    elif STAGE >= 4:   # 1 bit: mean |x| or RMS over the N rows (RAW: the fp32 sums)
        tot = _block_total(part_ptr, 0, cols, cm, C, NB, NBP, LOGNB)
        if RAW:
            tl.store(out_ptr + cols, tot, mask=cm)
        else:
            s = tl.math.div_rn(tot, N.to(tl.float32))
            if STAGE == 5:
                s = tl.sqrt_rn(s)
            tl.store(out_ptr + cols, store_scale_bits(s, BF16).to(tl.int16), mask=cm)
    else:
        if STAGE == 1:     # each grid's ladder, in order: the first taken, then strictly better
            m = tl.load(sv_ptr + SV_M * C + cols, mask=cm, other=0.0)
            br = tl.zeros((CB,), tl.int32)
            er = tl.zeros((CB,), tl.float32)
            bt = tl.zeros((CB,), tl.int32)
            et = tl.zeros((CB,), tl.float32)
            for j in tl.static_range(NCAND):
                e = _block_total(part_ptr, j, cols, cm, C, NB, NBP, LOGNB)
                cand = store_scale_bits(m * tl.load(ratio_ptr + j), BF16)
                if j < NRISE:
                    better = (e < er) | (j == 0)
                    br = tl.where(better, cand, br)
                    er = tl.where(better, e, er)
                else:
                    better = (e < et) | (j == NRISE)
                    bt = tl.where(better, cand, bt)
                    et = tl.where(better, e, et)
        else:
            br = tl.load(sb_ptr + SB_BEST_R * C + cols, mask=cm, other=0)
            bt = tl.load(sb_ptr + SB_BEST_T * C + cols, mask=cm, other=0)
            er = tl.load(sv_ptr + SV_ERR_R * C + cols, mask=cm, other=0.0)
            et = tl.load(sv_ptr + SV_ERR_T * C + cols, mask=cm, other=0.0)
        if STAGE == 2:     # the best codes' sums
            nr = _block_total(part_ptr, 0, cols, cm, C, NB, NBP, LOGNB)
            dr = _block_total(part_ptr, 1, cols, cm, C, NB, NBP, LOGNB)
            nt = _block_total(part_ptr, 2, cols, cm, C, NB, NBP, LOGNB)
            dt = _block_total(part_ptr, 3, cols, cm, C, NB, NBP, LOGNB)
        elif STAGE == 3:   # a refit candidate replaces the best when strictly better
            nr = tl.load(sv_ptr + SV_NUM_R * C + cols, mask=cm, other=0.0)
            dr = tl.load(sv_ptr + SV_DEN_R * C + cols, mask=cm, other=0.0)
            nt = tl.load(sv_ptr + SV_NUM_T * C + cols, mask=cm, other=0.0)
            dt = tl.load(sv_ptr + SV_DEN_T * C + cols, mask=cm, other=0.0)
            cr = tl.load(sb_ptr + SB_CAND_R * C + cols, mask=cm, other=0)
            ct = tl.load(sb_ptr + SB_CAND_T * C + cols, mask=cm, other=0)
            e = _block_total(part_ptr, 0, cols, cm, C, NB, NBP, LOGNB)
            up = e < er
            br = tl.where(up, cr, br)
            er = tl.where(up, e, er)
            nr = tl.where(up, _block_total(part_ptr, 1, cols, cm, C, NB, NBP, LOGNB), nr)
            dr = tl.where(up, _block_total(part_ptr, 2, cols, cm, C, NB, NBP, LOGNB), dr)
            e = _block_total(part_ptr, 3, cols, cm, C, NB, NBP, LOGNB)
            up = e < et
            bt = tl.where(up, ct, bt)
            et = tl.where(up, e, et)
            nt = tl.where(up, _block_total(part_ptr, 4, cols, cm, C, NB, NBP, LOGNB), nt)
            dt = tl.where(up, _block_total(part_ptr, 5, cols, cm, C, NB, NBP, LOGNB), dt)
        if LAST:           # mid-tread only when strictly better; stored with the sign bit
            s = tl.where(et < er, bt ^ 0x8000, br)
            tl.store(out_ptr + cols, s.to(tl.int16), mask=cm)
        else:
            tl.store(sb_ptr + SB_BEST_R * C + cols, br, mask=cm)
            tl.store(sb_ptr + SB_BEST_T * C + cols, bt, mask=cm)
            tl.store(sv_ptr + SV_ERR_R * C + cols, er, mask=cm)
            tl.store(sv_ptr + SV_ERR_T * C + cols, et, mask=cm)
            if STAGE == 1:     # the next pass: x*k, k*k of each grid's best codes
                _set_slots(st_ptr, c0_ptr, 0, 2, br, LPS, C0, cols, cm, C, BF16)
                _set_slots(st_ptr, c0_ptr, 2, 2, bt, LPST, C0T, cols, cm, C, BF16)
            else:              # the next pass: error, x*k, k*k of the refit candidates
                tl.store(sv_ptr + SV_NUM_R * C + cols, nr, mask=cm)
                tl.store(sv_ptr + SV_DEN_R * C + cols, dr, mask=cm)
                tl.store(sv_ptr + SV_NUM_T * C + cols, nt, mask=cm)
                tl.store(sv_ptr + SV_DEN_T * C + cols, dt, mask=cm)
                cr = _refit_bits(nr, dr, LPS, BF16)
                ct = _refit_bits(nt, dt, LPST, BF16)
                tl.store(sb_ptr + SB_CAND_R * C + cols, cr, mask=cm)
                tl.store(sb_ptr + SB_CAND_T * C + cols, ct, mask=cm)
                _set_slots(st_ptr, c0_ptr, 0, 3, cr, LPS, C0, cols, cm, C, BF16)
                _set_slots(st_ptr, c0_ptr, 3, 3, ct, LPST, C0T, cols, cm, C, BF16)


class _ColumnPlan(NamedTuple):
    """Everything of a _channel_scales call but its tensors: the workspace's layout and each
    stage's launch arguments (built once per shape and mode: a message's many calls then
    spend their host time on the launches alone)."""
    # where part ends in the fp32 workspace, then (fitted) where sv, st step, st c0 and sb end:
    # the last is the workspace's size
    slices: Tuple[int, ...]
    grid_pass: Tuple[int, int]
    grid_reduce: Tuple[int]
    pass_args: tuple               # N, C, nb, qmax
    reduce_args: tuple             # N, C, nb, c0, lps, c0t, lpst
    stages: Tuple[Tuple[dict, dict], ...]   # (pass kwargs, reduce kwargs) per stage


def _aligned(n: int) -> int:
    """n rounded up to whole 128-byte lines of fp32 (the kernels' pointers stay 16-aligned)."""
    return cdiv(n, 32) * 32


@functools.lru_cache(maxsize=256)
def _column_plan(N, C, mode, bits, scheme, bf16, raw, block_rows, lanes, n_rise, n_tread,
                 refits) -> _ColumnPlan:
    L = lanes
    chunks = max(1, block_rows // L)
    nb = max(1, cdiv(N, chunks * L))
    if nb == 1:   # a short message: only the chunks that hold rows (the rest would add 0.0)
        chunks = max(1, cdiv(N, L))
    nbp = next_pow2(nb)
    (c0, lps), (c0t, lpst) = grids_of(bits, scheme)
    ncand = n_rise + n_tread
    fitted = mode == FIT
    slots = max(ncand, 6) if fitted else 1
    passes = {ABSMAX: [(ST_MAX, 1)], MEAN_ABS: [(ST_SUM_ABS, 1)], RMS: [(ST_SUM_SQ, 1)],
              FIT: [(ST_MAX, 1), (ST_LADDER, ncand)]
              + ([(ST_FIT, 4)] + [(ST_REFIT, 6)] * refits if refits else [])}[mode]
    rows = chunks * L
    stages = []
    for i, (stage, nk) in enumerate(passes):
        # max |x| is exact in any order: longer chunks, fewer loop trips
        ln = MAX_ROWS if stage == ST_MAX and rows % MAX_ROWS == 0 else L
        stages.append((
            dict(STAGE=stage, NK=nk, CB=COL_CB, L=ln, LOGL=ln.bit_length() - 1,
                 CHUNKS=rows // ln, NCP=next_pow2(nk), num_warps=COL_WARPS, **LAUNCH),
            dict(STAGE=stage, LAST=i == len(passes) - 1, NRISE=n_rise, NCAND=ncand, BF16=bf16,
                 CB=COL_REDUCE_CB, NBP=nbp, LOGNB=nbp.bit_length() - 1, RAW=raw, **LAUNCH)))
    offsets = [_aligned(slots * nb * C)]
    if fitted:   # sv (7 rows), st's step and c0 (slots rows each), sb (4 int32 rows)
        for n in (7 * C, slots * C, slots * C, 4 * C):
            offsets.append(offsets[-1] + _aligned(n))
    return _ColumnPlan(tuple(offsets), (cdiv(C, COL_CB), nb),
                       (cdiv(C, COL_REDUCE_CB),), (N, C, nb, float((1 << bits) - 1)),
                       (N, C, nb, c0, lps, c0t, lpst), tuple(stages))


def _channel_scales(x, out, mode, bits, scheme, scale_dtype, raw=False) -> None:
    """Channel scales of x (contiguous, viewed (N, C)) into out (int16 view), rows split over
    programs (module comment above); raw (1-bit modes): the fp32 column sums instead."""
    C = max(x.shape[-1], 1) if x.dim() else 1
    ratios, n_rise, n_tread = _ratios(x.device)
    p = _column_plan(x.numel() // C, C, mode, bits, scheme, scale_dtype == torch.bfloat16, raw,
                     group_sums.COL_BLOCK_ROWS, group_sums.COL_LANES, n_rise, n_tread,
                     quant._FIT_REFITS)
    o = p.slices
    ws = torch.empty(o[-1], dtype=torch.float32, device=x.device)   # one allocation
    if len(o) > 1:   # the fitted search's state
        part, sv, step, c0 = ws[:o[0]], ws[o[0]:o[1]], ws[o[1]:o[2]], ws[o[2]:o[3]]
        sb = ws[o[3]:o[4]].view(torch.int32)
    else:            # one pass: no state (the unused pointers take the workspace)
        part = sv = step = c0 = ws
        sb = ws.view(torch.int32)
    for pass_kw, reduce_kw in p.stages:
        _col_pass_kernel[p.grid_pass](x, part, step, c0, *p.pass_args, **pass_kw)
        _col_reduce_kernel[p.grid_reduce](part, sb, sv, step, c0, out, ratios, *p.reduce_args,
                                          **reduce_kw)


def column_sums(x: torch.Tensor, squares: bool = False) -> torch.Tensor:
    """sum |x| (or x^2) of every column of x viewed (N, C), fp32, in group_sums.block_sum's
    order: the sums behind the 1-bit channel scales."""
    x = x.contiguous()
    out = torch.empty(max(x.shape[-1], 1) if x.dim() else 1, dtype=torch.float32,
                      device=x.device)
    _channel_scales(x, out, RMS if squares else MEAN_ABS, 1, "seed" if squares else "fitted",
                    torch.float16, raw=True)
    return out


def _ratios(device) -> tuple[torch.Tensor, int, int]:
    """(ratios, n_rise, n_tread): quant._fit_scales's clipping ladders for the mid-rise then the
    mid-tread grid, each as [1, ladder[1:]], fp32 on `device`; cached per (device, values)."""
    rise = tuple(quant._FIT_RATIOS)
    tread = tuple(quant._TREAD_RATIOS)
    key = (device, rise, tread)
    if key not in _RATIO_CACHE:
        _RATIO_CACHE[key] = torch.tensor([1.0, *rise[1:], 1.0, *tread[1:]],
                                         dtype=torch.float32, device=device)
    return _RATIO_CACHE[key], len(rise), len(tread)


_RATIO_CACHE: dict = {}


@functools.lru_cache(maxsize=None)
def grids_of(bits: int, scheme: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """((c0, lps) of a non-negative stored scale, (c0, lps) of a negative one): quant.group_grid
    ("fitted" above 1 bit: the sign bit picks the mid-tread grid of "seed")."""
    own = tuple(float(v) for v in quant.grid(bits, scheme))
    if signed_grid(bits, scheme):
        return own, tuple(float(v) for v in quant.grid(bits, "seed"))
    return own, own


def signed_grid(bits: int, scheme: str) -> bool:
    return scheme == "fitted" and bits > 1


def _group_view(shape, granularity: str, g: int) -> dict:
    """Runs of values of x (contiguous, `shape`) for the group kernel: count NG, size G,
    layout (channel groups take _channel_scales)."""
    numel = math.prod(shape)
    c = shape[-1] if len(shape) else 1
    if granularity == "tensor":
        return dict(NG=1, G=numel, ROWLEN=numel, NT=1, ESTRIDE=1)
    if granularity == "bucket":
        return dict(NG=cdiv(numel, g), G=g, ROWLEN=numel, NT=cdiv(numel, g), ESTRIDE=1)
    nt = cdiv(c, g)   # tile
    return dict(NG=(numel // max(c, 1)) * nt, G=g, ROWLEN=c, NT=nt, ESTRIDE=1)


def _launch_group(x, out, mode, view, bits, scheme, scale_dtype, raw=False):
    L = group_sums.lanes("tensor", view["G"])
    GB = max(1, SEG_BLOCK // L)
    ratios, n_rise, n_tread = _ratios(x.device)
    (c0, lps), (c0t, lpst) = grids_of(bits, scheme)
    _group_scale_kernel[(cdiv(view["NG"], GB),)](
        x, out, ratios, n_rise, n_tread, quant._FIT_REFITS, view["NG"], view["G"], view["ROWLEN"],
        view["NT"], view["ESTRIDE"], c0, lps, c0t, lpst, float((1 << bits) - 1),
        MODE=mode, RAW=raw, BF16=scale_dtype == torch.bfloat16, GB=GB, L=L,
        LOGL=L.bit_length() - 1, **LAUNCH)


def group_absmax_scales(x, granularity, group_size, scale_dtype) -> torch.Tensor:
    """store_scale(group_absmax(x)): (num_scales,) in scale_dtype."""
    x = x.contiguous()
    ns = quant.num_scales(x.shape, granularity, group_size)
    out = torch.empty(ns, dtype=scale_dtype, device=x.device)
    if granularity == "channel":
        if x.numel():
            _channel_scales(x, out.view(torch.int16), ABSMAX, 8, "absmax", scale_dtype)
        else:
            out.zero_()
        return out
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
    if granularity == "channel":
        _channel_scales(x, out.view(torch.int16), mode, bits, scheme, scale_dtype)
        return out
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
def step_grid(s, C0, LPS, C0T, LPST, SIGNED: tl.constexpr):
    """(c0, step = |s| / lps) of stored scales s (quant.group_grid / quant_step): with SIGNED
    ("fitted" above 1 bit) a negative scale selects the second grid (mid-tread)."""
    if SIGNED:
        neg = s < 0
        return tl.where(neg, C0T, C0), tl.math.div_rn(tl.abs(s), tl.where(neg, LPST, LPS))
    else:
        return C0, tl.math.div_rn(tl.abs(s), LPS)


@triton.jit
def offset3(i, D1, D2, S0, S1, S2, slot_ptr, SLOTS: tl.constexpr):
    """Address offset of flat element i of a (D0, D1, D2) tensor with strides S0, S1, S2; with
    SLOTS, index j of dimension 1 stands for slot_ptr[j] (a per-sample cache's rows)."""
    j = (i // D2) % D1
    if SLOTS:
        j = tl.load(slot_ptr + j)
    return (i // (D1 * D2)) * S0 + j * S1 + (i % D2) * S2


@triton.jit
def _quant_pack_kernel(x_ptr, s_ptr, out_ptr, prev_ptr, new_ptr, slot_ptr, N, NBYTES, C, G, NT,
                       D1, D2, PS0, PS1, PS2, NS0, NS1, NS2, C0, LPS, C0T, LPST, QMAX,
                       GRAN: tl.constexpr, BITS: tl.constexpr, BF16: tl.constexpr,
                       SIGNED: tl.constexpr, PREV: tl.constexpr, SLOTS: tl.constexpr,
                       BLOCK: tl.constexpr, BP: tl.constexpr):
    grp = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)   # 8-code groups
    j = tl.arange(0, 8)
    i = grp[:, None] * 8 + j[None, :]
    m = i < N
    x = tl.load(x_ptr + i, mask=m, other=0.0).to(tl.float32)
    s = scale_value(tl.load(s_ptr + _scale_index(i, C, G, NT, GRAN), mask=m, other=0), BF16)
    c0, raw_step = step_grid(s, C0, LPS, C0T, LPST, SIGNED)
    step = tl.where(raw_step > 0, raw_step, 1.0)
    v = round_half_even(tl.math.div_rn(x, step) + c0)
    v = tl.where(m, tl.minimum(tl.maximum(v, 0.0), QMAX), 0.0)   # pad codes are 0 bits
    k = tl.arange(0, BP)
    addr = grp[:, None] * BITS + k[None, :]
    tl.store(out_ptr + addr, pack_groups(v, BITS, BP), mask=(k[None, :] < BITS) & (addr < NBYTES))
    if PREV:   # delta codecs: new cache = prev + dequantize(code), as decode computes it
        prev = tl.load(prev_ptr + offset3(i, D1, D2, PS0, PS1, PS2, slot_ptr, SLOTS), mask=m,
                       other=0.0)
        tl.store(new_ptr + offset3(i, D1, D2, NS0, NS1, NS2, slot_ptr, SLOTS),
                 prev + (v - c0) * raw_step, mask=m)


@triton.jit
def _unpack_dequant_kernel(p_ptr, s_ptr, out_ptr, prev_ptr, new_ptr, slot_ptr, N, NBYTES, C, G,
                           NT, D1, D2, PS0, PS1, PS2, NS0, NS1, NS2, C0, LPS, C0T, LPST,
                           GRAN: tl.constexpr, BITS: tl.constexpr, BF16: tl.constexpr,
                           SIGNED: tl.constexpr, OUT: tl.constexpr, PREV: tl.constexpr,
                           SLOTS: tl.constexpr, BLOCK: tl.constexpr, BP: tl.constexpr):
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
    c0, step = step_grid(s, C0, LPS, C0T, LPST, SIGNED)
    val = (code.to(tl.float32) - c0) * step
    if PREV:   # delta codecs: the fp32 sum to `new` (the receiver's cache), the message below
        val = tl.load(prev_ptr + offset3(i, D1, D2, PS0, PS1, PS2, slot_ptr, SLOTS), mask=m,
                      other=0.0) + val
        tl.store(new_ptr + offset3(i, D1, D2, NS0, NS1, NS2, slot_ptr, SLOTS), val, mask=m)
    store_as(out_ptr + i, val, m, OUT)


def _geometry(shape, granularity, group_size) -> tuple[int, int, int]:
    """(C, G, NT) of _scale_index for x of `shape`."""
    c = max(shape[-1], 1) if len(shape) else 1
    return c, group_size, cdiv(c, group_size)


def _dims3(shape) -> tuple[int, int]:
    """(D1, D2) of the 3-D view that prev / new strides refer to."""
    if len(shape) != 3:
        raise ValueError(f"prev / new take (S, B, H) messages, got shape {tuple(shape)}")
    return shape[1], shape[2]


def cache_args(shape, prev, new, slots) -> tuple:
    """(D1, D2, prev strides, new strides, slot tensor or None) of the kernels' prev / new:
    (S, B, H) tensors of any strides, or with `slots` (B,) int64 on their device, per-sample
    caches (rows, S, H) whose row slots[b] holds sample b."""
    d1, d2 = _dims3(shape)
    if slots is None:
        return d1, d2, prev.stride(), new.stride(), None
    if slots.shape != (d1,) or slots.dtype != torch.int64:
        raise ValueError(f"slots: ({d1},) int64 expected, got {tuple(slots.shape)} {slots.dtype}")
    ps, ns = prev.stride(), new.stride()
    # strides in (S, B, H) order: the row dimension takes B's place
    return d1, d2, (ps[1], ps[0], ps[2]), (ns[1], ns[0], ns[2]), slots


def quantize_pack(x, scales, bits, granularity, group_size=128, scheme="fitted",
                  prev=None, new=None, slots=None) -> torch.Tensor:
    """pack_bits(quantize_with_scales(x, scales, ...)): the packed uint8 stream.

    prev / new (delta codecs, x of shape (S, B, H)): also writes new = prev + dequantize(codes)
    in fp32, as the receiver computes it; (S, B, H) of any strides, or per-sample caches
    addressed through `slots` (cache_args)."""
    x = x.contiguous()
    n = x.numel()
    out = torch.empty(quant.packed_nbytes(n, bits), dtype=torch.uint8, device=x.device)
    if n == 0:
        return out
    grids = grids_of(bits, scheme)
    d1 = d2 = 1
    ps = ns = (0, 0, 0)
    if prev is not None:
        d1, d2, ps, ns, slots = cache_args(x.shape, prev, new, slots)
    _quant_pack_kernel[(cdiv(cdiv(n, 8), CODE_BLOCK),)](
        x, scales.view(torch.int16), out, prev if prev is not None else x,
        new if new is not None else x, slots if slots is not None else out, n, out.numel(),
        *_geometry(x.shape, granularity, group_size), d1, d2, *ps, *ns, *grids[0], *grids[1],
        float((1 << bits) - 1), GRAN=GRAN[granularity], BITS=bits,
        BF16=scales.dtype == torch.bfloat16, SIGNED=signed_grid(bits, scheme),
        PREV=prev is not None, SLOTS=slots is not None, BLOCK=CODE_BLOCK,
        BP=next_pow2(bits), **LAUNCH)
    return out


def unpack_dequantize(packed, scales, bits, shape, granularity="channel", group_size=128,
                      dtype=torch.float32, scheme="fitted", prev=None,
                      new=None, slots=None) -> torch.Tensor:
    """dequantize(unpack_bits(packed), scales, ...).to(dtype), a tensor of `shape`.

    prev and new (delta codecs, fp32, new may be prev itself; (S, B, H) of any strides, or
    per-sample caches addressed through `slots`, as in quantize_pack): the same pass writes
    new = prev + dequantize(...) and returns that sum in `dtype`."""
    shape = tuple(shape)
    n = math.prod(shape)
    if packed.numel() != quant.packed_nbytes(n, bits):
        raise ValueError(f"{packed.numel()} packed bytes, expected ceil({n}*{bits}/8)")
    if (prev is None) != (new is None):
        raise ValueError("unpack_dequantize: prev and new go together")
    out = torch.empty(shape, dtype=dtype, device=packed.device)
    if n == 0:
        return out
    grids = grids_of(bits, scheme)
    d1 = d2 = 1
    ps = ns = (0, 0, 0)
    if prev is not None:
        d1, d2, ps, ns, slots = cache_args(shape, prev, new, slots)
    kind = OUT_KIND[dtype]
    _unpack_dequant_kernel[(cdiv(cdiv(n, 8), CODE_BLOCK),)](
        packed.contiguous(), scales.view(torch.int16), out if kind < 2 else out.view(torch.int16),
        prev if prev is not None else out, new if new is not None else out,
        slots if slots is not None else packed, n, packed.numel(),
        *_geometry(shape, granularity, group_size), d1, d2, *ps, *ns, *grids[0], *grids[1],
        GRAN=GRAN[granularity], BITS=bits, BF16=scales.dtype == torch.bfloat16,
        SIGNED=signed_grid(bits, scheme), OUT=kind, PREV=prev is not None,
        SLOTS=slots is not None, BLOCK=CODE_BLOCK, BP=next_pow2(bits), **LAUNCH)
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
    quant.check_bits(bits)
    c = codes.reshape(-1).to(torch.uint8).contiguous()
    out = torch.empty(quant.packed_nbytes(c.numel(), bits), dtype=torch.uint8, device=c.device)
    if c.numel():
        _pack_kernel[(cdiv(cdiv(c.numel(), 8), CODE_BLOCK),)](
            c, out, c.numel(), out.numel(), BITS=bits, BP=next_pow2(bits), BLOCK=CODE_BLOCK,
            **LAUNCH)
    return out


def unpack(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """quant.unpack_bits: the first `numel` codes of a stream, 1-D uint8."""
    quant.check_bits(bits)
    p = packed.reshape(-1).contiguous()
    if p.numel() != quant.packed_nbytes(numel, bits):
        raise ValueError(f"{p.numel()} packed bytes, expected ceil({numel}*{bits}/8)")
    out = torch.empty(numel, dtype=torch.uint8, device=p.device)
    if numel:
        _unpack_kernel[(cdiv(cdiv(numel, 8), CODE_BLOCK),)](
            p, out, numel, p.numel(), BITS=bits, BP=next_pow2(bits), BLOCK=CODE_BLOCK,
            **LAUNCH)
    return out
