"""The summation order of the scale kernels, in torch: what their sums are defined to be.

A float sum depends on its order, and torch's order differs between devices, so the kernels'
group sums use fixed orders instead. Runs of consecutive values (tensor, bucket, tile groups;
lowrank's column sums): lane l of L = lanes(layout, g) accumulates positions c L + l from 0.0
(zero padding adds 0.0), then the lanes are added by a balanced tree. Channel groups: rows in
blocks of COL_BLOCK_ROWS, each summed with COL_LANES lanes as above, the block totals (padded
to a power of two) by the tree. `fit_scales` and `mean_scales` are the torch twins the kernels
equal bit for bit; they equal quant.group_scales up to summation order.
"""
from __future__ import annotations

import torch

from megatron.cc.numerics import quant

# channel groups are columns: L rows of a block of adjacent channels, so fewer lanes
LANES_MAX = {"col": 64, "seg": 512}
# channel scales: rows per program (a multiple of COL_LANES) and lanes per block; read at
# call time by the kernels, so a test may shrink the blocks
COL_BLOCK_ROWS = 256
COL_LANES = 8


def layout(granularity: str) -> str:
    """"col": groups are columns of the (rows, C) view (channel); "seg": groups are runs of
    consecutive values (tensor, bucket, tile)."""
    return "col" if granularity == "channel" else "seg"


def lanes(granularity: str, g: int) -> int:
    return min(1 << max(0, (g - 1).bit_length()), LANES_MAX[layout(granularity)])


def sqrt_rn(v: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 square root (the kernels' sqrt_rn): torch's CPU float sqrt is not;
    fp64 then fp32 is (p = 53 >= 2 * 24 + 2, so the double rounding is innocuous)."""
    return v.double().sqrt().float()


def tree_sum(v: torch.Tensor) -> torch.Tensor:
    """(G, N) -> (G,), N a power of two: adjacent pairs, level by level."""
    while v.shape[1] > 1:
        v = v.view(v.shape[0], -1, 2)
        v = v[..., 0] + v[..., 1]
    return v[:, 0]


def lane_sum(v: torch.Tensor, L: int) -> torch.Tensor:
    """Sum of every row of v (G, g) in the kernels' order (module docstring)."""
    G, g = v.shape
    chunks = -(-g // L)
    if chunks * L != g:
        v = torch.cat([v, v.new_zeros(G, chunks * L - g)], dim=1)
    v = v.view(G, chunks, L)
    acc = v.new_zeros(G, L)
    for c in range(chunks):
        acc = acc + v[:, c]
    return tree_sum(acc)


def block_sum(v: torch.Tensor) -> torch.Tensor:
    """Sum of every row of v (G, n) in the channel kernels' order (module docstring)."""
    G, n = v.shape
    L, rb = COL_LANES, COL_BLOCK_ROWS
    nb = max(1, -(-n // rb))
    if nb * rb != n:
        v = torch.cat([v, v.new_zeros(G, nb * rb - n)], dim=1)
    v = v.view(G, nb, rb // L, L)
    acc = v.new_zeros(G, nb, L)
    for c in range(rb // L):
        acc = acc + v[:, :, c]
    totals = tree_sum(acc.reshape(G * nb, L)).view(G, nb)
    nbp = 1 << (nb - 1).bit_length()
    if nbp != nb:
        totals = torch.cat([totals, totals.new_zeros(G, nbp - nb)], dim=1)
    return tree_sum(totals)


def group_sum(v: torch.Tensor, granularity: str) -> torch.Tensor:
    """Sum of every group's row of v (num_scales, g) in the kernels' order."""
    if granularity == "channel":
        return block_sum(v)
    return lane_sum(v, lanes(granularity, v.shape[1]))


def groups(x: torch.Tensor, granularity: str, group_size: int):
    """(values, valid): x.float() as (num_scales, g), one row per group in scale order, and
    the mask of its entries that are not padding."""
    def rows(t):
        tg, red = quant._to_groups(t, granularity, group_size)
        return tg.t() if granularity == "channel" else tg.reshape(-1, tg.shape[red])
    return rows(x.float()), rows(torch.ones_like(x, dtype=torch.float32)) > 0


def mean_scales(x, bits, granularity, group_size, scale_dtype, scheme) -> torch.Tensor:
    """1-bit scales: mean |x| ("fitted") or RMS ("seed") over each group's entries."""
    xg, valid = groups(x, granularity, group_size)
    count = valid.sum(dim=1).float()
    term = xg * xg if scheme == "seed" else xg.abs()
    s = group_sum(torch.where(valid, term, 0.0), granularity) / count
    return quant.store_scale(sqrt_rn(s) if scheme == "seed" else s, scale_dtype)


def fit_scales(x, bits, granularity, group_size, scale_dtype) -> torch.Tensor:
    """quant._fit_scales with the kernels' summation order (bits >= 2): per grid (mid-rise with
    _FIT_RATIOS, then mid-tread with _TREAD_RATIOS) the ladder of
    clipping ratios and the least-squares refits; a mid-tread winner (strictly better) is
    stored negated."""
    xg, valid = groups(x, granularity, group_size)
    qmax = (1 << bits) - 1
    amax = xg.abs().amax(dim=1)

    def total(term):
        return group_sum(torch.where(valid, term, 0.0), granularity)

    best_s = best_err = None
    rise = quant._FIT_RATIOS
    tread = quant._TREAD_RATIOS
    for (c0, lps), ratios in ((quant.grid(bits, "absmax"), rise),
                              (quant.grid(bits, "seed"), tread)):
        def levels(s):
            step = quant.div_rn(s.float(), lps)
            step = torch.where(step > 0, step, torch.ones_like(step))[:, None]
            return (xg / step + c0).round_().clamp_(0, qmax).sub_(c0), step

        def consider(s, grid_s, grid_err):
            k, step = levels(s)
            e = total((xg - k * step).square_())
            if grid_s is None:
                return s, e
            better = e < grid_err
            return torch.where(better, s, grid_s), torch.where(better, e, grid_err)

        grid_s, grid_err = consider(quant.store_scale(amax, scale_dtype), None, None)
        for ratio in ratios[1:]:
            grid_s, grid_err = consider(quant.store_scale(amax * ratio, scale_dtype), grid_s,
                                        grid_err)
        for _ in range(quant._FIT_REFITS):
            k, _ = levels(grid_s)
            num, den = total(xg * k), total(k * k)
            step = torch.where(den > 0, num / den.clamp_min(1e-30), torch.zeros_like(num))
            grid_s, grid_err = consider(quant.store_scale(step.clamp_min(0) * lps, scale_dtype),
                                        grid_s, grid_err)
        if best_s is None:
            best_s, best_err = grid_s, grid_err
        else:   # strictly better only: ties keep the symmetric grid
            best_s = torch.where(grid_err < best_err, grid_s.neg(), best_s)
    return best_s


def group_scales(x, bits, granularity, group_size, scale_dtype, scheme) -> torch.Tensor:
    """quant.group_scales with the kernels' summation order (absmax needs none)."""
    if scheme == "absmax" or (scheme == "seed" and bits > 1):
        return quant.group_scales(x, bits, granularity, group_size, scale_dtype, scheme)
    if bits == 1:
        return mean_scales(x, bits, granularity, group_size, scale_dtype, scheme)
    return fit_scales(x, bits, granularity, group_size, scale_dtype)


def column_sums(v: torch.Tensor, L: int) -> torch.Tensor:
    """Sum over the rows of v (n, r), per column, in the kernels' order: (r,)."""
    return lane_sum(v.t(), L)


# Gram-Schmidt's one program reads this many rows at a time: each of its row sweeps is a
# chain of dependent loads, so the fewer, wider steps the better
GRAM_SCHMIDT_LANES = 512


def gram_schmidt_lanes(n: int) -> int:
    return min(1 << max(0, (n - 1).bit_length()), GRAM_SCHMIDT_LANES)


def orthogonalize_(p: torch.Tensor, eps: float = 1e-8, passes: int = 2) -> torch.Tensor:
    """lowrank.orthogonalize_ (Gram-Schmidt, `passes` passes, relative norm floor) on a 2-D
    fp32 p (n, r), with every sum over the n rows (norms, projections) in the kernels' order
    (gram_schmidt_lanes(n) lanes); the twin of kernels/lowrank.py."""
    n, r = p.shape
    L = gram_schmidt_lanes(n)
    for _ in range(passes):
        scale = sqrt_rn(column_sums(p * p, L)).amax()
        floor = torch.where(scale > 0, eps * scale, torch.full_like(scale, eps))
        for i in range(r):
            col = p[:, i]
            col.div_(torch.maximum(sqrt_rn(column_sums((col * col)[:, None], L))[0], floor))
            if i + 1 < r:
                rest = p[:, i + 1:]
                dots = column_sums(col[:, None] * rest, L)
                rest.sub_(col[:, None] * dots[None, :])
    return p


def low_rank_product(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P (n, r) Q (m, r)^T in fp32 with each element summed over k = 0 .. r-1 in order: the
    lowrank decode kernel's order."""
    acc = torch.zeros(p.shape[0], q.shape[0], dtype=torch.float32, device=p.device)
    for k in range(p.shape[1]):
        acc = acc + p[:, k:k + 1].float() * q[:, k].float()[None, :]
    return acc
