"""PowerSGD on the dp channel against PyTorch's own powerSGD_hook, run inside a torch DDP model.

Both sides see the same per-rank gradients (the DDP model's loss is sum(p * G), so p.grad = G)
and start from the same Q (ours, copied into the hook's state before its first compressed
step). The hook's exact all-reduce for its first `start_powerSGD_iter` steps is our warm-up.
Compared after every compressed step: synchronised gradients, error buffers of compressed
tensors, and Q (column signs aside: for r > 2 the hook orthogonalises by QR, whose columns may
differ from Gram-Schmidt's by a sign that cancels in P Q^T).
"""
import math

import pytest

from tests.distributed import run_distributed

TOL = 1e-5
# (n, m) distinct: the hook's flat Q order groups equal shapes; ours follows parameter order.
SHAPES = [(16, 12), (8,), (24, 8), (10, 3, 4), (5, 40), (6, 2), (12,)]
STEPS, START = 6, 2


def _hook_order(bucket, rank):
    """Parameters the hook compresses, in the order of its flat P/Q memory."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress
    groups = {}
    for g, p in zip(bucket.gradients(), bucket.parameters()):
        n, m = g.view(g.shape[0], -1).shape
        if _should_compress(n, m, min(n, m, rank), 1)[0]:
            groups.setdefault((n, m), []).append(p)
    return [p for ps in groups.values() for p in ps]


def _oracle_worker(rank, world, r):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (PowerSGDState,
                                                                           powerSGD_hook)
    from torch.nn.parallel import DistributedDataParallel as DDP

    from megatron.cc.data_parallel.powersgd import PowerSGDDataParallelSync, worth_compressing
    from megatron.cc.common.stats import ChannelStats

    class Grads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES])

        def forward(self, grads):
            return sum((p * g).sum() for p, g in zip(self.ps, grads))

    module = Grads()
    names = {p: str(i) for i, p in enumerate(module.ps)}
    ddp = DDP(module, process_group=dist.group.WORLD)
    state = PowerSGDState(dist.group.WORLD, matrix_approximation_rank=r, start_powerSGD_iter=START,
                          min_compression_rate=1, use_error_feedback=True, warm_start=True,
                          orthogonalization_epsilon=1e-8, batch_tensors_with_same_shape=False)
    ours = PowerSGDDataParallelSync(dist.group.WORLD, ChannelStats(), rank=r, seed=7)
    seen = {}

    def hook(st, bucket):
        if st.iter >= st.start_powerSGD_iter and bucket.index() not in st.p_memory_dict:
            order = _hook_order(bucket, r)  # hand the hook our initial Qs
            st.q_memory_dict[bucket.index()] = torch.cat([ours.qs[names[p]].reshape(-1)
                                                          for p in order])
            st.p_memory_dict[bucket.index()] = torch.empty(sum(p.shape[0] * r for p in order))
        base = bucket.buffer().data_ptr()
        seen[bucket.index()] = [(names[p], (g.data_ptr() - base) // 4, g.numel())
                                for g, p in zip(bucket.gradients(), bucket.parameters())]
        return powerSGD_hook(st, bucket)

    ddp.register_comm_hook(state, hook)
    compress_names = [str(i) for i, s in enumerate(SHAPES) if worth_compressing(s, r)]
    ours.init_state([(str(i), torch.zeros(SHAPES[i][0], math.prod(SHAPES[i][1:])))
                     for i in map(int, compress_names)])
    diffs = {"grad": 0.0, "error": 0.0, "q": 0.0}
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        grads = [torch.randn(s, generator=gen) for s in SHAPES]
        for p in module.ps:
            p.grad = None
        ddp(grads).backward()
        if step < START:
            continue
        mine = [g.clone() for g in grads]
        compress = [(str(i), g.view(g.shape[0], -1)) for i, g in enumerate(mine)
                    if str(i) in compress_names]
        exact = [g for i, g in enumerate(mine) if str(i) not in compress_names]
        assert len(seen) == 1  # one DDP bucket
        sent, raw = ours.reduce(compress, exact)
        diffs["ratio"], diffs["hook_ratio"] = raw / sent, state.compression_stats()[0]
        mean = [g.clone() for g in grads]
        for g in mean:
            dist.all_reduce(g)
            g /= world
        diffs["lossy"] = max(float((mean[int(n)] - mine[int(n)]).abs().max())
                             for n in compress_names)  # not vacuous: PowerSGD is not exact
        for p, g in zip(module.ps, mine):
            diffs["grad"] = max(diffs["grad"], float((p.grad - g).abs().max()))
        (index, layout), = seen.items()
        for name, off, numel in layout:
            if name in compress_names:
                e_hook = state.error_dict[index][off:off + numel]
                e_ours = ours.errors[name].reshape(-1)
                diffs["error"] = max(diffs["error"], float((e_hook - e_ours).abs().max()))
        q_off = 0
        for p in _hook_order(_FakeBucket(module, layout, names), r):
            q_ours = ours.qs[names[p]]
            q_hook = state.q_memory_dict[index][q_off:q_off + q_ours.numel()].view_as(q_ours)
            q_off += q_ours.numel()
            sign = torch.sign((q_hook * q_ours).sum(0))  # QR vs Gram-Schmidt column signs
            diffs["q"] = max(diffs["q"], float((q_hook * sign - q_ours).abs().max()))
    return diffs


class _FakeBucket:
    """The bucket's (gradient, parameter) order, replayed for _hook_order outside the hook."""

    def __init__(self, module, layout, names):
        by_name = {names[p]: p for p in module.ps}
        self._params = [by_name[n] for n, _, _ in layout]

    def gradients(self):
        return [p.detach() for p in self._params]

    def parameters(self):
        return self._params


RANKS = [1, 2, 4]  # r <= 2: the hook uses Gram-Schmidt, r > 2: QR


def _all_ranks_worker(rank, world):
    return {r: _oracle_worker(rank, world, r) for r in RANKS}


@pytest.fixture(scope="module")
def oracle_results():
    return run_distributed(_all_ranks_worker, 2, timeout=90)  # one job for every r


@pytest.mark.parametrize("r", RANKS)
def test_powersgd_matches_torch_powersgd_hook(oracle_results, r):
    for rank, by_r in enumerate(oracle_results):
        d = by_r[r]
        print(f"r={r} rank={rank} max|diff| grad={d['grad']:.2e} error={d['error']:.2e} "
              f"q={d['q']:.2e} ratio={d['ratio']:.2f}")
        assert d["grad"] <= TOL and d["error"] <= TOL and d["q"] <= TOL, (rank, d)
        assert d["ratio"] > 1 and d["hook_ratio"] > 1 and d["lossy"] > 0.1, d
