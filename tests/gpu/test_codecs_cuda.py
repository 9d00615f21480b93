"""Every codec on CUDA: same payload bytes as on the CPU, no host sync (CUDA's sync debug mode
set to error), the error bound holding, GPU and CPU decodes of the same payload within one
quantisation step, delta caches identical at both ends, fused (Triton) fixpoint bit-identical to
the eager reference. Skipped without CUDA."""

import pytest
import torch

from megatron.cc.codecs.base import payload_bytes
from tests.cc.compress.codec_cases import CASES, IDS, build, context
from tests.sync_guard import no_host_sync

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SHAPE = (128, 4, 256)   # (S, B, H)
DTYPES = [torch.float32, torch.bfloat16]


def _step_bound(name, kwargs, x):
    """Largest quantisation step a payload of x can have (None: no fixed grid): how far two
    decodes of one payload may differ."""
    if name != "fixpoint" and name not in ("delta", "delta-lowbits"):
        return None
    bits = kwargs.get("bits", 8)
    levels = 0.5 if bits == 1 else (1 << (bits - 1)) - 1
    return x.float().abs().max().item() * 2 / levels   # deltas are at most twice |x|


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_codec_on_cuda_matches_cpu(case, dtype):
    _, name, kwargs = case
    dev = torch.device("cuda", torch.cuda.current_device())
    width = SHAPE[-1]
    enc, dec = build(name, kwargs, dev, width), build(name, kwargs, dev, width)
    cpu_dec = build(name, kwargs, width=width)
    # the eager codec on the CPU
    ref_enc, ref_dec = build(name, kwargs, width=width), build(name, kwargs, width=width)
    g = torch.Generator().manual_seed(0)
    for mb in range(3):
        x_cpu = torch.randn(SHAPE, generator=g).to(dtype)
        x = x_cpu.to(dev)
        ctx = context(SHAPE, microbatch=mb % 2)
        if mb == 0 and name not in ("delta", "delta-lowbits"):
            # compile (fixpoint's fused kernels) and warm up outside the sync check
            dec.decode(enc.encode(x, ctx), x.shape, dtype, ctx)
        with no_host_sync(dev):
            payload = enc.encode(x, ctx)
            y = dec.decode(payload, x.shape, dtype, ctx)
        assert all(p.device == dev for p in payload) and y.device == dev and y.dtype == dtype
        assert payload_bytes(payload) == enc.payload_nbytes(SHAPE, dtype)
        y_cpu = cpu_dec.decode([p.cpu() for p in payload], x.shape, dtype, ctx)
        step = _step_bound(name, kwargs, x_cpu)
        if step is not None:
            assert (y.cpu().float() - y_cpu.float()).abs().max() <= step
            # the error against x is the eager CPU codec's: "fitted" scales clip, so no grid
            # step bounds it (they differ only where near-tied candidates sum differently)
            y_ref = ref_dec.decode(ref_enc.encode(x_cpu, ctx), x.shape, dtype, ctx).float()
            err, ref = (y.cpu().float() - x_cpu.float()), (y_ref - x_cpu.float())
            assert err.square().mean() <= 1.05 * ref.square().mean() + 1e-12
            assert err.abs().max() <= ref.abs().max() + step
        else:
            scale = x_cpu.float().abs().max()
            assert (y.cpu().float() - y_cpu.float()).abs().max() <= 1e-2 * scale
    if name in ("delta", "delta-lowbits"):
        assert torch.equal(enc.cache.data.cpu(), dec.cache.data.cpu())


@pytest.mark.parametrize("storage", ["ram", "device"])
def test_delta_cache_storage_on_gpu(storage):
    dev = torch.device("cuda", torch.cuda.current_device())
    kw = dict(bits=4, capacity=8, storage=storage, sample_shape=(SHAPE[0], SHAPE[2]),
              device=dev)
    enc, dec = build("delta", kw), build("delta", kw)
    assert (enc.cache.data.device.type == "cuda") == (storage == "device")
    assert storage != "ram" or enc.cache.data.is_pinned()
    for mb in range(4):
        x = torch.randn(SHAPE, device=dev)
        ctx = context(SHAPE, microbatch=mb % 2)
        with no_host_sync(dev):
            y = dec.decode(enc.encode(x, ctx), SHAPE, torch.float32, ctx)
    sd_e, sd_d = enc.state_dict(), dec.state_dict()
    assert torch.equal(sd_e["cache"]["data"], sd_d["cache"]["data"])
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("scheme", ["absmax", "fitted"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bits", [4, 8])
def test_fused_fixpoint_equals_eager(bits, dtype, scheme, monkeypatch):
    """The Triton kernels against the eager reference, both on CUDA, bit for bit; fitted
    scales sum in the kernels' order (megatron/cc/kernels/group_sums.py)."""
    from megatron.cc.codecs import fused
    from megatron.cc.numerics import quant
    from megatron.cc.kernels import group_sums
    x = torch.randn(1024, 8, 1920, device="cuda").to(dtype)
    args = (bits, "channel", 128, torch.float16, scheme)
    packed, scales = fused.encode(x, *args)
    assert torch.equal(scales, group_sums.group_scales(x, *args))
    codes = quant.quantize_with_scales(x, scales, bits, "channel", 128, scheme=scheme)
    assert torch.equal(packed, quant.pack_bits(codes, bits))
    y = fused.decode(packed, scales, bits, x.shape, "channel", 128, dtype, scheme)
    monkeypatch.setenv("MEGATRON_CC_FUSED", "0")
    y_ref = fused.decode(packed, scales, bits, x.shape, "channel", 128, dtype, scheme)
    assert torch.equal(y, y_ref)
