"""What each codec of bench/bench_gpu.py's table would launch on a GPU, counted on the CPU
with the Triton kernels on (interpreted): kernel launches, full passes over the message and
host syncs per encode and per decode call (tests/cc/launches.py). A budget per codec keeps a
slow path (an eager fallback, a per-candidate loop, a per-sample loop) from coming back
unnoticed; the kernel route's decodes are checked against the eager route's on the way.

Counts at S, B, H = 16, 2, 64 (bf16) and a 4096-value dp bucket; lower them when a codec gets
faster. The bench context's sample ids (2 launches) are in the delta codecs' budgets.
"""
import pytest
import torch

from bench import bench_gpu
from tests.cc.kernels.interpret import kernels
from tests.cc.launches import count

SHAPE = (16, 2, 64)
BUCKET = 4096
SETS = 2

# label: (encode launches, encode passes, decode launches, decode passes)
BUDGET = {
    "fixpoint 2-bit absmax": (3, 2, 1, 1),
    "fixpoint 2-bit fitted": (13, 7, 1, 1),
    "fixpoint 4-bit absmax": (3, 2, 1, 1),
    "fixpoint 4-bit fitted": (13, 7, 1, 1),
    "fixpoint 8-bit absmax": (3, 2, 1, 1),
    "fixpoint 8-bit fitted": (13, 7, 1, 1),
    "lowrank r=16 (CB, LEP)": (9, 4, 1, 1),
    "rsvd r=16 (CB, LEP)": (8, 4, 1, 1),
    "delta 4-bit (device cache)": (16, 8, 3, 1),
    "delta-lowbits 4/8 (device cache)": (23, 13, 10, 6),
    "tah t=64 4/3-bit": (6, 4, 2, 1),
    "cocktail 0.1/0.2 4-bit": (7, 1, 3, 1),
    "subspace k=10 4-bit": (13, 7, 1, 1),
    "DiLoCo int8 (pseudo-gradient)": (2, 2, 1, 1),
    "DiLoCo fp16 (pseudo-gradient)": (1, 1, 1, 1),
    "SparseLoCo 1/64 of 4096, 2-bit (pseudo-gradient)": (6, 3, 2, 2),
}


def _cases():
    out = []
    for g in bench_gpu.groups([SHAPE], [torch.bfloat16], torch.device("cpu"), 0, BUCKET):
        g.sets = SETS
        out += [(g, c) for c in g.cases]
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def kernels_on():
    """Every kernel module interpreted, and the codecs routed to them as on CUDA."""
    for name in ("fixpoint", "tah", "lowrank", "sparse", "chunk_topk"):   # imported per call
        kernels(name)
    from megatron.cc.kernels import dispatch
    orig = dispatch.enabled
    dispatch.enabled = lambda *t: True
    yield
    dispatch.enabled = orig


def _run(group, case, on: bool):
    """(sender, receiver, inputs, payloads, contexts) after every sample set was seen once."""
    xs = bench_gpu.make_inputs(group.shape, group.dtype, SETS, torch.device("cpu"))
    batch = group.shape[1] if len(group.shape) > 1 else 1

    def ctx(i):
        return bench_gpu.context(i, SETS, batch, case.per_sample)
    sender, receiver = case.make(), case.make()
    pays = [sender.encode(xs[i], ctx(i)) for i in range(SETS)]
    outs = [receiver.decode(p, group.shape, group.dtype, ctx(i)) for i, p in enumerate(pays)]
    return sender, receiver, xs, outs, ctx


def test_every_bench_codec_has_a_budget():
    assert sorted(c.label for _, c in CASES) == sorted(BUDGET)


@pytest.mark.parametrize("group,case", CASES, ids=[c.label for _, c in CASES])
def test_launches_passes_and_syncs_within_budget(group, case, kernels_on):
    sender, receiver, xs, outs, ctx = _run(group, case, on=True)
    numel = xs[0].numel()
    pays = []
    enc = count(lambda: pays.append(sender.encode(xs[0], ctx(SETS))), numel)
    dec = count(lambda: receiver.decode(pays[0], group.shape, group.dtype, ctx(SETS)), numel)
    got = (enc.launches, enc.passes, dec.launches, dec.passes)
    want = BUDGET[case.label]
    assert enc.syncs == 0 and dec.syncs == 0, (enc.ops, dec.ops)
    assert all(g <= w for g, w in zip(got, want)), (
        f"{case.label}: (encode launches, passes, decode launches, passes) {got} over the "
        f"budget {want}; encode {dict(enc.ops)}, decode {dict(dec.ops)}")


# the codecs whose kernel route is not already compared with the eager one in tests/cc/kernels
ROUTED = [(g, c) for g, c in CASES if c.codec in ("delta-lowbits", "cocktail", "int8",
                                                  "sparseloco")]


@pytest.mark.parametrize("group,case", ROUTED, ids=[c.label for _, c in ROUTED])
def test_kernel_route_decodes_like_the_eager_route(group, case, kernels_on, monkeypatch):
    """Same inputs through both routes: the decodes agree (bit for bit where the scales need
    no sum; else within the codec's own error, the fitted scales' summation order aside)."""
    _, _, xs, on, _ = _run(group, case, on=True)
    from megatron.cc.kernels import dispatch
    monkeypatch.setattr(dispatch, "enabled", lambda *t: False)
    _, _, _, off, _ = _run(group, case, on=False)
    for x, a, b in zip(xs, on, off):
        a, b, x = a.float(), b.float(), x.float()
        if "absmax" in case.label or "fp16" in case.label:
            assert torch.equal(a, b)
        else:
            err = (b - x).norm()
            assert (a - b).norm() <= 0.05 * err + 1e-6 * x.norm(), case.label
