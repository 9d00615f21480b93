"""TAH-Quant codec (codecs/tah.py) on kernels: the tile transform and the payload packing.

encode: _entropy_kernel computes every token's entropy in one pass over the message (their
order, which picks the high-precision tokens, is sorted eagerly), _split_kernel writes the token
map, packs it and orders the tokens high first (one program); _tiles_kernel reads the message itself
and does each tile's outlier test, pivot swap + Hadamard, fp16 zero and scale, codes and
flag / pivot bits, and _pack_rows_kernel packs the high and the low tokens' codes.
decode: _ranks_kernel turns the token map into each token's row among its kind (one program);
_decode_kernel reads each tile's flag, pivot and codes, dequantises and inverts the transform.
Payload bytes and decodes are bit-identical to TahCodec's.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .dispatch import LAUNCH, OUT_KIND, cdiv, next_pow2
from .primitives import (fwht, half_value, pack_groups, round_down_half_bits,
                         round_half_even, store_as, store_scale_bits)

TILE_BLOCK = 2048     # values per program (a multiple of 8 tiles: flag / pivot bytes are whole)
CODE_BLOCK = 256      # 8-code groups per program in the row packer
RANK_CHUNK = 1024     # tokens per step of the token-map scan
SPLIT_CHUNK = 1024    # tokens per step of the encode's split (a multiple of 8: whole bytes)


@triton.jit
def _codes(y, zero, step, levels):
    """round((y - zero) / step), at least 0, at most the token's top level."""
    v = round_half_even(tl.math.div_rn(y - zero[:, None], step[:, None]))
    return tl.minimum(tl.maximum(v, 0.0), levels[:, None])


@triton.jit
def _entropy_kernel(x_ptr, out_ptr, C, TINY, BLOCK: tl.constexpr):
    """Entropy of |x| over one token's C values (tah._allocate's formula), in fp32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    s = tl.zeros((BLOCK,), tl.float32)
    alog = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, C, BLOCK):
        c = start + cols
        a = tl.abs(tl.load(x_ptr + row * C + c, mask=c < C, other=0.0).to(tl.float32))
        s += a
        alog += a * tl.log(tl.maximum(a, TINY))
    total = tl.sum(s, axis=0)
    h = tl.log(total) - tl.math.div_rn(tl.sum(alog, axis=0), total)
    tl.store(out_ptr + row, tl.where(total > 0, h, 0.0))


@triton.jit
def _split_kernel(rank_ptr, high_ptr, bits_ptr, order_ptr, T, K, NBYTES, CH: tl.constexpr):
    """The token map (uint8: 1 at the tokens rank[:K], the K of highest entropy), its 1-bit
    packing, and the split order (the high tokens in index order, then the low ones:
    tah._split_order), in one program."""
    for c in range(tl.cdiv(T, CH)):
        i = c * CH + tl.arange(0, CH)
        tl.store(high_ptr + i, tl.zeros((CH,), tl.uint8), mask=i < T)
    tl.debug_barrier()                                # the zeros before the ones
    for c in range(tl.cdiv(K, CH)):
        j = c * CH + tl.arange(0, CH)
        tok = tl.load(rank_ptr + j, mask=j < K, other=0)
        tl.store(high_ptr + tok, tl.full((CH,), 1, tl.uint8), mask=j < K)
    tl.debug_barrier()                                # the whole map before it is read
    before = tl.zeros((), tl.int32)                   # high tokens before this chunk
    for c in range(tl.cdiv(T, CH)):
        i = c * CH + tl.arange(0, CH)
        m = i < T
        h = tl.load(high_ptr + i, mask=m, other=0).to(tl.int32)
        run = before + tl.cumsum(h, axis=0) - h       # high tokens before token i
        tl.store(order_ptr + tl.where(h == 1, run, K + i - run), i.to(tl.int64), mask=m)
        byte = tl.sum(tl.reshape(h, (CH // 8, 8)) << tl.arange(0, 8)[None, :], axis=1)
        b = c * (CH // 8) + tl.arange(0, CH // 8)
        tl.store(bits_ptr + b, byte.to(tl.uint8), mask=b < NBYTES)
        before += tl.sum(h, axis=0)


@triton.jit
def _tiles_kernel(x_ptr, high_ptr, codes_ptr, sz_ptr, flag_ptr, piv_ptr, NTILES, NT, C,
                  FACTOR, INV_SQRT, HIGH_LEVELS, LOW_LEVELS, FLAG_BYTES, PIV_BYTES,
                  T: tl.constexpr, LOGT: tl.constexpr, PB: tl.constexpr, PBP: tl.constexpr,
                  TB: tl.constexpr):
    f = tl.program_id(0).to(tl.int64) * TB + tl.arange(0, TB)     # tiles, (token, tile j)
    fm = f < NTILES
    e = tl.arange(0, T)
    # the message itself, (tokens, C) in its dtype; columns past C are the zero padding
    cols = (f % NT)[:, None] * T + e[None, :]
    x = tl.load(x_ptr + (f // NT)[:, None] * C + cols, mask=fm[:, None] & (cols < C),
                other=0.0).to(tl.float32)
    a = tl.abs(x)
    first = tl.max(a, axis=1)
    above = tl.sum((a > tl.math.div_rn(first, FACTOR)[:, None]).to(tl.int32), axis=1)
    flag = (above == 1) & (first > 0) & fm
    piv = tl.where(flag, tl.argmax(a, axis=1, tie_break_left=True), 0)
    # pivot swap (max with -inf: exact, signed zeros kept), then Hadamard; flagged tiles only
    x0 = tl.max(tl.where(e[None, :] == 0, x, -float("inf")), axis=1)
    xp = tl.max(tl.where(e[None, :] == piv[:, None], x, -float("inf")), axis=1)
    moved = tl.where(e[None, :] == 0, xp[:, None], tl.where(e[None, :] == piv[:, None],
                                                             x0[:, None], x))
    y = tl.where(flag[:, None], fwht(moved, TB, T, LOGT) * INV_SQRT, x)
    # asymmetric quantisation: zero rounded down, scale rounded up (fp16)
    zero_bits = round_down_half_bits(tl.min(y, axis=1))
    zero = half_value(zero_bits)
    high = tl.load(high_ptr + f // NT, mask=fm, other=0)
    levels = tl.where(high != 0, HIGH_LEVELS, LOW_LEVELS)
    span = tl.max(y, axis=1) - zero
    scale_bits = store_scale_bits(tl.math.div_rn(tl.where(span < 0, 0.0, span), levels), False)
    scale = half_value(scale_bits)
    step = tl.where(scale > 0, scale, 1.0)
    v = _codes(y, zero, step, levels)
    tl.store(codes_ptr + f[:, None] * T + e[None, :], v.to(tl.uint8), mask=fm[:, None])
    tl.store(sz_ptr + f, scale_bits.to(tl.int16), mask=fm)
    tl.store(sz_ptr + NTILES + f, zero_bits.to(tl.int16), mask=fm)
    # flag and pivot bits of these TB tiles: whole bytes (TB is a multiple of 8)
    g = tl.program_id(0).to(tl.int64) * (TB // 8) + tl.arange(0, TB // 8)
    fb = pack_groups(tl.reshape(flag.to(tl.int32), (TB // 8, 8)), 1, 1)
    tl.store(flag_ptr + g[:, None] + tl.arange(0, 1)[None, :], fb, mask=g[:, None] < FLAG_BYTES)
    kp = tl.arange(0, PBP)
    pa = g[:, None] * PB + kp[None, :]
    tl.store(piv_ptr + pa, pack_groups(tl.reshape(piv, (TB // 8, 8)), PB, PBP),
             mask=(kp[None, :] < PB) & (pa < PIV_BYTES))


@triton.jit
def _pack_rows_kernel(codes_ptr, order_ptr, out_ptr, START, N, CP, NBYTES,
                      BITS: tl.constexpr, BP: tl.constexpr, BLOCK: tl.constexpr):
    """pack_bits(codes[order[START:START + N // CP]], BITS) into out."""
    grp = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    i = grp[:, None] * 8 + tl.arange(0, 8)[None, :]
    m = i < N
    row = tl.load(order_ptr + START + i // CP, mask=m, other=0)
    code = tl.load(codes_ptr + row * CP + i % CP, mask=m, other=0)
    k = tl.arange(0, BP)
    addr = grp[:, None] * BITS + k[None, :]
    tl.store(out_ptr + addr, pack_groups(code, BITS, BP),
             mask=(k[None, :] < BITS) & (addr < NBYTES))


@triton.jit
def _read_bits(p_ptr, o, width, NBYTES):
    """`width` (<= 8) bits of the little-endian stream at p_ptr, from bit offset o."""
    b0 = tl.load(p_ptr + (o >> 3)).to(tl.int32)
    b1 = tl.load(p_ptr + (o >> 3) + 1, mask=(o >> 3) + 1 < NBYTES, other=0).to(tl.int32)
    return ((b0 | (b1 << 8)) >> (o & 7).to(tl.int32)) & ((1 << width) - 1)


@triton.jit
def _ranks_kernel(p_ptr, high_ptr, rank_ptr, NTOK, CH: tl.constexpr):
    """From the token map's bits at p_ptr: high (uint8) and each token's row among its kind
    (high: the high tokens before it; low: the low ones), in one program."""
    carry = tl.zeros((), tl.int32)
    for c in range(tl.cdiv(NTOK, CH)):
        t = c * CH + tl.arange(0, CH)
        m = t < NTOK
        bit = (tl.load(p_ptr + t // 8, mask=m, other=0).to(tl.int32) >> (t % 8)) & 1
        ones = carry + tl.cumsum(bit, axis=0)      # high tokens up to and including t
        tl.store(high_ptr + t, bit.to(tl.uint8), mask=m)
        tl.store(rank_ptr + t, tl.where(bit == 1, ones - 1, t - ones), mask=m)
        carry += tl.sum(bit, axis=0)


@triton.jit
def _decode_kernel(p_ptr, sz_ptr, high_ptr, rank_ptr, out_ptr, NTILES, NT, C, CP, INV_SQRT,
                   FLAG_OFF, PIV_OFF, HIGH_OFF, LOW_OFF, HIGH_BITS, LOW_BITS, NBYTES,
                   T: tl.constexpr, LOGT: tl.constexpr, PB: tl.constexpr, TB: tl.constexpr,
                   OUT: tl.constexpr):
    f = tl.program_id(0).to(tl.int64) * TB + tl.arange(0, TB)
    fm = f < NTILES
    fs = tl.where(fm, f, 0)                     # masked tiles read tile 0, store nothing
    tok = fs // NT
    e = tl.arange(0, T)
    flag = _read_bits(p_ptr + FLAG_OFF, fs, 1, NBYTES - FLAG_OFF) != 0
    piv = _read_bits(p_ptr + PIV_OFF, fs * PB, PB, NBYTES - PIV_OFF)
    high = tl.load(high_ptr + tok) != 0
    rank = tl.load(rank_ptr + tok).to(tl.int64)
    bits = tl.where(high, HIGH_BITS, LOW_BITS)
    base = tl.where(high, HIGH_OFF, LOW_OFF)
    col = (fs % NT) * T
    o = ((rank * CP + col)[:, None] + e[None, :]) * bits[:, None]
    b0 = tl.load(p_ptr + base[:, None] + (o >> 3)).to(tl.int32)
    nxt = base[:, None] + (o >> 3) + 1
    b1 = tl.load(p_ptr + nxt, mask=nxt < NBYTES, other=0).to(tl.int32)
    code = ((b0 | (b1 << 8)) >> (o & 7).to(tl.int32)) & ((1 << bits[:, None]) - 1)
    scale = half_value(tl.load(sz_ptr + fs))
    zero = half_value(tl.load(sz_ptr + NTILES + fs))
    tile = code.to(tl.float32) * scale[:, None]
    tile = tile + zero[:, None]
    y = fwht(tile, TB, T, LOGT) * INV_SQRT
    y0 = tl.max(tl.where(e[None, :] == 0, y, -float("inf")), axis=1)
    yp = tl.max(tl.where(e[None, :] == piv[:, None], y, -float("inf")), axis=1)
    inv = tl.where(e[None, :] == piv[:, None], y0[:, None], y)
    inv = tl.where(e[None, :] == 0, yp[:, None], inv)
    val = tl.where(flag[:, None], inv, tile)
    cols = col[:, None] + e[None, :]
    dst = out_ptr + tok[:, None] * C + cols
    store_as(dst, val, fm[:, None] & (cols < C), OUT)


def _offsets(codec, shape) -> list[int]:
    """Start byte of every payload section (tah.py's order)."""
    out, at = [], 0
    for n in codec._sections(shape):
        out.append(at)
        at += n
    return out


def entropies(x: torch.Tensor) -> torch.Tensor:
    """(T,) fp32 entropy of every token's |x| (x viewed (T, C)), one pass over x; equal to
    the eager formula's up to summation order and rounding of the logarithms."""
    c = x.shape[-1]
    x2 = x.reshape(-1, c).contiguous()
    out = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    if x2.shape[0]:
        _entropy_kernel[(x2.shape[0],)](x2, out, c, torch.finfo(torch.float32).tiny,
                                        BLOCK=min(1024, next_pow2(c)), **LAUNCH)
    return out


def encode(codec, x: torch.Tensor) -> list[torch.Tensor]:
    """TahCodec.encode(x) on the kernels: the eager payload, byte for byte, for the same token
    allocation; the allocation ranks entropies summed in the kernel's order (`entropies`), so
    tokens whose entropies tie to rounding may swap precision against the eager encode."""
    T, c, cp, nt, k = codec._dims(x.shape)
    X = x.reshape(T, c).contiguous()                  # the tiles kernel pads as it reads
    # tah.rank_tokens: the map as uint8, its packing and the split order by one kernel
    by_entropy = torch.sort(entropies(X), descending=True, stable=True).indices
    high = torch.empty(T, dtype=torch.uint8, device=x.device)
    n = codec.nbytes(x.shape)
    payload = torch.empty(n, dtype=torch.uint8, device=x.device)
    off = _offsets(codec, x.shape)
    order = torch.empty(T, dtype=torch.long, device=x.device)
    if T:
        _split_kernel[(1,)](by_entropy, high, payload[off[1]:], order, T, k, off[2] - off[1],
                            CH=SPLIT_CHUNK, **LAUNCH)
    codes = torch.empty(T, cp, dtype=torch.uint8, device=x.device)
    t, pb = codec.t, codec.pivot_bits
    tb = max(8, TILE_BLOCK // t)
    _tiles_kernel[(cdiv(T * nt, tb),)](
        X, high, codes, payload[:off[1]].view(torch.int16), payload[off[2]:],
        payload[off[3]:], T * nt, nt, c, float(codec.outlier_factor), 1.0 / math.sqrt(t),
        float(2 ** codec.high_bits - 1), float(2 ** codec.low_bits - 1), off[3] - off[2],
        off[4] - off[3], T=t, LOGT=pb, PB=pb, PBP=next_pow2(pb), TB=tb, **LAUNCH)
    for start, rows, bits, at in ((0, k, codec.high_bits, off[4]),
                                  (k, T - k, codec.low_bits, off[5])):
        if rows:
            nb = cdiv(rows * cp * bits, 8)
            _pack_rows_kernel[(cdiv(cdiv(rows * cp, 8), CODE_BLOCK),)](
                codes, order, payload[at:], start, rows * cp, cp, nb, BITS=bits,
                BP=next_pow2(bits), BLOCK=CODE_BLOCK, **LAUNCH)
    return [payload]


def decode(codec, payload, shape, dtype) -> torch.Tensor:
    """TahCodec.decode(payload, shape, dtype) on the kernels: the same tensor, bit for bit."""
    shape = tuple(shape)
    T, c, cp, nt, k = codec._dims(shape)
    stream = payload[0].reshape(-1)
    if stream.numel() != codec.nbytes(shape):
        raise ValueError(f"tah payload has {stream.numel()} bytes, shape {shape} needs "
                         f"{codec.nbytes(shape)}")
    off = _offsets(codec, shape)
    high = torch.empty(T, dtype=torch.uint8, device=stream.device)
    rank = torch.empty(T, dtype=torch.int32, device=stream.device)
    if T:
        _ranks_kernel[(1,)](stream[off[1]:off[2]], high, rank, T, CH=RANK_CHUNK, **LAUNCH)
    out = torch.empty(shape, dtype=dtype, device=stream.device)
    kind = OUT_KIND[dtype]
    t, pb = codec.t, codec.pivot_bits
    tb = max(8, TILE_BLOCK // t)
    _decode_kernel[(cdiv(T * nt, tb),)](
        stream, stream[:off[1]].view(torch.int16), high, rank,
        out if kind < 2 else out.view(torch.int16), T * nt, nt, c, cp, 1.0 / math.sqrt(t),
        off[2], off[3], off[4], off[5], codec.high_bits, codec.low_bits, stream.numel(),
        T=t, LOGT=pb, PB=pb, TB=tb, OUT=kind, **LAUNCH)
    return out
