"""n-bit packing and symmetric fixpoint quantisation: the quantiser behind AC-SGD fixpoint,
CocktailSGD values and TAH-Quant backward tiles.

n-bit codes (n in 1..8) are packed into one little-endian bit stream, padded to a whole byte:
packed_nbytes(numel, n) = ceil(numel * n / 8). `quantize` maps x of shape (..., C) to codes and
one 16-bit scale per group (`granularity`: "tensor", "channel", "bucket" of k or "tile" of t)
on the grid of `scheme` ("fitted", "absmax" or "seed"). The grids and the format are set out
in docs/quantisers.md; the fixpoint codec (fixpoint.py) sends these codes and scales.
"""
from __future__ import annotations

import math

import torch

GRANULARITIES = ("tensor", "channel", "bucket", "tile")


# ---------------------------------------------------------------------------- bit packing
def packed_nbytes(numel: int, bits: int) -> int:
    """Bytes that `numel` codes of `bits` bits take once packed: ceil(numel * bits / 8)."""
    return (numel * bits + 7) // 8


def check_bits(bits: int) -> None:
    if not (isinstance(bits, int) and 1 <= bits <= 8):
        raise ValueError(f"bits must be an int in 1..8, got {bits!r}")


def _overlaps(bits: int) -> list[tuple[int, int, int]]:
    """(code j, byte k, shift) for every code of an 8-code group that touches byte k of the
    group's `bits` bytes; shift = 8k - bits*j (code bit i sits at byte bit i - shift)."""
    return [(j, k, 8 * k - bits * j) for j in range(8) for k in range(bits)
            if bits * j < 8 * k + 8 and 8 * k < bits * j + bits]


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes (each < 2**bits, any shape) into a 1-D uint8 bit stream."""
    check_bits(bits)
    c = codes.reshape(-1).to(torch.uint8)
    n = c.numel()
    if bits == 8:
        return c.clone()
    groups = -(-n // 8)  # 8 codes of b bits fill exactly b bytes
    if groups * 8 != n:
        c = torch.cat([c, c.new_zeros(groups * 8 - n)])
    c = c.view(groups, 8)
    cols: list[torch.Tensor | None] = [None] * bits
    for j, k, s in _overlaps(bits):  # all in uint8: bits shifted past 8 fall off
        part = c[:, j] >> s if s >= 0 else c[:, j] << -s
        cols[k] = part if cols[k] is None else cols[k].bitwise_or_(part)
    return torch.stack(cols, dim=1).reshape(-1)[:packed_nbytes(n, bits)]


def unpack_bits(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of `pack_bits`: the first `numel` codes as a 1-D uint8 tensor."""
    check_bits(bits)
    p = packed.reshape(-1)
    if p.numel() != packed_nbytes(numel, bits):
        raise ValueError(f"{p.numel()} packed bytes, expected ceil({numel}*{bits}/8)")
    if bits == 8:
        return p.clone()
    groups = -(-numel // 8)
    if groups * bits != p.numel():
        p = torch.cat([p, p.new_zeros(groups * bits - p.numel())])
    p = p.view(groups, bits)
    cols: list[torch.Tensor | None] = [None] * 8
    for j, k, s in _overlaps(bits):
        part = p[:, k] << s if s >= 0 else p[:, k] >> -s
        cols[j] = part if cols[j] is None else cols[j].bitwise_or_(part)
    out = torch.stack(cols, dim=1)
    out &= (1 << bits) - 1
    return out.reshape(-1)[:numel]


# ------------------------------------------------------------------------------- groups
def num_scales(shape, granularity: str, group_size: int = 128) -> int:
    """How many scales a tensor of `shape` needs; depends on the shape only."""
    shape = tuple(shape)
    numel = math.prod(shape)
    if granularity == "tensor":
        return 1
    if granularity == "channel":
        return shape[-1] if shape else 1
    if granularity == "bucket":
        return -(-numel // group_size)
    if granularity == "tile":
        c = shape[-1] if shape else 1
        return (numel // max(c, 1)) * -(-c // group_size)
    raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")


def _to_groups(t: torch.Tensor, granularity: str, g: int) -> tuple[torch.Tensor, int]:
    """View (zero-padded copy where needed) of t in which reducing dim `red` gives one value
    per group, in scale order."""
    c = t.shape[-1] if t.dim() else 1
    if granularity == "tensor":
        return t.reshape(1, -1), 1
    if granularity == "channel":
        return t.reshape(-1, c), 0
    if granularity == "bucket":
        flat = t.reshape(-1)
        pad = -flat.numel() % g
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad)])
        return flat.view(-1, g), 1
    rows = t.reshape(-1, c)
    pad = -c % g
    if pad:
        rows = torch.cat([rows, rows.new_zeros(rows.shape[0], pad)], dim=1)
    return rows.view(rows.shape[0], -1, g), 2


def _from_groups(tg: torch.Tensor, granularity: str, shape) -> torch.Tensor:
    """Undo `_to_groups`: drop the padding, return a tensor of `shape`."""
    shape = tuple(shape)
    numel = math.prod(shape)
    if granularity == "bucket":
        return tg.reshape(-1)[:numel].reshape(shape)
    if granularity == "tile":
        c = shape[-1] if shape else 1
        return tg.reshape(tg.shape[0], -1)[:, :c].reshape(shape)
    return tg.reshape(shape)


def div_rn(t: torch.Tensor, d) -> torch.Tensor:
    """t / d correctly rounded on every device: CUDA computes tensor / Python number as t * (1 / d),
    which can be one ulp off. A tensor divisor keeps the division."""
    return t / (d if torch.is_tensor(d) else torch.full_like(t, d))


def store_scale(s: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """Round non-negative fp32 scales UP to `scale_dtype` (saturating at its max), so the
    stored scale never under-covers the data it was taken from."""
    s = s.clamp(max=torch.finfo(scale_dtype).max)
    q = s.to(scale_dtype)
    # Unconditional select: asking "any rounded down?" first would sync the host per message.
    return torch.where(q.float() < s, torch.nextafter(q, torch.full_like(q, math.inf)), q)


SCHEMES = ("fitted", "absmax", "seed")
# Clipping ratios of max|x| tried by "fitted" on the mid-rise grid (heavy tails want small
# ratios; near the optimum the error is flat, so a coarse ladder and least-squares refits
# suffice), and on the mid-tread grid, which wins only at high bits where little is clipped.
_FIT_RATIOS = (1.0, 0.97, 0.93, 0.88, 0.82, 0.75, 0.67, 0.58, 0.48, 0.38, 0.28, 0.18, 0.1)
_TREAD_RATIOS = (1.0, 0.98)
_FIT_REFITS = 3


def check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"quantisation scheme must be one of {SCHEMES}, got {scheme!r}")


def _grid_params(bits: int, midtread: bool) -> tuple[float, float]:
    if midtread and bits > 1:
        half = float(1 << (bits - 1))
        return half, half            # mid-tread: codes -2^(b-1) .. 2^(b-1)-1 around c0
    half_span = ((1 << bits) - 1) / 2
    return half_span, half_span      # mid-rise: outermost level = scale


def grid(bits: int, scheme: str = "fitted") -> tuple[float, float]:
    """(c0, lps) of the scheme's grid: x_hat = (code - c0) * step, step = |scale| / lps.
    "fitted" groups whose stored scale is negative use the mid-tread grid instead
    (`group_grid`)."""
    return _grid_params(bits, scheme == "seed")


def group_grid(scales: torch.Tensor, bits: int, scheme: str = "fitted"):
    """(c0, lps) per group, fp32 tensors shaped like `scales` ("fitted": the sign bit of the
    stored scale picks mid-tread), or floats where the scheme has one grid."""
    if scheme != "fitted" or bits == 1:
        return grid(bits, scheme)
    rise, tread = _grid_params(bits, False), _grid_params(bits, True)
    neg = scales < 0
    c0 = torch.where(neg, tread[0], rise[0]).float()
    return c0, c0   # c0 == lps on both grids (read only)


def quant_step(scales: torch.Tensor, bits: int, scheme: str = "fitted") -> torch.Tensor:
    """Quantisation step (fp32) for each stored scale."""
    return div_rn(scales.float().abs(), group_grid(scales, bits, scheme)[1])


def quantize(x: torch.Tensor, bits: int, granularity: str = "channel", group_size: int = 128,
             scale_dtype: torch.dtype = torch.float16,
             generator: torch.Generator | None = None,
             scheme: str = "fitted") -> tuple[torch.Tensor, torch.Tensor]:
    """Fixpoint quantisation with every one of the 2^bits codes.

    Returns (codes, scales): codes uint8 of x's shape with values in [0, 2**bits - 1],
    scales (num_scales,) in scale_dtype. A generator switches on stochastic rounding.
    """
    check_bits(bits)
    check_scheme(scheme)
    scales = group_scales(x, bits, granularity, group_size, scale_dtype,
                          "absmax" if generator is not None else scheme)
    codes = quantize_with_scales(x, scales, bits, granularity, group_size, generator, scheme)
    return codes, scales


def group_scales(x: torch.Tensor, bits: int, granularity: str, group_size: int = 128,
                 scale_dtype: torch.dtype = torch.float16,
                 scheme: str = "fitted") -> torch.Tensor:
    """The stored scale S of every group, (num_scales,) in scale_dtype."""
    if scheme == "absmax" or (scheme == "seed" and bits > 1):
        return store_scale(group_absmax(x, granularity, group_size), scale_dtype)
    xg, red = _to_groups(x.float(), granularity, group_size)
    valid = None  # zero padding of the last bucket / tile must not steer the scale
    count = xg.shape[red]
    if xg.numel() != x.numel():
        valid = _to_groups(torch.ones_like(x, dtype=torch.float32), granularity, group_size)[0]
        count = valid.sum(dim=red).clamp_min_(1)
    if scheme == "seed":  # 1 bit: sign x RMS
        return store_scale(div_rn(xg.square().sum(dim=red), count).sqrt().reshape(-1),
                           scale_dtype)
    if bits == 1:         # sign x mean|x|: the least-squares optimum of a sign quantiser
        return store_scale(div_rn(xg.abs().sum(dim=red), count).reshape(-1), scale_dtype)
    return _fit_scales(xg, red, bits, scale_dtype, valid)


def _fit_scales(xg: torch.Tensor, red: int, bits: int, scale_dtype,
                valid: torch.Tensor | None = None) -> torch.Tensor:
    """Per-group S minimising sum (x - x_hat)^2 over the entries where `valid` is 1, on the mid-rise
    and the mid-tread grid; a mid-tread winner is stored negated. Compared with a select, never a
    host read."""
    qmax = (1 << bits) - 1
    amax = torch.maximum(xg.amin(dim=red, keepdim=True).neg(), xg.amax(dim=red, keepdim=True))
    best_s = best_err = None
    for midtread in (False, True):
        c0, lps = _grid_params(bits, midtread)

        def err_and_codes(s_stored):
            step = div_rn(s_stored.float(), lps)
            step = torch.where(step > 0, step, torch.ones_like(step))
            k = (xg / step + c0).round_().clamp_(0, qmax).sub_(c0)   # signed level index
            if valid is not None:
                k.mul_(valid)  # padding: level index 0, so it adds nothing to the fit
            return (xg - k * step).square_().sum(dim=red, keepdim=True), k

        grid_s = store_scale(amax, scale_dtype)
        grid_err, grid_k = err_and_codes(grid_s)

        def keep_better(s):
            nonlocal grid_s, grid_err, grid_k
            err, k = err_and_codes(s)
            better = err < grid_err
            grid_s, grid_err = torch.where(better, s, grid_s), torch.where(better, err, grid_err)
            grid_k = torch.where(better, k, grid_k)

        for ratio in (_TREAD_RATIOS if midtread else _FIT_RATIOS)[1:]:
            keep_better(store_scale(amax * ratio, scale_dtype))
        for _ in range(_FIT_REFITS):  # least-squares step for the codes chosen so far
            num = (xg * grid_k).sum(dim=red, keepdim=True)
            den = grid_k.square().sum(dim=red, keepdim=True)
            step = torch.where(den > 0, num / den.clamp_min(1e-30), torch.zeros_like(num))
            keep_better(store_scale(step.clamp_min(0) * lps, scale_dtype))
        if best_s is None:
            best_s, best_err = grid_s, grid_err
        else:  # strictly better only: ties keep the symmetric grid
            better = grid_err < best_err
            best_s = torch.where(better, grid_s.neg(), best_s)
    return best_s.reshape(-1)


def group_absmax(x: torch.Tensor, granularity: str, group_size: int = 128) -> torch.Tensor:
    """max |x| of every group, fp32, flat (num_scales,)."""
    xg, red = _to_groups(x.float(), granularity, group_size)
    # max|x| = max(-min, max): no |x| temporary (and amin/amax beat aminmax on CPU)
    return torch.maximum(xg.amin(dim=red).neg_(), xg.amax(dim=red)).reshape(-1)


def quantize_with_scales(x: torch.Tensor, scales: torch.Tensor, bits: int, granularity: str,
                         group_size: int = 128,
                         generator: torch.Generator | None = None,
                         scheme: str = "fitted") -> torch.Tensor:
    """uint8 codes of x (its shape) on the grid of the stored `scales`."""
    xg, red = _to_groups(x.float(), granularity, group_size)
    step = quant_step(scales, bits, scheme).view(_scale_view(xg, red))
    step = torch.where(step > 0, step, torch.ones_like(step))
    c0 = group_grid(scales, bits, scheme)[0]
    v = xg / step
    v += c0 if isinstance(c0, float) else c0.view(_scale_view(xg, red))
    if generator is None:
        v.round_()
    else:
        v += torch.rand(v.shape, generator=generator, device=generator.device).to(v.device)
        v.floor_()
    v.clamp_(0, (1 << bits) - 1)
    return _from_groups(v.to(torch.uint8), granularity, x.shape)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, bits: int, shape,
               granularity: str = "channel", group_size: int = 128,
               dtype: torch.dtype = torch.float32, scheme: str = "fitted") -> torch.Tensor:
    """x_hat = (code - c0) * step, as a tensor of `shape` and `dtype` (math in fp32)."""
    c0 = group_grid(scales, bits, scheme)[0]
    vg, red = _to_groups(codes.reshape(shape).float(), granularity, group_size)
    vg -= c0 if isinstance(c0, float) else c0.view(_scale_view(vg, red))
    vg.mul_(quant_step(scales, bits, scheme).view(_scale_view(vg, red)))  # our own buffer
    return _from_groups(vg, granularity, shape).to(dtype)


def _scale_view(vg: torch.Tensor, red: int) -> list[int]:
    """Broadcast shape of the flat scales against a grouped tensor reduced over `red`."""
    shape = list(vg.shape)
    shape[red] = 1
    return shape
