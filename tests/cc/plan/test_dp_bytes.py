"""The dp channel: the cost model's bytes equal what the real reducers and dp modes of
megatron/cc/grad_sync count, run in one process on tensors shaped as the model's stages, with
the collectives replaced by local copies (payload sizes never depend on the peers' data)."""
import pytest
import torch
import torch.distributed as dist

from megatron.cc.config import CompressionConfig
from megatron.cc.plan.dp_bytes import stage_dp_bytes
from megatron.cc.plan.shapes import Layout, ModelShape, stage_params
from megatron.cc.common.stats import ChannelStats

D = 4
SHAPE = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1000,
                   seq_length=32)


@pytest.fixture
def fake_collectives(monkeypatch):
    """A dp group of D ranks that all hold the same data: every collective is a local copy."""
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: D)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None, async_op=False: None)
    monkeypatch.setattr(dist, "all_to_all_single",
                        lambda out, inp, group=None, **kw: out.copy_(inp))
    monkeypatch.setattr(dist, "all_gather",
                        lambda outs, t, group=None, **kw: [o.copy_(t) for o in outs])


class _Bucket:
    gradient_scaling_factor = 1.0 / D


class _Buffer:
    def __init__(self, params):
        self.params = params
        self.buckets = [_Bucket()]
        self.grad_data = torch.cat([p.main_grad.reshape(-1) for p in params])  # fp32, unpadded


class _Config:
    overlap_grad_reduce = use_distributed_optimizer = average_in_collective = False


class FakeStage(torch.nn.Module):
    """One stage of one tp rank, as megatron DDP + GPTModel present it to the dp channels."""

    def __init__(self, specs, pp: int, stage: int):
        super().__init__()
        g = torch.Generator().manual_seed(stage)
        self.plist = torch.nn.ParameterList()
        self._emb = None
        for s in specs:
            p = torch.nn.Parameter(torch.randn(s.shape, generator=g))
            p.main_grad = torch.randn(s.shape, generator=g)
            p.is_embedding_or_output_parameter = s.embedding_or_output
            if s.shared_embedding:
                self._emb = p
            self.plist.append(p)
        self.buffers = [_Buffer(list(self.plist))]
        self.ddp_config = _Config()
        self.share_embeddings_and_output_weights = True
        self.pre_process, self.post_process = stage == 0, stage == pp - 1

    def shared_embedding_or_output_weight(self):
        return self._emb

    def finish_grad_sync(self):
        pass


def _stage(pp, stage, tp=1):
    return FakeStage(stage_params(SHAPE, tp, pp, stage), pp, stage)


def _predicted(c, pp, stage, iteration=None, tp=1):
    return stage_dp_bytes(SHAPE, Layout(tp, pp, D, 1, 4, torch.float32, 100), c, stage,
                          iteration)


@pytest.mark.parametrize("pp,stage", [(1, 0), (2, 0), (2, 1)])
@pytest.mark.parametrize("kind", ["exact", "PowerSGD r4", "PowerSGD r16", "RandomizedSVD r4",
                                  "RandomizedSVD r4 niter0"])
def test_gradient_reducers(fake_collectives, kind, pp, stage):
    from megatron.cc.data_parallel.powersgd import PowerSGDDataParallelSync
    from megatron.cc.data_parallel.randomized_svd import RandomizedSVDDataParallelSync
    from megatron.cc.grad_sync.sync import ExactDataParallelSync
    stats = ChannelStats()
    rank = int(kind.split(" r")[1].split()[0]) if " r" in kind else 128
    if kind == "exact":
        c, sync = CompressionConfig(), ExactDataParallelSync(None, stats)
    elif kind.startswith("PowerSGD"):
        c = CompressionConfig(grad_comp=True, grad_comp_rank=rank)
        sync = PowerSGDDataParallelSync(None, stats, rank=rank)
    else:
        niter = 0 if "niter0" in kind else None
        c = CompressionConfig(grad_comp=True, grad_comp_rank=rank,
                              grad_comp_type="RandomizedSVD", grad_comp_niter=niter)
        sync = RandomizedSVDDataParallelSync(None, stats, rank=rank,
                                             niter=1 if niter is None else niter)
    sync(_stage(pp, stage), 0)
    got = stats.snapshot()["dp"]
    want = _predicted(c, pp, stage)
    assert (got["sent"], got["raw"]) == (want["sent"], want["raw"])
    if kind != "exact":
        assert got["sent"] < got["raw"]


def test_fused_embedding_leaves_the_dp_channel(fake_collectives):
    from megatron.cc.data_parallel.powersgd import PowerSGDDataParallelSync
    stats = ChannelStats()
    c = CompressionConfig(grad_comp=True, grad_comp_rank=4, emb_comm_opt=True)
    PowerSGDDataParallelSync(None, stats, rank=4, exclude_embedding=True)(_stage(2, 1), 0)
    got, want = stats.snapshot()["dp"], _predicted(c, 2, 1)
    assert (got["sent"], got["raw"]) == (want["sent"], want["raw"])
    assert want["raw"] < _predicted(CompressionConfig(grad_comp=True, grad_comp_rank=4), 2, 1)["raw"]


def _run_mode(sync, model, iters):
    for it in iters:
        sync(model, it)
        sync.after_optimizer_step(model, it)


@pytest.mark.parametrize("pp,stage", [(1, 0), (2, 1)])
def test_cocktail_sgd(fake_collectives, pp, stage):
    from megatron.cc.data_parallel.cocktail_sync import CocktailSGDSync
    from megatron.cc.data_parallel.sharded_exchange import ShardedExchange
    from megatron.cc.data_parallel.cocktail_sgd import flat_codec
    c = CompressionConfig(dp_mode="cocktail_sgd", cocktail_random_ratio=0.125,
                          cocktail_topk_ratio=1.0, cocktail_bits=2, cocktail_no_overlap=True,
                          cocktail_warmup_steps=1)
    stats = ChannelStats()
    ex = ShardedExchange(None, flat_codec(c, "cocktail"), flat_codec(c, "cocktail"))
    sync = CocktailSGDSync(None, stats, ex, warmup_steps=1, overlap=False)
    model = _stage(pp, stage)
    _run_mode(sync, model, [0])                    # the warm-up step: exact all-reduce
    assert stats.snapshot()["dp"]["sent"] == _predicted(c, pp, stage, iteration=0)["sent"]
    stats.reset()
    _run_mode(sync, model, [1, 2, 3])
    got, want = stats.snapshot()["dp"], _predicted(c, pp, stage)
    assert (got["sent"], got["raw"]) == (3 * want["sent"], 3 * want["raw"])


@pytest.mark.parametrize("compression", ["none", "int8", "fixpoint-4", "fp16", "powersgd-4",
                                         "powersgd-40"])
@pytest.mark.parametrize("fragments,delay", [(1, 0), (2, 1)])
def test_diloco(fake_collectives, compression, fragments, delay):
    from megatron.cc.data_parallel.diloco_sync import DiLoCoSync
    from megatron.cc.data_parallel.lowrank_exchange import PowerSGDExchange
    from megatron.cc.data_parallel.sharded_exchange import ShardedExchange
    from megatron.cc.data_parallel.cocktail_sgd import flat_codec
    H = 4
    c = CompressionConfig(dp_mode="diloco", diloco_inner_steps=H, diloco_compression=compression,
                          diloco_fragments=fragments, diloco_sync_delay=delay)
    if compression.startswith("powersgd"):   # rank 40: some matrices too small to pay
        ex = PowerSGDExchange(None, int(compression.split("-")[1]))
    else:
        ex = None if compression == "none" else ShardedExchange(
            None, flat_codec(c, compression), flat_codec(c, compression))
    _check_periodic(DiLoCoSync(None, ChannelStats(), H, exchange=ex, fragments=fragments,
                               sync_delay=delay), c, H)


@pytest.mark.parametrize("compression,delay", [("none", 0), ("fixpoint-2", 1)])
def test_diloco_sync_schedule(fake_collectives, compression, delay):
    """--diloco-sync-steps 2,5,7 with H 4: syncs after steps 2, 5, 7, 11, 15; each counts the
    all-reduce of its window (2, 3, 2, 4, 4 steps) as raw, tau steps later; the planner's
    per-iteration bytes are the logged ones, and its average is one sync per mean window."""
    from megatron.cc.data_parallel.diloco_sync import DiLoCoSync
    from megatron.cc.data_parallel.sharded_exchange import ShardedExchange
    from megatron.cc.data_parallel.cocktail_sgd import flat_codec
    H, steps = 4, (2, 5, 7)
    c = CompressionConfig(dp_mode="diloco", diloco_inner_steps=H, diloco_compression=compression,
                          diloco_sync_delay=delay, diloco_sync_steps="2,5,7")
    ex = None if compression == "none" else ShardedExchange(
        None, flat_codec(c, compression), flat_codec(c, compression))
    sync = DiLoCoSync(None, ChannelStats(), H, exchange=ex, sync_delay=delay, sync_steps=steps)
    model = _stage(2, 0)
    n = sum(p.numel() for p in model.parameters())
    windows = {}
    for it in range(16):
        sync.stats.reset()
        _run_mode(sync, model, [it])
        got = sync.stats.snapshot().get("dp", {"sent": 0, "raw": 0})
        want = _predicted(c, 2, 0, iteration=it)
        assert (got["sent"], got["raw"]) == (want["sent"], want["raw"]), it
        if got["raw"]:
            windows[it + 1 - delay] = got["raw"] // (4 * n)
    assert windows == {2: 2, 5: 3, 7: 2, 11: 4, 15: 4}
    avg = _predicted(c, 2, 0)
    assert avg["sent"] * 7 / 3 == pytest.approx(_predicted(c, 2, 0, iteration=1 + delay)["sent"])
    assert avg["raw"] == pytest.approx(4 * n)


def test_sync_schedule_functions():
    """An empty schedule is every H (the old rule); a schedule, then every H after it."""
    from megatron.cc.data_parallel.sync_schedule import previous_sync, scheduled, shortest_window
    for step in range(1, 40):
        assert scheduled(step, 5) == (step % 5 == 0)
        assert previous_sync(step, 5) == (step - 1) // 5 * 5
    assert [s for s in range(1, 30) if scheduled(s, 10, (3, 4, 12))] == [3, 4, 12, 22]
    assert [previous_sync(s, 10, (3, 4, 12)) for s in (1, 3, 4, 5, 12, 13, 22, 23)] == \
        [0, 0, 3, 4, 4, 12, 12, 22]
    assert shortest_window((3, 4, 12)) == 1 and shortest_window((6,)) == 6


def test_diloco_powersgd_formula():
    """The planner's low-rank bytes are the docstring's formula, by hand: 4 r (n + m) per
    matrix worth compressing, 4 per exactly sent value (vectors, small matrices)."""
    from megatron.cc.data_parallel.lowrank_exchange import sync_bytes
    assert sync_bytes([(1000, 64), (64,), (3, 4, 5)], 4) == 4 * 4 * 1064 + 4 * 64 + 4 * 60
    assert sync_bytes([(8, 8)], 4) == 4 * 64   # r (n + m) = n m: sent exactly
    c = CompressionConfig(dp_mode="diloco", diloco_inner_steps=10, diloco_compression="powersgd-4")
    specs = stage_params(SHAPE, 1, 1, 0)
    want = sum(4 * 4 * (s.shape[0] + s.numel // s.shape[0]) if len(s.shape) == 2 else 4 * s.numel
               for s in specs)
    got = _predicted(c, 1, 0)
    assert got["sent"] == pytest.approx(want / 10) and got["raw"] == pytest.approx(
        4 * sum(s.numel for s in specs))
    assert got["raw"] * 10 / want > 30   # the demo-like model: low rank pays


def test_sparseloco(fake_collectives):
    from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
    from megatron.cc.data_parallel.sparseloco_sync import SparseLoCoSync
    H = 3
    c = CompressionConfig(dp_mode="sparseloco", diloco_inner_steps=H, sparseloco_chunk_size=256,
                          sparseloco_density=0.125, sparseloco_bits=3)
    codec = ChunkTopKCodec(c.sparseloco_density, c.sparseloco_chunk_size, c.sparseloco_bits)
    _check_periodic(SparseLoCoSync(None, ChannelStats(), codec, inner_steps=H), c, H)


def _check_periodic(sync, c, H):
    """Iteration by iteration over two periods, then the steady-state average."""
    model = _stage(2, 0)
    steps = 2 * H
    for it in range(steps):
        sync.stats.reset()
        _run_mode(sync, model, [it])
        got = sync.stats.snapshot().get("dp", {"sent": 0, "raw": 0})
        want = _predicted(c, 2, 0, iteration=it)
        assert (got["sent"], got["raw"]) == (want["sent"], want["raw"]), it
    avg = _predicted(c, 2, 0)
    per_period = sum(_predicted(c, 2, 0, iteration=it)["sent"] for it in range(H, 2 * H))
    assert avg["sent"] == pytest.approx(per_period / H)
