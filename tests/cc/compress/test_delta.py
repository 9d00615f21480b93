"""AC-SGD delta / delta-lowbits: both ends' caches stay bit-identical; cache storage and size."""
import hashlib
import os

import pytest
import torch

from megatron.cc.codecs import (ActivationCache, CacheTooLarge, CodecContext, get_codec,
                                  payload_bytes)
from megatron.cc.codecs.delta import DeltaCodec

S, H = 6, 20


def cache_hash(codec) -> str:
    sd = codec.state_dict()["cache"]
    h = hashlib.sha256(sd["entries"].numpy().tobytes())
    h.update(sd["data"].numpy().tobytes())
    return h.hexdigest()


def stream(steps=8, batch=3, pool=5, seed=0):
    """(x, ids) micro-batches that revisit samples, each sample drifting slowly."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(pool, S, H, generator=g)
    for _ in range(steps):
        ids = torch.randperm(pool, generator=g)[:batch]
        base[ids] += 0.1 * torch.randn(batch, S, H, generator=g)
        yield base[ids].transpose(0, 1).contiguous(), ids


def make(name, **kw):
    kw.setdefault("capacity", 8)
    return get_codec(name, **kw)


@pytest.mark.parametrize("name,kw", [("delta", {}), ("delta", {"cache_dtype": "bfloat16"}),
                                     ("delta", {"cache_dtype": "float16"}),
                                     ("delta", {"bits": 2}), ("delta", {"bits": 8, "capacity": 3}),
                                     ("delta-lowbits", {}), ("delta-lowbits", {"bits_act": 3}),
                                     ("delta-lowbits", {"bits": 1, "capacity": 4})])
def test_sender_and_receiver_stay_bit_identical(name, kw):
    send, recv = make(name, **kw), make(name, **kw)
    for step, (x, ids) in enumerate(stream()):
        ctx = CodecContext(microbatch=step, sample_ids=ids)
        p = send.encode(x, ctx)
        assert payload_bytes(p) == send.payload_nbytes(x.shape, x.dtype)
        x_hat = recv.decode(p, x.shape, x.dtype, ctx)
        assert x_hat.shape == x.shape
        assert cache_hash(send) == cache_hash(recv)
    assert send.first_sights == recv.first_sights > 0


def test_first_sight_sends_quantised_x_and_later_deltas_shrink():
    send, recv = make("delta", bits=4), make("delta", bits=4)
    x = torch.randn(S, 2, H)
    ctx = CodecContext(sample_ids=torch.tensor([10, 11]))
    p = send.encode(x, ctx)
    plain = get_codec("fixpoint", bits=4).encode(x, ctx)
    assert all(torch.equal(a, b) for a, b in zip(p, plain))  # cache starts at zero: d = x
    assert send.first_sights == 2
    recv.decode(p, x.shape, x.dtype, ctx)
    errs = []
    for _ in range(4):  # the same activation again: each send refines the cached copy
        errs.append(float((recv.decode(send.encode(x, ctx), x.shape, x.dtype, ctx) - x).abs().max()))
    assert errs[-1] < errs[0] / 10 and send.first_sights == 2


def test_observe_then_encode_is_exact():
    send, recv = make("delta"), make("delta")
    x = torch.randn(S, 2, H)
    ctx = CodecContext(sample_ids=torch.tensor([0, 1]))
    send.observe(x, ctx)
    recv.observe(x, ctx)  # warm-up: the channel sent x uncompressed
    assert torch.equal(recv.decode(send.encode(x, ctx), x.shape, x.dtype, ctx), x)


def test_eviction_is_lru_and_identical_on_both_ends():
    send, recv = make("delta", capacity=2), make("delta", capacity=2)
    for ids in ([0], [1], [0], [2], [1]):  # [2] evicts 1 (LRU), then 1 is new again
        x = torch.randn(S, 1, H)
        ctx = CodecContext(sample_ids=torch.tensor(ids))
        recv.decode(send.encode(x, ctx), x.shape, x.dtype, ctx)
    assert list(send.cache.slots) == [2, 1] and send.cache.evictions == 2
    assert send.first_sights == 4 and cache_hash(send) == cache_hash(recv)
    with pytest.raises(ValueError, match="capacity"):
        send.encode(torch.randn(S, 3, H), CodecContext(sample_ids=torch.tensor([5, 6, 7])))


@pytest.mark.parametrize("name,kw", [("delta", {}), ("delta", {"cache_dtype": "float16"}),
                                     ("delta-lowbits", {})])
def test_disk_storage_matches_ram(tmp_path, name, kw):
    ram = make(name, **kw)
    disk = make(name, storage=f"disk:{tmp_path / 'send.bin'}", **kw)
    on_dir = make(name, storage=f"disk:{tmp_path}", sample_shape=(S, H), **kw)
    for x, ids in stream(steps=5):
        ctx = CodecContext(sample_ids=ids)
        a, b = ram.encode(x, ctx), disk.encode(x, ctx)
        assert all(torch.equal(p, q) for p, q in zip(a, b))
        on_dir.decode(a, x.shape, x.dtype, ctx)
    assert cache_hash(ram) == cache_hash(disk) == cache_hash(on_dir)
    assert os.path.getsize(tmp_path / "send.bin") == disk.cache.nbytes
    assert on_dir.cache.path.startswith(str(tmp_path)) and "disk" in on_dir.describe()
    # resume a disk cache from a checkpoint into a fresh file
    resumed = make(name, storage=f"disk:{tmp_path / 'resumed.bin'}", **kw)
    resumed.load_state_dict(disk.state_dict())
    x, ids = next(stream(steps=1, seed=9))
    ctx = CodecContext(sample_ids=ids)
    assert all(torch.equal(p, q) for p, q in zip(disk.encode(x, ctx), resumed.encode(x, ctx)))
    made = on_dir.cache.path
    on_dir.close()
    disk.close()
    assert not os.path.exists(made) and os.path.exists(tmp_path / "send.bin")


@pytest.mark.parametrize("name,kw", [("delta", {}), ("delta", {"cache_dtype": "float16"}),
                                     ("delta-lowbits", {}), ("delta-lowbits", {"bits_act": 3})])
def test_device_storage_matches_ram(name, kw):
    """A device cache moves its rows by one gather and one scatter (index_select,
    index_copy_), host storage row by row: the same payloads, decodes and caches, evictions
    and a sample repeated within a micro-batch included."""
    ends = {where: (make(name, storage=where, capacity=4, **kw),
                    make(name, storage=where, capacity=4, **kw)) for where in ("ram", "device")}
    batches = list(stream(steps=6, pool=7))
    batches.append((batches[0][0], torch.tensor([2, 2, 5])))
    for x, ids in batches:
        ctx = CodecContext(sample_ids=ids)
        (a, ra), (b, rb) = ([send.encode(x, ctx), recv] for send, recv in ends.values())
        assert all(torch.equal(p, q) for p, q in zip(a, b))
        assert torch.equal(ra.decode(a, x.shape, x.dtype, ctx), rb.decode(b, x.shape, x.dtype, ctx))
    hashes = {cache_hash(c) for pair in ends.values() for c in pair}
    assert len(hashes) == 1 and ends["device"][0].cache.evictions > 0


@pytest.mark.parametrize("name,kw", [("delta", {}), ("delta", {"cache_dtype": "float16"}),
                                     ("delta", {"cache_dtype": "bfloat16"}),
                                     ("delta-lowbits", {})])
def test_state_dict_round_trip(name, kw):
    a = make(name, **kw)
    data = list(stream(steps=6))
    for x, ids in data[:4]:
        a.encode(x, CodecContext(sample_ids=ids))
    b = make(name, **kw)
    b.load_state_dict(a.state_dict())
    assert b.first_sights == a.first_sights
    for x, ids in data[4:]:
        ctx = CodecContext(sample_ids=ids)
        assert all(torch.equal(p, q) for p, q in zip(a.encode(x, ctx), b.encode(x, ctx)))
    assert cache_hash(a) == cache_hash(b)


def test_size_report_and_refusal(tmp_path, monkeypatch):
    c = ActivationCache(4, (S, H), torch.float16, ram_limit_bytes=10 ** 9)
    assert c.nbytes == 4 * S * H * 2 and "4 samples" in c.describe() and "GiB" in c.describe()
    low = ActivationCache(4, (S, H), bits=3, ram_limit_bytes=10 ** 9)
    assert low.nbytes == 4 * (-(-S * H // 8) * 3 + 2 * H)  # one fp16 scale per channel
    with pytest.raises(CacheTooLarge, match=str(1000 * S * H * 4)):
        DeltaCodec(capacity=1000, sample_shape=(S, H), ram_limit_bytes=1000)
    import shutil
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 100))
    with pytest.raises(CacheTooLarge, match="on disk"):
        ActivationCache(1000, (S, H), storage=f"disk:{tmp_path / 'big.bin'}")
    with pytest.raises(ValueError, match="storage"):
        ActivationCache(4, (S, H), storage="tape")


def test_needs_sample_ids_and_matching_shape():
    c = make("delta")
    with pytest.raises(ValueError, match="sample_ids"):
        c.encode(torch.randn(S, 2, H), CodecContext())
    c.encode(torch.randn(S, 2, H), CodecContext(sample_ids=torch.tensor([0, 1])))
    with pytest.raises(ValueError, match="does not match"):
        c.encode(torch.randn(S + 1, 2, H), CodecContext(sample_ids=torch.tensor([0, 1])))


@pytest.mark.parametrize("dtype,bytes_per_value,error", [("float32", 4, 0.03),
                                                          ("float16", 2, 0.03),
                                                          ("bfloat16", 2, 0.06)])
def test_cache_dtype_memory_and_error(dtype, bytes_per_value, error):
    """Half-precision caches hold half the bytes (the start-up line says so); the receiver's
    error stays that of the 4-bit delta, because each delta is taken against the rounded
    cache both ends hold (the rounding is sent on with the next delta, not accumulated)."""
    send = make("delta", cache_dtype=dtype, capacity=5, sample_shape=(S, H))
    recv = make("delta", cache_dtype=dtype, capacity=5, sample_shape=(S, H))
    assert send.cache.nbytes == 5 * S * H * bytes_per_value
    assert f"{dtype} in RAM" in send.describe() and f"({5 * S * H * bytes_per_value:,} bytes)" \
        in send.describe()
    errs = []
    for x, ids in stream(steps=40, batch=3, pool=5):
        ctx = CodecContext(sample_ids=ids)
        x_hat = recv.decode(send.encode(x, ctx), x.shape, x.dtype, ctx)
        errs.append(float((x_hat - x).abs().mean() / x.abs().mean()))
    assert cache_hash(send) == cache_hash(recv)
    assert max(errs[-10:]) < error, errs[-10:]   # relative mean error once every sample is seen


def test_fp16_cache_saturates_instead_of_overflowing():
    send, recv = make("delta", cache_dtype="float16"), make("delta", cache_dtype="float16")
    ctx = CodecContext(sample_ids=torch.tensor([0]))
    x = torch.randn(S, 1, H)
    x[0, 0, 0] = 1e6                         # beyond float16's range
    for _ in range(3):
        x_hat = recv.decode(send.encode(x, ctx), x.shape, x.dtype, ctx)
        assert torch.isfinite(x_hat).all() and cache_hash(send) == cache_hash(recv)
    cached = send.cache.read(torch.tensor([0]))
    assert float(cached.abs().max()) == 65504.0 and torch.isfinite(cached).all()


def test_cache_state_of_another_dtype_is_refused():
    a = make("delta", cache_dtype="float16")
    x, ids = next(stream(steps=1))
    a.encode(x, CodecContext(sample_ids=ids))
    b = make("delta")
    with pytest.raises(ValueError, match="activation-cache-dtype"):
        b.load_state_dict(a.state_dict())


def test_lowbit_cache_has_one_scale_per_sample_and_channel():
    """delta-lowbits stores AC-SGD's layout: a channel's values of one sample share a scale, so
    a channel scaled by 1000 in one sample leaves the other channels' error untouched."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 10, generator=g)          # (B, S, H) with S != H
    y = x.clone()
    y[0, :, 3] *= 1000
    errs = []
    for v in (x, y):
        c = ActivationCache(2, (6, 10), bits=4, ram_limit_bytes=10 ** 9)
        c.write(torch.tensor([0, 1]), v)
        errs.append((c.read(torch.tensor([0, 1])) - v).abs())
    keep = torch.ones(10, dtype=torch.bool)
    keep[3] = False
    assert torch.equal(errs[0][..., keep], errs[1][..., keep])
    assert c.slot_bytes == -(-6 * 10 // 8) * 4 + 2 * 10


def test_lowbit_cache_refuses_the_per_token_layout_of_earlier_releases():
    c = ActivationCache(2, (6, 10), bits=4, ram_limit_bytes=10 ** 9)
    sd = c.state_dict()
    for old in ("4-bit", None):
        if old is None:
            sd.pop("format")
        else:
            sd["format"] = old
        with pytest.raises(ValueError, match="resume with"):
            ActivationCache(2, (6, 10), bits=4, ram_limit_bytes=10 ** 9).load_state_dict(sd)
