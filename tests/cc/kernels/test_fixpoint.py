"""Fixpoint kernels (megatron/cc/kernels/fixpoint.py) against the eager reference (quant.py),
bit for bit, executed by Triton's interpreter on the CPU.

Scales are compared by value: the eager max-reduction returns -0.0 or +0.0 for an all-zero
group depending on the CPU's vectorisation, the kernels always +0.0 (the codes, the bytes that
matter, are the same either way). Everything else is compared byte for byte.
"""

import pytest
import torch

from megatron.cc.codecs import fused
from megatron.cc.numerics import quant
from megatron.cc.kernels import group_sums
from tests.cc.kernels.cases import DTYPES, SHAPES, sample
from tests.cc.kernels.interpret import kernels

fx = kernels("fixpoint")

GRANULARITIES = [("tensor", 1), ("channel", 128), ("bucket", 5), ("bucket", 600), ("tile", 8)]
IDS = [f"{g}{n}" for g, n in GRANULARITIES]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("granularity,group", GRANULARITIES, ids=IDS)
@pytest.mark.parametrize("bits", range(1, 9))
def test_quantize_pack_and_unpack_dequantize(bits, granularity, group):
    """Given the eager scales: packed bytes and decodes (every dtype) identical."""
    for i, dtype in enumerate(DTYPES):
        shape = SHAPES[(bits + i) % 2]
        scheme = quant.SCHEMES[(bits + i) % 3]
        scale_dtype = (torch.float16, torch.bfloat16)[(bits + i) % 2]
        x = sample(shape, dtype, seed=bits)
        packed, scales = fused.encode_eager(x, bits, granularity, group, scale_dtype, scheme)
        assert same_bits(fx.quantize_pack(x, scales, bits, granularity, group, scheme), packed)
        for out in DTYPES:
            y = fx.unpack_dequantize(packed, scales, bits, shape, granularity, group, out, scheme)
            ref = fused.decode_eager(packed, scales, bits, shape, granularity, group, out, scheme)
            assert same_bits(y, ref), (dtype, out)


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("granularity,group", GRANULARITIES, ids=IDS)
def test_absmax_scales(granularity, group, scale_dtype):
    """max |x| per group and store_scale's round-up (saturation, subnormals) identical."""
    for i, dtype in enumerate(DTYPES):
        x = sample(SHAPES[i % 2], dtype, seed=i)
        for scheme, bits in (("absmax", 3), ("seed", 6)):
            ref = quant.group_scales(x, bits, granularity, group, scale_dtype, scheme)
            got = fx.group_scales(x, bits, granularity, group, scale_dtype, scheme)
            assert got.dtype == scale_dtype and torch.equal(got, ref)


def test_tensor_absmax_in_two_stages():
    """A "tensor" group past 8 x 2048 values: partial maxima first, then their max."""
    x = sample((40, 3, 151), torch.bfloat16, seed=3)
    x.view(-1)[12345] = -3e4
    got = fx.group_scales(x, 8, "tensor", 1, torch.float16, "absmax")
    assert torch.equal(got, quant.group_scales(x, 8, "tensor", 1, torch.float16, "absmax"))


# (bits, granularity, group, scheme, shape): channel groups of 111 rows (two chunks of 64
# lanes) and of 15; buckets of 600 (two chunks of 512) and of 5; tiles with a padded last one.
def test_tensor_scales_that_need_a_sum_stay_eager():
    """One "tensor" group would run as one program: fitted / 1-bit scales take the eager
    reference (quant.group_scales) there, bit for bit."""
    x = sample(SHAPES[0], seed=4)
    for bits, scheme in ((3, "fitted"), (1, "fitted"), (1, "seed")):
        ref = quant.group_scales(x, bits, "tensor", 1, torch.float16, scheme)
        assert same_bits(fx.group_scales(x, bits, "tensor", 1, torch.float16, scheme), ref)


SUM_CASES = [(2, "channel", 128, "fitted", SHAPES[1]), (3, "tile", 8, "fitted", SHAPES[0]),
             (4, "bucket", 5, "fitted", SHAPES[0]), (5, "bucket", 600, "fitted", SHAPES[1]),
             (8, "channel", 128, "fitted", SHAPES[0]), (1, "channel", 128, "fitted", SHAPES[1]),
             (1, "tile", 8, "seed", SHAPES[0]), (1, "bucket", 600, "seed", SHAPES[1])]


@pytest.mark.parametrize("bits,granularity,group,scheme,shape", SUM_CASES,
                         ids=[f"{b}b-{g}{n}-{s}" for b, g, n, s, _ in SUM_CASES])
def test_sum_based_scales_in_group_sums_order(bits, granularity, group, scheme, shape):
    """The fitted search and 1-bit mean / RMS: identical to group_sums' torch twin."""
    sd = (torch.float16, torch.bfloat16)[bits % 2]
    x = sample(shape, DTYPES[bits % 3], seed=bits)
    ref = group_sums.group_scales(x, bits, granularity, group, sd, scheme)
    packed, scales = fx.encode(x, bits, granularity, group, sd, scheme)
    assert scales.dtype == sd and torch.equal(scales, ref)
    codes = quant.quantize_with_scales(x, ref, bits, granularity, group, scheme=scheme)
    assert same_bits(packed, quant.pack_bits(codes, bits))


@pytest.mark.parametrize("rows", [111, 150])
def test_channel_scales_over_several_row_blocks(rows, monkeypatch):
    """Channel groups split over blocks of rows (4 blocks, and 5 padded to 8 in the block
    tree): absmax exact, the fitted search and 1-bit scales equal to the torch twin."""
    monkeypatch.setattr(group_sums, "COL_BLOCK_ROWS", 32)
    x = sample((rows, 1, 29), torch.bfloat16, seed=rows)
    for bits, scheme, sd in ((3, "absmax", torch.float16), (2, "fitted", torch.bfloat16),
                             (4, "fitted", torch.float16), (8, "fitted", torch.bfloat16),
                             (1, "fitted", torch.float16), (1, "seed", torch.bfloat16)):
        ref = group_sums.group_scales(x, bits, "channel", 128, sd, scheme)
        got = fx.group_scales(x, bits, "channel", 128, sd, scheme)
        assert got.dtype == sd and torch.equal(got, ref), (bits, scheme)
    # the sums themselves, in fp32: the blocks' order, which one block of 256 rows is not
    v = sample((rows, 1, 29), torch.float32, seed=rows + 1)
    cols = v.view(rows, 29).t()
    sums = fx.column_sums(v)
    assert torch.equal(sums, group_sums.block_sum(cols.abs()))
    assert torch.equal(fx.column_sums(v, squares=True), group_sums.block_sum(cols * cols))
    monkeypatch.setattr(group_sums, "COL_BLOCK_ROWS", 256)
    assert not torch.equal(group_sums.block_sum(cols.abs()), sums)


def test_fitted_search_reads_the_module_constants(monkeypatch):
    """Other ratios / refit counts in quant.py reach the kernel at call time."""
    x = sample(SHAPES[0], seed=5)
    default = fx.group_scales(x, 3, "tile", 8)
    monkeypatch.setattr(quant, "_FIT_RATIOS", (1.0, 0.5, 0.3))
    monkeypatch.setattr(quant, "_TREAD_RATIOS", (1.0, 0.6), raising=False)
    monkeypatch.setattr(quant, "_FIT_REFITS", 1)
    got = fx.group_scales(x, 3, "tile", 8)
    assert torch.equal(got, group_sums.group_scales(x, 3, "tile", 8, torch.float16, "fitted"))
    assert not torch.equal(got, default)
    got = fx.group_scales(x, 3, "channel", 128)      # the channel kernels read them too
    assert torch.equal(got, group_sums.group_scales(x, 3, "channel", 128, torch.float16,
                                                    "fitted"))
    monkeypatch.setattr(quant, "_FIT_REFITS", 0)      # the ladder alone
    got = fx.group_scales(x, 3, "channel", 128)
    assert torch.equal(got, group_sums.group_scales(x, 3, "channel", 128, torch.float16,
                                                    "fitted"))


@pytest.mark.parametrize("granularity,group", [("channel", 128), ("tile", 32), ("bucket", 128)])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_group_sums_order_agrees_with_eager_search(bits, granularity, group):
    """The kernels' summation order moves few scales, and never by much: the same scale in
    >= 97% of the groups, and each group's squared error within 0.1% of the eager choice's."""
    x = sample((64, 4, 96), seed=bits)
    ours = group_sums.group_scales(x, bits, granularity, group, torch.float16, "fitted")
    ref = quant.group_scales(x, bits, granularity, group, torch.float16, "fitted")
    assert (ours != ref).float().mean() <= 0.03

    def group_err(scales):
        x_hat = quant.dequantize(quant.quantize_with_scales(x, scales, bits, granularity, group),
                                 scales, bits, x.shape, granularity, group)
        return group_sums.groups((x - x_hat).square(), granularity, group)[0].double().sum(1)

    assert (group_err(ours) <= group_err(ref) * 1.001 + 1e-12).all()


@pytest.mark.parametrize("scheme", quant.SCHEMES)
def test_codec_routes_cuda_messages_to_the_kernels(scheme, monkeypatch):
    """FixpointCodec.encode / decode -> fused -> kernels when dispatch says so (on CUDA);
    MEGATRON_CC_FUSED=0 keeps the eager path."""
    from megatron.cc.codecs import get_codec
    from megatron.cc.kernels import dispatch
    codec = get_codec("fixpoint", bits=3, granularity="tile", group_size=8, scheme=scheme)
    x = sample(SHAPES[0], torch.bfloat16, seed=7)
    eager = codec.encode(x)
    calls = []
    monkeypatch.setattr(dispatch, "enabled", lambda *t: calls.append(1) or True)
    payload = codec.encode(x)
    ref = (eager[0], group_sums.group_scales(x, 3, "tile", 8, torch.float16, scheme))
    assert same_bits(payload[0], ref[0]) and torch.equal(payload[1], ref[1]) and calls
    y = codec.decode(payload, x.shape, torch.bfloat16)
    assert same_bits(y, fused.decode_eager(*payload, 3, x.shape, "tile", 8, torch.bfloat16,
                                           scheme))
    monkeypatch.undo()
    monkeypatch.setenv("MEGATRON_CC_FUSED", "0")
    assert not dispatch.enabled(x)


def test_empty_message():
    x = torch.empty(0, 4)
    packed, scales = fx.encode(x, 3, "channel", 128, torch.float16, "absmax")
    assert packed.numel() == 0 and scales.numel() == 4
    assert fx.decode(packed, scales, 3, (0, 4), "channel").shape == (0, 4)


@pytest.mark.parametrize("bits", range(1, 9))
def test_plain_pack_and_unpack(bits, monkeypatch):
    """fused.pack_bits / unpack_bits on the kernels == quant's, odd sizes and whole blocks."""
    from megatron.cc.kernels import dispatch
    monkeypatch.setattr(dispatch, "enabled", lambda *t: True)
    g = torch.Generator().manual_seed(bits)
    for n in (0, 1, 9, 2048, 2053):
        codes = torch.randint(0, 2 ** bits, (n,), dtype=torch.uint8, generator=g)
        packed = fused.pack_bits(codes, bits)
        assert same_bits(packed, quant.pack_bits(codes, bits))
        assert same_bits(fused.unpack_bits(packed, bits, n), codes)
    with pytest.raises(ValueError, match="packed bytes"):
        fused.unpack_bits(packed[:-1], bits, n)
