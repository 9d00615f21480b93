"""The planner: every candidate's flags are valid pretrain_gpt.py flags for the cluster's world
size and describe the candidate's own layout and bytes; the quality budget filters; the ranking
is by predicted step time; a slow WAN makes compression win."""
import pytest

from megatron.cc.plan.links import cluster_from_dict
from megatron.cc.plan.planner import plan
from megatron.cc.plan.shapes import ModelShape
from megatron.training.flags.arguments import parse_args

SHAPE = ModelShape(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=1024,
                   seq_length=32)
MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "32"]


def _cluster(wan_gbps):
    return cluster_from_dict({
        "nodes": 4, "gpus_per_node": 2, "tflops_per_gpu": 1, "datacentres": 2,
        "links": {"intra_node": {"bandwidth_gbps": 1000, "latency_us": 1},
                  "inter_node": {"bandwidth_gbps": 100, "latency_us": 5},
                  "inter_datacentre": {"bandwidth_gbps": wan_gbps, "latency_us": 20000}}})


@pytest.fixture(scope="module")
def candidates():
    return plan(SHAPE, _cluster(0.1), global_batch_size=32, micro_batch_size=2)


def test_flags_are_valid_and_describe_the_candidate(candidates):
    from megatron.cc.plan.channel_bytes import channel_bytes
    from megatron.cc.plan.shapes import Layout
    seen = set()
    for cand in candidates:
        key = tuple(cand.flags())
        if key in seen:
            continue
        seen.add(key)
        args = parse_args(MODEL + list(key), world_size=8)   # validates every flag
        assert (args.tp, args.pp, args.dp) == (cand.layout.tp, cand.layout.pp, cand.layout.dp)
        lay = Layout(args.tp, args.pp, args.dp, 2, args.num_microbatches,
                     train_iters=cand.layout.train_iters)
        assert channel_bytes(SHAPE, lay, args.compression) == cand.bytes
    assert len(seen) > 20


def test_ranking_and_budget(candidates, monkeypatch):
    times = [c.time.total for c in candidates]
    assert times == sorted(times)
    from megatron.cc.plan import quality
    monkeypatch.setitem(quality.GAPS, "SparseLoCo H=15", (None, "pretend unmeasured"))
    unmeasured = plan(SHAPE, _cluster(0.1), 32, 2)
    assert any(c.gap_pct is None for c in unmeasured)    # no budget: unmeasured kept
    assert all(c.gap_pct is not None for c in plan(SHAPE, _cluster(0.1), 32, 2,
                                                     budget_pct=100.0))   # a budget: left out
    within = plan(SHAPE, _cluster(0.1), 32, 2, budget_pct=1.0)
    assert within and all(c.gap_pct is not None and c.gap_pct <= 1.0 for c in within)
    assert {c.name for c in within} < {c.name for c in candidates}
    exact = plan(SHAPE, _cluster(0.1), 32, 2, budget_pct=0.0)
    assert {c.name for c in exact} == {"uncompressed"}


def test_a_slow_wan_makes_compression_win():
    fast = plan(SHAPE, _cluster(1000.0), 32, 2, budget_pct=2.0)
    slow = plan(SHAPE, _cluster(0.01), 32, 2, budget_pct=2.0)
    assert slow[0].name != "uncompressed"
    best_exact = min(c.time.total for c in slow if c.name == "uncompressed")
    assert slow[0].time.total < 0.5 * best_exact
    assert fast[0].time.total < slow[0].time.total
