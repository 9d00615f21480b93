"""@triton.jit building blocks shared by the kernel families, each exact in fp32.

Written with plain arithmetic and bit operations only, so that compiled kernels and Triton's
interpreter (which CI runs) compute the same bits: the interpreter has no libdevice (rint), and
its fp32 -> bf16 cast truncates where CUDA rounds to nearest even, so neither is used.
"""
import triton
import triton.language as tl

FP16_MAX = tl.constexpr(65504.0)
BF16_MAX = tl.constexpr(3.3895313892515355e38)   # (2^8 - 1) * 2^120, exact in fp32


@triton.jit
def round_half_even(v):
    """torch.round of fp32 v (nearest, ties to even); +-inf stay."""
    f = tl.floor(v)
    d = v - f                       # exact: f and v share the binade or v is integral
    half = f * 0.5
    odd = tl.floor(half) != half
    up = (d > 0.5) | ((d == 0.5) & odd)
    return tl.where(up, f + 1.0, f)


@triton.jit
def bf16_bits(x):
    """fp32 -> bfloat16 bit pattern (int32 in 0..0xFFFF), round to nearest even like torch."""
    u = x.to(tl.uint32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r.to(tl.int32))


@triton.jit
def store_as(ptr, val, mask, OUT: tl.constexpr):
    """Store fp32 val at ptr as fp32 (OUT 0), fp16 (1) or bf16 bits into an int16 view (2),
    each rounded to nearest even as torch's casts (dispatch.OUT_KIND)."""
    if OUT == 0:
        tl.store(ptr, val, mask=mask)
    elif OUT == 1:
        tl.store(ptr, val.to(tl.float16), mask=mask)
    else:
        tl.store(ptr, bf16_bits(val).to(tl.int16), mask=mask)


@triton.jit
def bf16_value(b):
    """bfloat16 bit pattern (integer, low 16 bits) -> fp32, exact."""
    return ((b.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)


@triton.jit
def half_bits(x):
    """fp32 -> float16 bit pattern (int32 in 0..0xFFFF), round to nearest even."""
    return x.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def half_value(b):
    """float16 bit pattern (integer, low 16 bits) -> fp32, exact."""
    return (b.to(tl.int32) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def scale_value(b, BF16: tl.constexpr):
    """A stored 16-bit scale (bit pattern) as fp32."""
    if BF16:
        return bf16_value(b)
    else:
        return half_value(b)


@triton.jit
def store_scale_bits(s, BF16: tl.constexpr):
    """quant.store_scale: non-negative fp32 s rounded UP to fp16 / bf16 (saturating at its
    max); returns the bit pattern (int32 in 0..0xFFFF)."""
    if BF16:
        s = tl.minimum(s, BF16_MAX)
        q = bf16_bits(s)
        back = bf16_value(q)
    else:
        s = tl.minimum(s, FP16_MAX)
        q = half_bits(s)
        back = half_value(q)
    # nextafter(q, +inf) of a non-negative finite q is the next bit pattern
    return tl.where(back < s, q + 1, q)


@triton.jit
def tree_sum(v, N: tl.constexpr, LOG: tl.constexpr):
    """Sum of v (G, N) along its last dim, N = 2^LOG, by adjacent pairs: level by level
    v[2i] + v[2i+1] (group_sums.tree_sum is the same order in torch). Returns (G,)."""
    G: tl.constexpr = v.shape[0]
    for lvl in tl.static_range(LOG):
        a, b = tl.split(tl.reshape(v, (G, N >> (lvl + 1), 2)))
        v = a + b
    return tl.reshape(v, (G,))


@triton.jit
def pack_groups(v, BITS: tl.constexpr, BP: tl.constexpr):
    """quant.pack_bits for blocks of 8 codes: v (B, 8) codes < 2^BITS (any numeric type) ->
    (B, BP) bytes, BP = next_pow2(BITS); bytes >= BITS of a row are garbage (mask them)."""
    j = tl.arange(0, 8)
    word = tl.sum(v.to(tl.uint64) << (j * BITS).to(tl.uint64)[None, :], axis=1)
    k = tl.arange(0, BP)
    return ((word[:, None] >> (k * 8).to(tl.uint64)[None, :]) & 255).to(tl.uint8)


@triton.jit
def read_bits(p_ptr, start, ok, NBYTES, WIDTH: tl.constexpr, NB: tl.constexpr):
    """The WIDTH-bit unsigned ints at bit offsets `start` (int64) of a little-endian bit stream
    of NBYTES bytes (quant.pack_bits' layout: code r of b bits starts at bit r b), WIDTH <= 57;
    NB = next_pow2(ceil((WIDTH + 7) / 8)) bytes are read per value. 0 where not ok."""
    k = tl.arange(0, NB)
    addr = (start // 8)[:, None] + k[None, :]
    byte = tl.load(p_ptr + addr, mask=ok[:, None] & (addr < NBYTES), other=0)
    word = tl.sum(byte.to(tl.uint64) << (k * 8).to(tl.uint64)[None, :], axis=1)
    return (word >> (start % 8).to(tl.uint64)) & ((1 << WIDTH) - 1)


@triton.jit
def round_down_half_bits(v):
    """tah._round_down16: fp32 -> float16 rounded toward -inf (saturating at -65504), as a
    bit pattern (int32 in 0..0xFFFF)."""
    q = half_bits(tl.minimum(tl.maximum(v, -FP16_MAX), FP16_MAX))
    back = half_value(q)
    # nextafter(q, -inf): +-0 -> -smallest subnormal, positive -> one down, negative -> one up
    down = tl.where((q & 0x7FFF) == 0, 0x8001, tl.where((q & 0x8000) != 0, q + 1, q - 1))
    return tl.where((back > v) & (back > -FP16_MAX), down, q)


@triton.jit
def fwht(y, TB: tl.constexpr, T: tl.constexpr, LOGT: tl.constexpr):
    """tah.fwht without its final 1/sqrt(t) factor: y (TB, T), pairs (i, i + h) inside
    blocks of 2h become (a + b, a - b), h = 1, 2, 4, ..."""
    for lvl in tl.static_range(LOGT):
        y4 = tl.permute(tl.reshape(y, (TB, T >> (lvl + 1), 2, 1 << lvl)), (0, 1, 3, 2))
        a, b = tl.split(y4)
        y4 = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
        y = tl.reshape(y4, (TB, T))
    return y
