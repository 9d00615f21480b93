"""Every activation codec on a fake GPU: encode / decode / observe / pass_through with no host
sync (inside `gpu.strict()`: any read of a cuda value or blocking copy down raises), payloads
and outputs on the message's device, and the state round trip of a resume onto the GPU
(state_dict -> CPU copies, as torch.load(map_location="cpu") gives -> load_state_dict into a
codec built as the driver builds it -> encode/decode on the GPU again).

The cases are tests/cc/compress/codec_cases.CASES (the CPU sync-guard tests and tests/gpu run
the same list) plus the activation-cache storages; the compiled (Triton) path is off
(MEGATRON_CC_FUSED=0): the eager code is what runs here and the reference the kernels match.
"""
import pytest
import torch

from megatron.cc.codecs import REGISTRY
from megatron.cc.codecs.base import check_payload
from tests.cc.compress.codec_cases import CASES, build, context
from tests.fake_cuda.fake_gpu import real_copy

SHAPE = (16, 2, 48)   # (S, B, H)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def test_every_registered_codec_has_a_case():
    assert set(REGISTRY) <= {name for _, name, _ in CASES}


def _round(gpu, enc, dec, dtype, microbatches=range(3), iteration=0):
    start = len(gpu.events)
    for mb in microbatches:
        x = torch.randn(SHAPE).to(gpu.device, dtype)
        ctx = context(SHAPE, microbatch=mb % 2, iteration=iteration)
        with gpu.strict():
            payload = enc.encode(x, ctx)
            y = dec.decode([p.clone() for p in payload], x.shape, dtype, ctx)
            if hasattr(enc, "observe"):
                enc.observe(x, ctx)
                dec.observe(x, ctx)
            z = enc.pass_through(x, ctx)
        check_payload(payload, enc.payload_spec(x.shape, dtype))
        assert {p.device for p in payload} == {gpu.device}
        assert y.device == gpu.device and y.dtype == dtype and y.shape == x.shape
        assert z.device == gpu.device
    assert gpu.syncs(since=start) == []


def _resumed(name, kwargs, sd, device):
    """A codec built as pipeline_codecs builds it (delta: sample_shape and device given) and
    one built bare (delta: cache made from the first message or the state), loaded from CPU."""
    out = []
    for dev in ([device, None] if name in ("delta", "delta-lowbits") else [None]):
        kw = dict(kwargs, sample_shape=(SHAPE[0], SHAPE[2])) if dev is not None else kwargs
        codec = build(name, kw, dev, SHAPE[-1])
        codec.load_state_dict(real_copy(sd))
        out.append(codec)
    return out


# bf16 (what GPUs train in) for every case; fp32 and fp16 for the first case of each codec
# but the delta codecs (they quantise x.float() - cache and hand back .to(dtype), the fixpoint
# path, whose dtypes run here): fake dispatch costs ~0.4 ms an op on this machine and the
# fitted quantiser is hundreds of ops, so the tier stays within its time
FIRST = {name: cid for cid, name, _ in reversed(CASES) if not name.startswith("delta")}
RUNS = [(c, "bf16") for c in CASES] + [(c, d) for c in CASES for d in ("fp32", "fp16")
                                       if FIRST.get(c[1]) == c[0]]


@pytest.mark.parametrize("case,dtype", RUNS, ids=[f"{c[0]}-{d}" for c, d in RUNS])
def test_codec_on_gpu_and_resume_onto_gpu(gpu, case, dtype):
    _, name, kwargs = case
    dtype = DTYPES[dtype]
    enc, dec = build(name, kwargs, gpu.device, SHAPE[-1]), build(name, kwargs, gpu.device,
                                                              SHAPE[-1])
    _round(gpu, enc, dec, dtype, microbatches=range(2))
    with gpu.lenient():   # saving may wait for the stream (a checkpoint, not the send path)
        enc_sd, dec_sd = enc.state_dict(), dec.state_dict()
    for enc2, dec2 in zip(_resumed(name, kwargs, enc_sd, gpu.device),
                          _resumed(name, kwargs, dec_sd, gpu.device)):
        _round(gpu, enc2, dec2, dtype, microbatches=range(1), iteration=1)
        if hasattr(enc2, "cache"):
            assert enc2.cache.device == gpu.device and set(enc2.cache.slots) == set(enc.cache.slots)


@pytest.mark.parametrize("storage", ["ram", "device"])
def test_activation_cache_storages_on_gpu(gpu, storage):
    """The cache in pinned RAM (asynchronous copies both ways) or in GPU memory (delta-lowbits
    runs the same slot copies on its packed rows: covered by its case above, in RAM)."""
    kw = dict(bits=4, capacity=8, storage=storage, sample_shape=(SHAPE[0], SHAPE[2]))
    enc, dec = build("delta", kw, gpu.device), build("delta", kw, gpu.device)
    if storage == "ram":
        assert enc.cache.data.is_pinned()
    _round(gpu, enc, dec, torch.float32, microbatches=range(2))


def test_disk_cache_on_gpu_copies_down_blocking(gpu, tmp_path):
    """A disk cache (numpy memmap: pageable host memory) costs a blocking copy down per slot
    written -- by design, the price of activations that fit neither GPU memory nor RAM; the
    values are never read on the host, and reads go up without a sync."""
    kw = dict(bits=4, capacity=8, storage=f"disk:{tmp_path}", sample_shape=(SHAPE[0], SHAPE[2]))
    enc, dec = build("delta", kw, gpu.device), build("delta", kw, gpu.device)
    start = len(gpu.events)
    x = torch.randn(SHAPE).to(gpu.device)
    ctx = context(SHAPE)
    dec.decode(enc.encode(x, ctx), x.shape, x.dtype, ctx)
    syncs = [e for e in gpu.events[start:] if e.kind in ("read", "d2h", "sync")]
    assert syncs and all(e.kind == "d2h" and "codecs/delta.py" in e.where for e in syncs)
    enc.close()
    dec.close()
