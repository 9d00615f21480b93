"""Codec contract: registry, identity baseline, every codec's payload matches its spec."""
import pathlib
import re

import pytest
import torch

from megatron.cc.codecs import REGISTRY, CodecContext, get_codec, payload_bytes
from megatron.cc.codecs.base import check_payload

ALL = ["identity", "fixpoint", "lowrank", "delta", "delta-lowbits", "tah", "cocktail"]


def test_registry_has_every_codec():
    assert set(ALL) <= set(REGISTRY)
    with pytest.raises(KeyError, match="unknown codec"):
        get_codec("nope")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7,), (3, 2, 5), (16, 1, 33)])
def test_identity_is_exact(shape, dtype):
    x = torch.randn(shape).to(dtype)
    c = get_codec("identity")
    p = c.encode(x, CodecContext())
    check_payload(p, c.payload_spec(x.shape, dtype))
    assert payload_bytes(p) == x.numel() * x.element_size()
    y = c.decode(p, x.shape, dtype, CodecContext())
    assert y.dtype == dtype and torch.equal(y, x)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("shape", [(8, 2, 64), (5, 3, 37)])
def test_payload_matches_spec(name, shape):
    torch.manual_seed(0)
    ctx = CodecContext(sample_ids=torch.arange(shape[1]))
    enc = get_codec(name, rank=2) if name == "lowrank" else get_codec(name)
    for x in (torch.randn(shape), torch.zeros(shape), torch.randn(shape) * 1e4):
        p = enc.encode(x, ctx)
        spec = enc.payload_spec(torch.Size(shape), x.dtype)
        check_payload(p, spec)
        assert payload_bytes(p) == enc.payload_nbytes(shape, x.dtype)


def test_codecs_do_not_use_torch_distributed():
    src = pathlib.Path(__file__).parents[3] / "megatron" / "cc" / "compress"
    use = re.compile(r"^\s*(from|import)\s+torch\.distributed|^\s*from\s+torch\s+import\s+distributed"
                     r"|torch\.distributed\.\w+", re.M)
    for f in src.glob("*.py"):
        assert not use.search(f.read_text()), f
