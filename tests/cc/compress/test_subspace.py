"""The subspace codec (megatron/cc/codecs/subspace.py): coefficients raw or b-bit fixpoint,
payload sizes both ends compute from the shape, and the uncompressed bytes it reports."""
import pytest
import torch

from megatron.cc.codecs import get_codec
from megatron.cc.codecs.base import check_payload, payload_bytes


@pytest.mark.parametrize("shape", [(16, 2, 4), (7, 3, 8), (1, 1, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [0, 2, 4, 8])
def test_round_trip_and_sizes(shape, dtype, bits):
    k = shape[-1]
    codec = get_codec("subspace", hidden_size=32, rank=k, bits=bits)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    payload = codec.encode(x)
    check_payload(payload, codec.payload_spec(torch.Size(shape), dtype))
    out = codec.decode(payload, shape, dtype)
    assert out.shape == x.shape and out.dtype == dtype
    if bits == 0:
        assert torch.equal(out, x)   # the exact wire
    else:
        err = ((out.float() - x.float()).norm() / x.float().norm()).item()
        assert err < {2: 0.6, 4: 0.15, 8: 0.02}[bits]
    tokens = shape[0] * shape[1]
    assert codec.raw_nbytes(x) == tokens * 32 * x.element_size()
    expected = tokens * k * x.element_size() if bits == 0 else \
        (tokens * k * bits + 7) // 8 + 2 * k
    assert payload_bytes(payload) == expected


def test_refuses_bad_arguments():
    with pytest.raises(ValueError, match="rank"):
        get_codec("subspace", hidden_size=8, rank=9)
    with pytest.raises(ValueError, match="bits"):
        get_codec("subspace", hidden_size=8, rank=4, bits=9)
    with pytest.raises(ValueError, match="last dim"):
        get_codec("subspace", hidden_size=8, rank=4).encode(torch.zeros(2, 2, 8))
