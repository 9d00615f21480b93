"""The lowrank codec's (codecs/lowrank.py) Gram-Schmidt in one launch, its payload made in two
(`finish`), and its decode P Q^T written in the message's dtype in one pass (or subtracted from
a matrix: the randomized SVD's error feedback, `low_rank_residual`).

One program per matrix sweeps the rows twice per column, in place of several small launches per
column and pass, up to 512 rows a step (group_sums.gram_schmidt_lanes). Sums over the n rows
follow kernels/group_sums.py's order; group_sums.orthogonalize_ is the torch twin the kernel
equals bit for bit (against the BLAS order of lowrank.orthogonalize_ the result differs by
rounding only). Used for CUDA fp32 contiguous p (n, r) with n <= 16384.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import group_sums
from .dispatch import LAUNCH, OUT_KIND, cdiv, next_pow2
from .primitives import bf16_bits, bf16_value, store_as, tree_sum

EXPAND_ROWS, EXPAND_COLS = 64, 128   # output tile per program of the decode
FINISH_ROWS = 256                    # rows of P or Q per program of `finish`


@triton.jit
def _column(tile, cols, i):
    """Column i of a (BR, RP) tile, exactly (a max over -inf keeps signed zeros)."""
    return tl.max(tl.where(cols[None, :] == i, tile, -float("inf")), axis=1)


@triton.jit
def _gram_schmidt_kernel(p_ptr, N, R, EPS, passes,
                         BR: tl.constexpr, LOGBR: tl.constexpr, RP: tl.constexpr):
    rows = tl.arange(0, BR)
    cols = tl.arange(0, RP)
    cm = cols < R
    for _ in range(passes):
        sq = tl.zeros((BR, RP), tl.float32)            # squares of every column
        for c in range(tl.cdiv(N, BR)):
            r = c * BR + rows
            m = (r < N)[:, None] & cm[None, :]
            t = tl.load(p_ptr + r[:, None].to(tl.int64) * R + cols[None, :], mask=m, other=0.0)
            sq = sq + t * t
        norms = tl.sqrt_rn(tree_sum(tl.trans(sq), BR, LOGBR))
        scale = tl.max(tl.where(cm, norms, 0.0), axis=0)
        floor = tl.where(scale > 0, EPS * scale, EPS)
        norm_i = tl.max(tl.where(cols == 0, norms, -float("inf")), axis=0)
        for i in range(R):
            d = tl.maximum(norm_i, floor)
            later = cm & (cols > i)
            dots = tl.zeros((BR, RP), tl.float32)       # sweep 1: column i . later columns
            for c in range(tl.cdiv(N, BR)):
                r = c * BR + rows
                m = (r < N)[:, None] & cm[None, :]
                t = tl.load(p_ptr + r[:, None].to(tl.int64) * R + cols[None, :], mask=m,
                            other=0.0)
                col = tl.math.div_rn(_column(t, cols, i), d)
                dots = dots + tl.where(later[None, :] & m, col[:, None] * t, 0.0)
            proj = tree_sum(tl.trans(dots), BR, LOGBR)
            tl.debug_barrier()
            sq = tl.zeros((BR, RP), tl.float32)         # sweep 2: write, and norm of i + 1
            for c in range(tl.cdiv(N, BR)):
                r = c * BR + rows
                m = (r < N)[:, None] & cm[None, :]
                ptr = p_ptr + r[:, None].to(tl.int64) * R + cols[None, :]
                t = tl.load(ptr, mask=m, other=0.0)
                col = tl.math.div_rn(_column(t, cols, i), d)
                t = tl.where(later[None, :], t - col[:, None] * proj[None, :], t)
                t = tl.where(cols[None, :] == i, col[:, None], t)
                tl.store(ptr, t, mask=m)
                sq = sq + tl.where((cols[None, :] == i + 1) & m, t * t, 0.0)
            norm_i = tl.sqrt_rn(tl.max(tl.where(cols == i + 1, tree_sum(tl.trans(sq), BR, LOGBR),
                                                -float("inf")), axis=0))
            tl.debug_barrier()


@triton.jit
def _round_trip(t, pd_ptr, s_ptr, off, m, OUT: tl.constexpr):
    """t rounded to fp16 (OUT 1) or bf16 (2, as bits into an int16 view) as torch's cast, at
    pd_ptr; that value again in fp32 at s_ptr."""
    if OUT == 1:
        h = t.to(tl.float16)
        tl.store(pd_ptr + off, h, mask=m)
        tl.store(s_ptr + off, h.to(tl.float32), mask=m)
    else:
        b = bf16_bits(t)
        tl.store(pd_ptr + off, b.to(tl.int16), mask=m)
        tl.store(s_ptr + off, bf16_value(b), mask=m)


@triton.jit
def _finish_kernel(p_ptr, q_ptr, qold_ptr, sq_ptr, ppd_ptr, ps_ptr, qpd_ptr, qs_ptr, N, M, R,
                   NQB, PHASE: tl.constexpr, OUT: tl.constexpr, RP: tl.constexpr,
                   BR: tl.constexpr, NQBP: tl.constexpr):
    """PHASE 0: programs < NQB store their Q rows' column sums of squares, the others cast
    their P rows. PHASE 1: a Q column whose squares all are 0 takes q_old's (in place), and Q
    is cast."""
    pid = tl.program_id(0)
    cols = tl.arange(0, RP)
    cm = cols < R
    rows = tl.arange(0, BR)
    if PHASE == 0:
        if pid < NQB:
            r = pid.to(tl.int64) * BR + rows
            m = (r < M)[:, None] & cm[None, :]
            t = tl.load(q_ptr + r[:, None] * R + cols[None, :], mask=m, other=0.0)
            # tested against 0 only: zero in any order exactly when every square is
            tl.store(sq_ptr + pid * RP + cols, tl.sum(t * t, axis=0))
        else:
            r = (pid - NQB).to(tl.int64) * BR + rows
            m = (r < N)[:, None] & cm[None, :]
            off = r[:, None] * R + cols[None, :]
            _round_trip(tl.load(p_ptr + off, mask=m, other=0.0), ppd_ptr, ps_ptr, off, m, OUT)
    else:
        b = tl.arange(0, NQBP)
        sq = tl.load(sq_ptr + b[:, None] * RP + cols[None, :], mask=(b < NQB)[:, None],
                     other=0.0)
        dead = tl.sum(sq, axis=0) == 0.0
        r = pid.to(tl.int64) * BR + rows
        m = (r < M)[:, None] & cm[None, :]
        off = r[:, None] * R + cols[None, :]
        t = tl.load(q_ptr + off, mask=m, other=0.0)
        t = tl.where(dead[None, :], tl.load(qold_ptr + off, mask=m, other=0.0), t)
        tl.store(q_ptr + off, t, mask=m)
        _round_trip(t, qpd_ptr, qs_ptr, off, m, OUT)


def finish(p: torch.Tensor, q: torch.Tensor, q_old: torch.Tensor, dtype):
    """The lowrank encode's last steps for fp32 contiguous P (n, r), Q (m, r), q_old (m, r) and
    a payload dtype of fp16 or bf16: a column of Q that is all zeros takes q_old's (Q updated in
    place); returns (P, Q in `dtype`, and those values again in fp32), in two launches."""
    n, r = p.shape
    m = q.shape[0]
    pd = [torch.empty(t.shape, dtype=dtype, device=p.device) for t in (p, q)]
    ps = [torch.empty(t.shape, dtype=torch.float32, device=p.device) for t in (p, q)]
    if n * r == 0 or m * r == 0:
        return pd[0], pd[1], ps[0], ps[1]
    nqb, npb = cdiv(m, FINISH_ROWS), cdiv(n, FINISH_ROWS)
    rp = next_pow2(r)
    sq = torch.empty(nqb * rp, dtype=torch.float32, device=p.device)
    kind = OUT_KIND[dtype]
    views = [t.view(torch.int16) if kind == 2 else t for t in pd]
    for phase, grid in ((0, nqb + npb), (1, nqb)):
        _finish_kernel[(grid,)](p, q, q_old, sq, views[0], ps[0], views[1], ps[1], n, m, r, nqb,
                                PHASE=phase, OUT=kind, RP=rp, BR=FINISH_ROWS,
                                NQBP=next_pow2(nqb), **LAUNCH)
    return pd[0], pd[1], ps[0], ps[1]


def orthogonalize_(p: torch.Tensor, eps: float = 1e-8, passes: int = 2) -> torch.Tensor:
    """lowrank.orthogonalize_ for a 2-D fp32 contiguous p (n, r), in place; returns p."""
    if p.dim() != 2 or p.dtype != torch.float32 or not p.is_contiguous():
        raise ValueError(f"orthogonalize_ kernel takes a contiguous fp32 (n, r) matrix, got "
                         f"{p.dtype} {tuple(p.shape)}")
    n, r = p.shape
    if n == 0 or r == 0:
        return p
    L = group_sums.gram_schmidt_lanes(n)
    _gram_schmidt_kernel[(1,)](p, n, r, float(eps), passes, BR=L, LOGBR=L.bit_length() - 1,
                               RP=next_pow2(r), num_warps=8 if L >= 256 else 4, **LAUNCH)
    return p


@triton.jit
def _expand_kernel(p_ptr, q_ptr, m_ptr, out_ptr, N, M, R, BN: tl.constexpr, BM: tl.constexpr,
                   OUT: tl.constexpr, SUB: tl.constexpr):
    """out (N, M) = P (N, R) Q (M, R)^T, each element summed over k = 0 .. R-1 in order in fp32
    (group_sums.low_rank_product), stored in the output's dtype; with SUB, out = m - that
    product in fp32 (out may be m)."""
    rn = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)
    rm = tl.program_id(1).to(tl.int64) * BM + tl.arange(0, BM)
    acc = tl.zeros((BN, BM), tl.float32)
    for k in range(R):
        pk = tl.load(p_ptr + rn * R + k, mask=rn < N, other=0.0).to(tl.float32)
        qk = tl.load(q_ptr + rm * R + k, mask=rm < M, other=0.0).to(tl.float32)
        acc = acc + pk[:, None] * qk[None, :]
    at = rn[:, None] * M + rm[None, :]
    ok = (rn < N)[:, None] & (rm < M)[None, :]
    if SUB:
        acc = tl.load(m_ptr + at, mask=ok, other=0.0) - acc
    store_as(out_ptr + at, acc, ok, OUT)


def _expand(p, q, mat, out, kind: int, sub: bool) -> None:
    n, r = p.shape
    _expand_kernel[(cdiv(n, EXPAND_ROWS), cdiv(q.shape[0], EXPAND_COLS))](
        p.contiguous(), q.contiguous(), mat, out, n, q.shape[0], r, BN=EXPAND_ROWS,
        BM=EXPAND_COLS, OUT=kind, SUB=sub, num_warps=8, **LAUNCH)


def low_rank_product(p: torch.Tensor, q: torch.Tensor, shape, dtype) -> torch.Tensor:
    """(P @ Q^T) of P (n, r), Q (m, r) (any float dtype, read as fp32) as a tensor of `shape`
    (n * m values) and `dtype` (fp32, fp16 or bf16), in one launch."""
    out = torch.empty(shape, dtype=dtype, device=p.device)
    if out.numel():
        kind = OUT_KIND[dtype]
        view = out if kind < 2 else out.view(torch.int16)
        _expand(p, q, view, view, kind, sub=False)
    return out


def low_rank_residual(mat: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """mat - P Q^T for an fp32 contiguous mat (n, m), the product as low_rank_product forms it
    in fp32, in one pass; into `out` (may be mat itself) or a new tensor."""
    if out is None:
        out = torch.empty_like(mat)
    if mat.numel():
        _expand(p, q, mat, out, 0, sub=True)
    return out
