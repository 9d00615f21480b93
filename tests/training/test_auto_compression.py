"""--compression auto: probes -> cluster, plan -> flags (pure functions), refused combinations,
and one 4-rank run on two emulated nodes whose log line carries the chosen flags' bytes."""
import re

import pytest

from megatron.cc.plan.links import LinkSpec
from megatron.training.flags.arguments import parse_args
from megatron.training.compression.auto_compression import (apply_candidate, build_cluster, choose,
                                                link_of, node_blocks, plan_launched, report)
from megatron.training.config.config_flags import ConfigError
from megatron.training.runtime.link_probe import Probe

SMALL, LARGE = 4096, 1 << 20
MODEL = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
         "--train-iters", "3"]


def _one_way(n, gbps, us):
    return us * 1e-6 + n / (gbps * 1e9 / 8)


def pingpong(a, b, gbps, us):
    return Probe("pp", (a, b), SMALL, LARGE, 2 * _one_way(SMALL, gbps, us),
                 2 * _one_way(LARGE, gbps, us))


def allreduce(ranks, gbps, us):
    D = len(ranks)

    def t(n):
        return 2 * (D - 1) / D * n / (gbps * 1e9 / 8) + 2 * (D - 1) * us * 1e-6
    return Probe("dp", tuple(ranks), SMALL, LARGE, t(SMALL), t(LARGE))


@pytest.mark.parametrize("probe", [pingpong(0, 1, 0.02, 20000), allreduce([0, 1, 2, 3], 10, 5)])
def test_a_probe_gives_back_the_link_it_ran_over(probe):
    link = link_of(probe)
    want = (0.02, 20000) if probe.kind == "pp" else (10, 5)
    assert link.bandwidth_gbps == pytest.approx(want[0], rel=1e-6)
    assert link.latency_us == pytest.approx(want[1], rel=1e-6)
    noisy = Probe("pp", (0, 1), SMALL, LARGE, 2e-3, 1e-3)   # the large one came back faster
    assert link_of(noisy).bandwidth_gbps > 1e3 and link_of(noisy).latency_us >= 0


def test_cluster_from_two_nodes_levels_from_the_ranks_each_probe_spans():
    nodes = ["n0", "n0", "n1", "n1"]   # pp=2 x dp=2: stage 0 on n0, stage 1 on n1
    probes = [pingpong(0, 2, 0.02, 20000), pingpong(1, 3, 0.04, 10000),
              allreduce([0, 1], 8, 5), allreduce([2, 3], 8, 5)]
    c = build_cluster(nodes, probes, 0.05, "cpu")
    assert (c.nodes, c.gpus_per_node, c.tflops_per_gpu, c.device) == (2, 2, 0.05, "cpu")
    assert c.links["inter_node"].bandwidth_gbps == pytest.approx(0.03)   # median of the two
    assert c.links["inter_node"].latency_us == pytest.approx(15000)
    assert c.links["intra_node"].bandwidth_gbps == pytest.approx(8)
    assert c.level(0, 2) == "inter_node" and c.level(2, 3) == "intra_node"


def test_single_node_has_only_intra_node_and_an_unprobed_level_is_filled():
    one = build_cluster(["h"] * 4, [allreduce([0, 1, 2, 3], 8, 5)], 1.0, "gpu")
    assert (one.nodes, one.gpus_per_node, set(one.links)) == (1, 4, {"intra_node"})
    # every channel crosses nodes: intra_node (tensor parallelism only) copies what was seen
    two = build_cluster(["a", "a", "b", "b"], [pingpong(0, 2, 1, 50)], 1.0, "gpu")
    assert two.links["intra_node"] == two.links["inter_node"] == LinkSpec(
        pytest.approx(1), pytest.approx(50))
    assert node_blocks(["a", "a", "b", "b"]) == (2, 2)
    with pytest.raises(ConfigError, match="not placed node by node"):
        node_blocks(["a", "b", "a", "b"])


def _args(*extra):
    return parse_args(["--compression", "auto", "--pipeline-model-parallel-size", "2"] + MODEL
                      + list(extra), world_size=4)


def test_a_slow_pipeline_link_picks_pipeline_codecs_and_they_are_applied():
    args = _args()
    nodes = ["0", "0", "1", "1"]
    probes = [pingpong(0, 2, 0.02, 20000), pingpong(1, 3, 0.02, 20000),
              allreduce([0, 1], 8, 5), allreduce([2, 3], 8, 5)]
    cluster = build_cluster(nodes, probes, 0.03, "cpu")
    cands = plan_launched(args, 1024, cluster)
    assert {(c.layout.tp, c.layout.pp, c.layout.dp) for c in cands} == {(1, 2, 2)}
    assert all(c.gap_pct <= 2.0 for c in cands)
    assert cands[0].time.total == min(c.time.total for c in cands)
    best, passed = choose(args, cands)
    assert not passed and best.time.total <= 1.01 * cands[0].time.total
    # within 1% of the fastest, the smallest expected loss gap
    assert best.gap_pct == min(c.gap_pct for c in cands if c.time.total <= best.time.total)
    assert best.compression.forward_compress_method == "fixpoint"   # pp crosses 20 Mbit/s
    flags = apply_candidate(args, best)
    c = args.compression
    assert (c.forward_compress_method, c.forward_bits, c.backward_compress_method) == \
        ("fixpoint", best.compression.forward_bits, "fixpoint")
    assert c.compression == "auto"   # the run stays marked as planned
    assert args.parallel.overlap_p2p_comm == ("--overlap-p2p-comm" in flags) == best.overlap
    # the flags applied are the flags a by-hand run would give: same config
    by_hand = parse_args(MODEL + ["--pipeline-model-parallel-size", "2"] + flags, world_size=4)
    assert by_hand.compression == c.replace(compression="manual")
    lines = report(cluster, probes, nodes, 1e5, cands, best, flags, 2.0)
    assert lines[-1] == "compression auto: flags: " + " ".join(flags)
    assert "inter_node 0.02 Gbit/s 2e+04 us (2 probes)" in lines[0]


def test_a_candidate_the_other_flags_refuse_is_passed_over_and_changes_nothing():
    args = _args("--optimizer", "sgd")   # DiLoCo's Adam correction needs Adam
    cluster = build_cluster(["0", "0", "1", "1"], [allreduce([0, 2], 0.001, 50000)], 0.03,
                            "cpu")
    cands = plan_launched(args, 1024, cluster)
    diloco = next(c for c in cands if "DiLoCo" in c.name)
    with pytest.raises(ConfigError, match="--dp-adam-correction"):
        apply_candidate(args, diloco)
    assert args.compression.dp_mode == "allreduce" and not args.parallel.overlap_p2p_comm
    chosen, passed = choose(args, [diloco] + cands)
    assert not chosen.compression.dp_adam_correction
    assert passed and all("--dp-adam-correction" in p for p in passed)


@pytest.mark.parametrize("extra,fragment", [
    (["--compression", "auto", "--forward-bits", "2"], "--forward-bits is chosen by "
                                                      "--compression auto"),
    (["--compression", "auto", "--dp-mode", "diloco"], "--dp-mode is chosen by --compression"),
    (["--compression", "auto", "--overlap-p2p-comm"], "--overlap-p2p-comm is chosen by"),
    (["--compression", "auto", "--pp-mode", "gpipe"], "plans a 1F1B schedule"),
    (["--quality-budget", "5"], "--quality-budget is the budget of --compression auto"),
    (["--compression", "auto", "--quality-budget", "-1"], "--quality-budget is a loss gap"),
])
def test_bad_combinations_name_the_flag(extra, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        parse_args(["--pipeline-model-parallel-size", "2"] + MODEL + extra, world_size=4)
    # what auto leaves alone is accepted
    parse_args(["--compression", "auto", "--check-comp-ratio", "--quality-budget", "1"] + MODEL,
               world_size=4)


def test_plan_compression_bytes_asks_for_the_printed_flags(capsys):
    from tools import plan_compression
    assert plan_compression.main(["bytes", "--world-size", "4", "--vocab-size", "64", "--",
                                  "--compression", "auto"]) == 2
    assert "give the flags its log printed" in capsys.readouterr().err


def test_auto_on_two_nodes_prints_the_plan_and_trains_with_its_flags(tiny_corpus, capsys):
    from bench.runlog import run_pretrain
    from tests.conftest import tiny_gpt_argv
    from tests.distributed import free_port
    from tests.tools.test_plan_compression import _logged
    from tools import plan_compression
    argv = tiny_gpt_argv(tiny_corpus, **{"pipeline-model-parallel-size": 2, "train-iters": 3,
                                         "micro-batch-size": 2, "global-batch-size": 8})
    run = run_pretrain("auto-e2e", 4, argv + ["--compression", "auto"], port=free_port(),
                       timeout=300, nodes=2)
    lines = run.log.splitlines()
    measured = next(l for l in lines if l.startswith("compression auto: measured"))
    assert "intra_node" in measured and "inter_node" in measured   # dp in a node, pp across
    rows = [l for l in lines if re.match(r"\s+\d+\s+1\s+2\s+2\s+2 ", l)]
    assert rows and len(rows) <= 10
    times = [float(r.split()[5]) for r in rows]
    assert times == sorted(times)
    assert any(l.startswith("compression auto: chose ") for l in lines)
    flags = next(l for l in lines if l.startswith("compression auto: flags: "))
    flags = flags.split(": ", 2)[2]
    flags = [] if flags.startswith("(none") else flags.split()
    logged = _logged(run.log)
    assert sorted(logged) == [1, 2, 3]
    for it in (1, 2, 3):   # the log line's bytes are those of the chosen flags given by hand
        assert plan_compression.main(["bytes", "--world-size", "4", "--iteration", str(it - 1),
                                      "--"] + argv + flags) == 0
        assert logged[it] == capsys.readouterr().out.strip().splitlines(), f"iteration {it}"
