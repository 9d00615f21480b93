"""sync.allreduce_buckets: megatron DDP's bucket all-reduce with holes for excluded params.

A stand-in for megatron DDP's buffers (buckets with grad_data, params, param_to_index and a
scaling factor) on 2 gloo ranks; holes at the start, middle, end and side by side.
"""
from types import SimpleNamespace

import pytest

from tests.distributed import run_distributed

SIZES = [5, 7, 3, 4, 6]   # params of one bucket, in buffer order; 3 padding elements follow
PAD = 3


def _fake_model(torch, rank):
    params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    grad = torch.arange(sum(SIZES) + PAD, dtype=torch.float32) * (rank + 1) + 0.25
    index, off = {}, 0
    for p, n in zip(params, SIZES):
        index[p] = (off, off + n)
        off += n
    bucket = SimpleNamespace(grad_data=grad, params=set(params), param_to_index=index,
                             gradient_scaling_factor=0.5)
    model = SimpleNamespace(buffers=[SimpleNamespace(buckets=[bucket])],
                            ddp_config=SimpleNamespace(average_in_collective=False))
    return model, params, grad


def _worker(rank, world, holes_cases):
    import torch
    import torch.distributed as dist

    from megatron.cc.grad_sync.sync import allreduce_buckets
    out = []
    for holes in holes_cases:
        model, params, grad = _fake_model(torch, rank)
        local = grad.clone()
        reference = grad.clone() * 0.5
        dist.all_reduce(reference)
        sent = allreduce_buckets(model, dist.group.WORLD, exclude=[params[i] for i in holes])
        kept = torch.ones_like(grad, dtype=torch.bool)
        for i in holes:
            a, b = model.buffers[0].buckets[0].param_to_index[params[i]]
            kept[a:b] = False
        ok = (torch.equal(grad[kept], reference[kept]) and torch.equal(grad[~kept], local[~kept]))
        out.append((ok, sent, int(kept.sum()) * 4))
    return out


CASES = [(), (0,), (2,), (4,), (1, 2), (0, 4), (0, 1, 2, 3, 4)]


@pytest.fixture(scope="module")
def results():
    return run_distributed(_worker, 2, (CASES,), timeout=60)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[str(c) for c in CASES])
def test_holes_keep_local_grads_and_reduce_the_rest(results, case):
    for per_rank in results:
        ok, sent, expected = per_rank[case]
        assert ok and sent == expected
