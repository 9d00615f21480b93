"""Codecs on any device, with any message dtype, without host syncs (the send path must not
stall the stream): encode and decode run under tests/sync_guard.no_host_sync, the payload
matches payload_spec for fp32 / bf16 / fp16 messages, and everything stays on the input's
device. The same cases run on CUDA in tests/gpu/test_codecs_cuda.py."""

import pytest
import torch

from megatron.cc.codecs.base import check_payload, payload_bytes
from tests.cc.compress.codec_cases import CASES, IDS, build, context
from tests.sync_guard import HostSync, no_host_sync

SHAPE = (16, 2, 48)   # (S, B, H)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_codec_round_trip_without_host_sync(case, dtype):
    _, name, kwargs = case
    enc, dec = build(name, kwargs, width=SHAPE[-1]), build(name, kwargs, width=SHAPE[-1])
    g = torch.Generator().manual_seed(0)
    for mb in range(3):  # stateful codecs: first sight, then warm caches / Q / errors
        x = torch.randn(SHAPE, generator=g).to(dtype)
        ctx = context(SHAPE, microbatch=mb % 2)
        with no_host_sync():
            payload = enc.encode(x, ctx)
            y = dec.decode([p.clone() for p in payload], x.shape, dtype, ctx)
        spec = enc.payload_spec(x.shape, dtype)
        check_payload(payload, spec)
        assert payload_bytes(payload) == enc.payload_nbytes(SHAPE, dtype)
        assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
        assert torch.isfinite(y.float()).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_byte_ratio_is_against_the_message_dtype(dtype):
    """A bf16 message costs 2 bytes a value raw; a 4-bit fixpoint payload is 1/2 byte a value
    plus one 16-bit scale per channel, and lowrank's factors travel in the message's dtype."""
    S, B, H = SHAPE
    fix = build("fixpoint", dict(bits=4))
    assert fix.payload_nbytes(SHAPE, dtype) == S * B * H // 2 + 2 * H
    low = build("lowrank", dict(rank=4))
    assert low.payload_nbytes(SHAPE, dtype) == 4 * (S * B + H) * 2
    assert low.payload_nbytes(SHAPE, torch.float32) == 4 * (S * B + H) * 4


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_fixpoint_error_bound_on_half_messages(bits, dtype):
    """|x - x_hat| <= step / 2 (fp32 math) plus the rounding of x_hat to the message dtype."""
    g = torch.Generator().manual_seed(bits)
    x = (torch.randn(SHAPE, generator=g) * 3).to(dtype)
    codec = build("fixpoint", dict(bits=bits, scheme="absmax"))  # absmax: nothing clipped
    y = codec.decode(codec.encode(x), x.shape, dtype)
    step = codec.quantize(x)[1].float() / (((1 << bits) - 1) / 2)
    bound = step / 2 + y.float().abs() * torch.finfo(dtype).eps
    assert ((x.float() - y.float()).abs() <= bound * (1 + 1e-6)).all()


def test_the_guard_catches_host_syncs():
    """The check above can fail: each way of reading the device is caught."""
    x = torch.randn(8)
    for sync in (lambda: x.sum().item(), lambda: bool((x > 0).any()), lambda: x[x > 0],
                 lambda: float(x.max()), lambda: x.tolist(), lambda: torch.nonzero(x)):
        with pytest.raises(HostSync):
            with no_host_sync():
                sync()
    with no_host_sync():   # host metadata stays allowed
        assert torch.arange(3).tolist() == [0, 1, 2]


def test_stochastic_rounding_state_resumes_and_refuses_another_device_type():
    a = build("fixpoint", dict(bits=3, stochastic=True, seed=5))
    x = torch.randn(SHAPE)
    a.encode(x)
    sd = a.state_dict()
    b = build("fixpoint", dict(bits=3, stochastic=True, seed=5))
    b.load_state_dict(sd)   # pending until the first message tells the device
    assert all(torch.equal(p, q) for p, q in zip(a.encode(x), b.encode(x)))
    c = build("fixpoint", dict(bits=3, stochastic=True, seed=5))
    c.load_state_dict(dict(sd, device="cuda"))
    with pytest.raises(RuntimeError, match="saved on cuda"):
        c.encode(x)


@pytest.mark.parametrize("bits", [4])
def test_fused_fixpoint_kernels_equal_eager_on_cpu(bits):
    """The Triton kernels fused.encode / decode run on CUDA, here under Triton's interpreter,
    against the eager reference (the full matrix is tests/cc/kernels/test_fixpoint.py)."""
    from megatron.cc.codecs import fused
    from tests.cc.kernels.interpret import kernels
    fx = kernels("fixpoint")
    x = torch.randn(64, 2, 96, generator=torch.Generator().manual_seed(0))
    args = (x, bits, "channel", 128, torch.float16, "absmax")
    packed, scales = fx.encode(*args)
    ref_packed, ref_scales = fused.encode_eager(*args)
    assert torch.equal(scales, ref_scales) and torch.equal(packed, ref_packed)
    y = fx.decode(packed, scales, bits, tuple(x.shape), "channel", 128, torch.bfloat16, "absmax")
    assert torch.equal(y, fused.decode_eager(packed, scales, bits, tuple(x.shape), "channel",
                                             128, torch.bfloat16, "absmax"))
