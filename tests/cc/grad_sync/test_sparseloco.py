"""SparseLoCo on plain tensors (4 gloo ranks, one spawn for every check).

- the all-gather exchange: the same mean on every replica, == the mean of what each replica
  says it sent; bytes counted == floor(D P / 2) == sparseloco.sync_bytes;
- per sync, the bytes the stats log == the module docstring's formula, raw == 4 n H;
- error feedback: the codec's input is Delta + beta e_old (to one fp32 rounding), the new
  error is exactly input - sent, so sent + e_new == e_old decayed + Delta;
- density 1 at 8 bits, beta 1, approximates DiLoCo with the same outer SGD (momentum 0);
- state_dict / load_state_dict resume a run bit-exactly (error buffers, global copy).
"""
import pytest
import torch
import torch.distributed as dist

from tests.cc.grad_sync.inner_steps import drive, final_after_resume
from tests.distributed import by_value as _np, run_distributed

N = 9000   # not a multiple of the chunk: a padded last chunk


class _Recorder:
    """Wraps an exchange: keeps (input, what was sent) of every call."""

    def __init__(self, exchange):
        self.inner, self.calls = exchange, []

    def __call__(self, x, step, key="", shapes=()):
        x_in = x.clone()
        mean, dq, counted = self.inner(x, step, key, shapes)
        self.calls.append((x_in, dq.clone()))
        return mean, dq, counted

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _linear(seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(60, 50)      # 3050 parameters
    for p in lin.parameters():
        dist.broadcast(p.data, 0)
    return lin


def _worker(rank, world):
    from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
    from megatron.cc.data_parallel.diloco_sync import DiLoCoSync
    from megatron.cc.data_parallel.gather_exchange import GatherExchange
    from megatron.cc.grad_sync.param_sync import flatten
    from megatron.cc.data_parallel.sparseloco_sync import SparseLoCoSync, sync_bytes
    from megatron.cc.common.stats import ChannelStats
    out = {}
    gen = torch.Generator().manual_seed(rank)
    # 1. the exchange
    codec = ChunkTopKCodec(1 / 64, 4096, 2)
    ex = GatherExchange(dist.group.WORLD, codec)
    x = torch.randn(N, generator=gen) * (1 + rank)
    mean, dq, counted = ex(x, 0)
    dqs = [torch.empty_like(dq) for _ in range(world)]
    dist.all_gather(dqs, dq)
    out["exchange"] = (mean, torch.stack(dqs).mean(0), counted, sync_bytes(N, world, codec),
                       codec.nbytes(N))
    # 2. error feedback and logged bytes through the DiLoCo loop (H = 3, two fragments)
    stats = ChannelStats()
    sync = SparseLoCoSync(dist.group.WORLD, stats, ChunkTopKCodec(0.05, 256, 2),
                          inner_steps=4, outer_lr=1.0, error_decay=0.9, fragments=2)
    sync.exchange = rec = _Recorder(sync.exchange)
    model = _linear()
    states = []
    drive(sync, model, gen, 12, record=states)
    sizes = [g.numel() for g in sync.global_copy]
    out["feedback"] = (rec.calls, states, sizes, dict(stats.sent), dict(stats.raw),
                       dict(stats.messages))
    # 3. density 1, 8 bits, beta 1 against DiLoCo (exact all-reduce, outer SGD, no momentum)
    finals = []
    for make in (lambda: SparseLoCoSync(dist.group.WORLD, ChannelStats(),
                                        ChunkTopKCodec(1.0, 128, 8), inner_steps=3,
                                        outer_lr=0.7, error_decay=1.0),
                 lambda: DiLoCoSync(dist.group.WORLD, ChannelStats(), inner_steps=3,
                                    outer_lr=0.7, outer_momentum=0.0)):
        g = torch.Generator().manual_seed(100 + rank)
        model = _linear()
        start = flatten(list(model.parameters()))
        drive(make(), model, g, 12)
        finals.append((flatten(list(model.parameters())), start))
    out["dense"] = finals
    # 4. resume: 6 iterations, state_dict -> a fresh sync -> 6 more == 12 straight
    def run(split):
        model = _linear()
        make = lambda: SparseLoCoSync(dist.group.WORLD, ChannelStats(),   # noqa: E731
                                      ChunkTopKCodec(0.1, 128, 2, stochastic=True, seed=rank),
                                      inner_steps=4, fragments=2, sync_delay=1)
        return final_after_resume(make, model, torch.Generator().manual_seed(200 + rank), split)
    out["resume"] = (run(12), run(6))
    return _np(out)


@pytest.fixture(scope="module")
def results():
    return run_distributed(_worker, 4, timeout=300)


def test_exchange_agrees_and_counts_the_formula(results):
    import numpy as np
    mean0 = results[0]["exchange"][0]
    for r in results:
        mean, mean_sent, counted, formula, payload = r["exchange"]
        np.testing.assert_array_equal(mean, mean0)                 # bit-identical everywhere
        np.testing.assert_allclose(mean, mean_sent, rtol=0, atol=1e-6)
        # m = 3 chunks, k = 64: indices ceil(192*12/8) = 288, codes 48, scales 6 -> 342 B
        assert payload == 342 and counted == formula == 4 * 342 // 2


def test_error_feedback_and_logged_bytes(results):
    import numpy as np
    from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
    from megatron.cc.data_parallel.sparseloco_sync import sync_bytes
    for r in results:
        calls, states, sizes, sent, raw, messages = r["feedback"]
        # fragment f syncs after step s when s > 2f and (s - 2f) % 4 == 0: f0 at 4, 8, 12;
        # f1 at 6, 10 -> 5 syncs, in this order
        order = [(0, 3), (1, 5), (0, 7), (1, 9), (0, 11)]
        assert len(calls) == len(order) and messages == {"dp": 5}
        codec = ChunkTopKCodec(0.05, 256, 2)
        assert sent == {"dp": sum(sync_bytes(sizes[f], 4, codec) for f, _ in order)}
        assert raw == {"dp": sum(4 * sizes[f] * 4 for f, _ in order)}
        e_old = [np.zeros(n, dtype=np.float32) for n in sizes]
        for (f, it), (x_in, dq) in zip(order, calls):
            delta, errors = states[it]
            np.testing.assert_allclose(x_in, delta[f] + 0.9 * e_old[f], rtol=0, atol=1e-6)
            np.testing.assert_array_equal(errors[f], x_in - dq)       # e_new = input - sent
            np.testing.assert_allclose(dq + errors[f], delta[f] + 0.9 * e_old[f], rtol=0,
                                       atol=1e-6)
            assert np.abs(errors[f]).max() > 0.01                      # something held back
            assert np.count_nonzero(dq) <= -(-sizes[f] // 256) * 13   # k = 13 per chunk
            e_old[f] = errors[f]


def test_density_one_8_bits_approximates_diloco(results):
    import numpy as np
    for r in results:
        (sparse, start), (diloco, start2) = r["dense"]
        np.testing.assert_array_equal(start, start2)
        moved = np.abs(diloco - start).max()
        assert np.abs(sparse - diloco).max() < 0.02 * moved, (np.abs(sparse - diloco).max(), moved)


def test_resume_is_bit_exact(results):
    import numpy as np
    for r in results:
        straight, resumed = r["resume"]
        np.testing.assert_array_equal(straight, resumed)
