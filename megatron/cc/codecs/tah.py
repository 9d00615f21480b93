"""TAH-Quant: tile-wise adaptive Hadamard quantisation of activations (codec "tah").

x of shape (..., C) is read as T tokens of C channels, C zero-padded to nt tiles of t. The
highest-entropy tokens get high_bits, the rest low_bits; outlier tiles get a pivot swap and a
normalised Hadamard transform; every tile is quantised with an fp16 zero and scale.
Payload: ONE uint8 tensor, its length a function of the shape (`_sections`): fp16 scales and
zeros | token map | outlier flags | pivots | high tokens' codes | low tokens' codes.
The algorithm is set out in docs/quantisers.md.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .base import Codec, register
from megatron.cc.numerics.quant import div_rn, pack_bits, packed_nbytes, store_scale, unpack_bits


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Normalised fast Walsh-Hadamard transform over the last dim (a power of two).

    H_t / sqrt(t) is symmetric and orthogonal, so fwht(fwht(x)) == x up to rounding.
    """
    t = x.shape[-1]
    y = x.reshape(-1, t)
    h = 1
    while h < t:
        y = y.view(y.shape[0], t // (2 * h), 2, h)  # pairs (i, i + h) inside blocks of 2h
        a, b = y[:, :, 0], y[:, :, 1]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return y.reshape(x.shape) * (1.0 / math.sqrt(t))


def swap_pivot_(tiles: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    """Swap element `pivots[i]` with element 0 in row i of tiles (F, t), in place."""
    rows = torch.arange(tiles.shape[0], device=tiles.device)
    at_pivot = tiles[rows, pivots].clone()
    tiles[rows, pivots] = tiles[:, 0].clone()
    tiles[:, 0] = at_pivot
    return tiles


def entropy_allocation(x2d: torch.Tensor, high_ratio: float) -> torch.Tensor:
    """(T,) bool: True for the round(high_ratio * T) tokens of highest |x| entropy."""
    return _allocate(x2d.abs().float(), high_ratio)[0]


def _allocate(a: torch.Tensor, high_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(high mask, token order) from |x| (T, C): order lists the K high tokens first, then the
    others, each in index order (fixed sizes: no host sync to split them). Zero padding of C
    does not change the result."""
    s = a.sum(dim=-1)
    # H = -sum (a/s) log(a/s) = log s - sum(a log a) / s; 0 log 0 = 0; an all-zero token has H = 0
    a_log_a = torch.linalg.vecdot(a, a.clamp_min(torch.finfo(torch.float32).tiny).log_())
    entropy = torch.where(s > 0, s.log() - a_log_a / s, torch.zeros_like(s))
    return rank_tokens(entropy, high_ratio)


def rank_tokens(entropy: torch.Tensor, high_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(high mask, token order) of the round(high_ratio * T) tokens of highest entropy (ties:
    lower index)."""
    k = int(math.floor(high_ratio * entropy.shape[0] + 0.5))
    order = torch.sort(entropy, descending=True, stable=True).indices
    # index_fill_ takes the value as a kernel argument; `high[idx] = True` copies a host
    # scalar to the GPU first (a host sync on CUDA)
    high = torch.zeros(entropy.shape[0], dtype=torch.bool, device=entropy.device).index_fill_(
        0, order[:k], True)
    return high, _split_order(high)


def _split_order(high: torch.Tensor) -> torch.Tensor:
    """Indices of the True entries in index order, then of the False ones (a stable sort)."""
    return torch.sort(high.to(torch.uint8), descending=True, stable=True).indices


class TahParts(NamedTuple):
    """Everything a TAH payload carries, unpacked (see the module docstring)."""
    high: torch.Tensor    # (T,) bool, token uses high_bits
    flags: torch.Tensor   # (T, nt) bool, outlier tile (pivot swap + Hadamard)
    pivots: torch.Tensor  # (T, nt) int64, position of the tile max (0 when not flagged)
    scales: torch.Tensor  # (T, nt) fp16
    zeros: torch.Tensor   # (T, nt) fp16
    codes: torch.Tensor   # (T, Cp) uint8


@register("tah")
class TahCodec(Codec):
    """TAH-Quant forward codec.

    Args:
        tile_size: t, a power of two in 2..256 (--tile-size, default 64).
        high_bits / low_bits: bits of high / low precision tokens (4 / 3).
        high_ratio: share of tokens that get high_bits (0.8).
        outlier_factor: max >= factor * second max flags an outlier tile (2.0; must be > 1).
    """

    name = "tah"

    def __init__(self, tile_size: int = 64, high_bits: int = 4, low_bits: int = 3,
                 high_ratio: float = 0.8, outlier_factor: float = 2.0):
        if tile_size < 2 or tile_size > 256 or tile_size & (tile_size - 1):
            raise ValueError(f"tile_size must be a power of two in 2..256, got {tile_size}")
        for n, b in (("high_bits", high_bits), ("low_bits", low_bits)):
            if not 1 <= b <= 8:
                raise ValueError(f"{n} must be in 1..8, got {b}")
        if not 0.0 <= high_ratio <= 1.0:
            raise ValueError(f"high_ratio must be in [0, 1], got {high_ratio}")
        if not outlier_factor > 1.0:
            raise ValueError(f"outlier_factor must be > 1, got {outlier_factor}")
        self.t, self.high_bits, self.low_bits = tile_size, high_bits, low_bits
        self.high_ratio, self.outlier_factor = high_ratio, outlier_factor
        self.pivot_bits = tile_size.bit_length() - 1

    # ------------------------------------------------------------------------- layout
    def _dims(self, shape) -> tuple[int, int, int, int, int]:
        """(T, C, Cp, nt, K) for an input shape."""
        shape = tuple(shape)
        c = shape[-1]
        tokens = math.prod(shape[:-1])
        nt = -(-c // self.t)
        k = int(math.floor(self.high_ratio * tokens + 0.5))
        return tokens, c, nt * self.t, nt, k

    def _sections(self, shape) -> list[int]:
        T, _, cp, nt, k = self._dims(shape)
        return [4 * T * nt, packed_nbytes(T, 1), packed_nbytes(T * nt, 1),
                packed_nbytes(T * nt, self.pivot_bits),
                packed_nbytes(k * cp, self.high_bits),
                packed_nbytes((T - k) * cp, self.low_bits)]

    def nbytes(self, shape) -> int:
        return sum(self._sections(shape))

    def payload_spec(self, shape, dtype):
        return [((self.nbytes(shape),), torch.uint8)]

    # ------------------------------------------------------------------------- encode
    def _tiles(self, x: torch.Tensor) -> torch.Tensor:
        T, c, cp, nt, _ = self._dims(x.shape)
        X = torch.zeros(T, cp, device=x.device)  # a fresh fp32 copy: the input is never modified
        X[:, :c] = x.reshape(T, c)
        return X.view(T, nt, self.t)

    def outliers(self, tiles: torch.Tensor, a: torch.Tensor | None = None):
        """(flags, pivots) of tiles (T, nt, t); `a` = tiles.abs() if already computed."""
        a = tiles.abs() if a is None else a
        first = a.amax(dim=-1)
        # max >= factor * second max  <=>  only the max itself exceeds max / factor (factor > 1)
        above = (a > div_rn(first, self.outlier_factor)[..., None]).sum(dim=-1)
        flags = (above == 1) & (first > 0)
        pivots = torch.where(flags, a.argmax(dim=-1), 0)
        return flags, pivots

    def analyze(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The encoder's decisions for x: (high (T,), flags (T, nt), pivots (T, nt))."""
        high, _, flags, pivots = self._decide(self._tiles(x))
        return high, flags, pivots

    def _decide(self, tiles: torch.Tensor):
        """(high, token order, flags, pivots)."""
        a = tiles.abs()
        return (*self.allocate(a.view(tiles.shape[0], -1)), *self.outliers(tiles, a))

    def allocate(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(high, token order) of the (T, C) magnitudes `a` (module function _allocate)."""
        return _allocate(a, self.high_ratio)

    def rank(self, entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(high, token order) from the tokens' entropies (allocate's second half)."""
        return rank_tokens(entropy, self.high_ratio)

    def encode(self, x, ctx=None):
        from megatron.cc.kernels import dispatch
        if dispatch.enabled(x):  # CUDA: the tile transform and packing as Triton kernels
            from megatron.cc.kernels import tah as fused_tah
            return fused_tah.encode(self, x)
        T, c, cp, nt, k = self._dims(x.shape)
        tiles = self._tiles(x)  # (T, nt, t) fp32, our own copy: transformed in place below
        high, order, flags, pivots = self._decide(tiles)
        tiles = _transform_flagged(tiles, flags, pivots)
        lo, hi = tiles.amin(dim=-1), tiles.amax(dim=-1)
        zeros = _round_down16(lo)
        levels = torch.where(high, 2.0 ** self.high_bits - 1, 2.0 ** self.low_bits - 1)[:, None]
        scales = store_scale((hi - zeros.float()).clamp_min(0) / levels, torch.float16)
        step = scales.float()
        step = torch.where(step > 0, step, torch.ones_like(step))
        v = tiles.sub_(zeros.float()[..., None]).div_(step[..., None]).round_().clamp_(min=0)
        torch.minimum(v, levels[..., None], out=v)
        codes = v.to(torch.uint8).view(T, cp)
        parts = [scales.reshape(-1).view(torch.uint8), zeros.reshape(-1).view(torch.uint8),
                 pack_bits(high, 1), pack_bits(flags, 1), pack_bits(pivots, self.pivot_bits),
                 pack_bits(codes[order[:k]], self.high_bits),
                 pack_bits(codes[order[k:]], self.low_bits)]
        return [torch.cat(parts)]

    # ------------------------------------------------------------------------- decode
    def parse(self, payload: list[torch.Tensor], shape, check: bool = True) -> TahParts:
        """Unpack a payload into its parts (the inverse of encode's packing).

        check: verify the token map marks exactly K high tokens (a host sync; decode skips it).
        """
        T, _, cp, nt, k = self._dims(shape)
        stream = payload[0].reshape(-1)
        if stream.numel() != self.nbytes(shape):
            raise ValueError(f"tah payload has {stream.numel()} bytes, shape {tuple(shape)} "
                             f"needs {self.nbytes(shape)}")
        sec = iter(torch.split(stream, self._sections(shape)))
        sz = next(sec).contiguous().view(torch.float16).view(2, T, nt)
        high = unpack_bits(next(sec), 1, T).bool()
        if check and int(high.sum()) != k:
            raise ValueError(f"tah payload marks {int(high.sum())} high tokens, expected {k}")
        flags = unpack_bits(next(sec), 1, T * nt).bool().view(T, nt)
        pivots = unpack_bits(next(sec), self.pivot_bits, T * nt).long().view(T, nt)
        order = _split_order(high)
        codes = torch.empty(T, cp, dtype=torch.uint8, device=stream.device)
        codes[order[:k]] = unpack_bits(next(sec), self.high_bits, k * cp).view(k, cp)
        codes[order[k:]] = unpack_bits(next(sec), self.low_bits, (T - k) * cp).view(T - k, cp)
        return TahParts(high, flags, pivots, sz[0], sz[1], codes)

    def decode(self, payload, shape, dtype, ctx=None):
        from megatron.cc.kernels import dispatch
        if dispatch.enabled(payload[0]):
            from megatron.cc.kernels import tah as fused_tah
            return fused_tah.decode(self, payload, shape, dtype)
        T, c, cp, nt, _ = self._dims(shape)
        p = self.parse(payload, shape, check=False)
        tiles = p.codes.view(T, nt, self.t).float() * p.scales.float()[..., None]
        tiles += p.zeros.float()[..., None]
        inverse = swap_pivot_(fwht(tiles).view(-1, self.t), p.pivots.reshape(-1))
        tiles = torch.where(p.flags[..., None], inverse.view(tiles.shape), tiles)
        return tiles.view(T, cp)[:, :c].reshape(shape).to(dtype)


def _round_down16(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> fp16 rounding toward -inf (saturating), so zero <= the tile min."""
    fmax = torch.finfo(torch.float16).max
    q = v.clamp(-fmax, fmax).to(torch.float16)
    high = (q.float() > v) & (q > -fmax)  # below -fmax: saturate (clip) rather than -inf
    return torch.where(high, torch.nextafter(q, torch.full_like(q, -math.inf)), q)


def _transform_flagged(tiles: torch.Tensor, flags: torch.Tensor, pivots: torch.Tensor):
    """Pivot swap + Hadamard on the flagged tiles of (T, nt, t): every tile is transformed and a
    select keeps the flagged ones, since gathering only those would need their count on the host."""
    t = tiles.shape[-1]
    moved = fwht(swap_pivot_(tiles.reshape(-1, t).clone(), pivots.reshape(-1)))
    return torch.where(flags[..., None], moved.view(tiles.shape), tiles)
