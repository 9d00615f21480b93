"""tools/plan_compression.py: `bytes` prints, line for line, what a real pretrain_gpt.py run logs
(one short run at pp=2 x dp=2 with a codec on every channel, launched as two emulated nodes
whose traffic the log line splits); `plan` ranks candidates and plots; bad input is refused
with the flag (or YAML key) named."""
import json
import re

import pytest

from bench.runlog import run_pretrain
from tests.conftest import tiny_gpt_argv
from tests.distributed import free_port
from tools import plan_compression

# a codec on every channel: fixpoint-4 activations, CB rank 4 gradients, PowerSGD rank 4 on
# dp, fused embedding sync with PowerSGD rank 2 (no warm-ups in 3 iterations)
E2E = {"pipeline-model-parallel-size": 2, "train-iters": 3, "log-interval": 1,
       "micro-batch-size": 2, "global-batch-size": 8, "forward-compress-method": "fixpoint",
       "forward-bits": 4, "inter-grad-comp": True, "inter-grad-comp-rank": 4,
       "grad-comp": True, "grad-comp-rank": 4, "emb-comm-opt": True, "emb-grad-comp": True,
       "emb-grad-comp-rank": 2}
_CHANNEL = re.compile(r"((?:pp-fwd|pp-bwd|dp|emb) bytes: [\d.]+[KMG]?B \(x[\d.inf]+\))")
_INTER = re.compile(r"(pp-fwd|pp-bwd|dp|emb) inter-node bytes: ([\d.]+[KMG]?B)")


def _logged(log: str):
    """{iteration: [channel fields of its log line]}."""
    out = {}
    for line in log.splitlines():
        m = re.search(r" iteration\s+(\d+)/", line)
        if m:
            out[int(m.group(1))] = _CHANNEL.findall(line)
    return out


def _predicted(capsys, argv):
    assert plan_compression.main(argv) == 0
    return capsys.readouterr().out.strip().splitlines()


def test_bytes_equal_the_logged_bytes_of_a_real_run(tiny_corpus, capsys):
    argv = tiny_gpt_argv(tiny_corpus, **E2E)
    # two torchrun agents: ranks 0, 1 (stage 0) on node 0, ranks 2, 3 (stage 1) on node 1
    run = run_pretrain("plan-e2e", 4, argv, port=free_port(), timeout=300, nodes=2)
    logged = _logged(run.log)
    assert sorted(logged) == [1, 2, 3]
    # what left the node: every pipeline message and the embedding sync (first and last
    # stage), none of the dp all-reduce (each replica pair is on one node)
    lines = [l for l in run.log.splitlines() if re.search(r" iteration\s+\d+/", l)]
    for line, fields in zip(lines, (logged[i] for i in (1, 2, 3))):
        total = {f.split(" bytes: ")[0]: f.split(" bytes: ")[1].split(" ")[0] for f in fields}
        inter = dict(_INTER.findall(line))
        assert inter == {c: total[c] for c in ("pp-fwd", "pp-bwd", "emb")}, line
        assert "pp-fwd inter-node wait ms" in line and "dp inter-node" not in line
    for it in (1, 2, 3):   # the log counts iterations from 1, the codecs' policies from 0
        predicted = _predicted(capsys, ["bytes", "--world-size", "4", "--iteration",
                                        str(it - 1), "--"] + argv)
        assert logged[it] == predicted, f"iteration {it}"
    assert [x.split(" bytes")[0] for x in predicted] == ["pp-fwd", "pp-bwd", "dp", "emb"]
    # and the ratios are real compression (the line is not trivially equal to raw)
    assert all("(x1.0)" not in x for x in predicted)


CLUSTER = """nodes: 4
gpus_per_node: 2
tflops_per_gpu: 50
datacentres: 2
links:
  intra_node: {bandwidth_gbps: 1000, latency_us: 2}
  inter_node: {bandwidth_gbps: 100, latency_us: 5}
  inter_datacentre: {bandwidth_gbps: 0.1, latency_us: 20000}
"""
MODEL = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32"


@pytest.fixture
def cluster_yaml(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    return str(path)


def test_plan_prints_ranked_candidates_flags_and_a_plot(cluster_yaml, tmp_path, capsys):
    png = tmp_path / "plot.png"
    assert plan_compression.main(["plan", "--model", MODEL, "--cluster", cluster_yaml,
                                  "--global-batch-size", "32", "--micro-batch-size", "2",
                                  "--vocab-size", "1024", "--quality-budget", "2",
                                  "--top", "5", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    rows = [l for l in out.splitlines() if re.match(r"\s+\d+ ", l)]
    assert len(rows) == 5
    times = [float(r.split()[5]) for r in rows]
    assert times == sorted(times)
    flags = next(l for l in out.splitlines() if l.startswith("flags: ")).split()[1:]
    from megatron.training.flags.arguments import parse_args
    parse_args(MODEL.split() + flags, world_size=8)   # the recommendation is runnable
    assert png.stat().st_size > 10_000


def test_plan_with_measured_codec_speeds(cluster_yaml, tmp_path, capsys):
    """--codec-speeds replaces the device's codec throughputs (a bench_gpu.py --json file):
    codecs a thousand times slower make every compressed pipeline slower to run."""
    argv = ["plan", "--model", MODEL, "--cluster", cluster_yaml, "--global-batch-size", "32",
            "--micro-batch-size", "2", "--vocab-size", "1024", "--top", "100"]

    def fixpoint_rows(extra):
        assert plan_compression.main(argv + extra) == 0
        out = capsys.readouterr().out
        return out, {tuple(l.split()[1:5]) + (l.split(None, 12)[-1],): float(l.split()[5])
                     for l in out.splitlines()
                     if re.match(r"\s+\d+ ", l) and "fwd fixpoint" in l}
    _, base = fixpoint_rows([])
    from megatron.cc.plan.step_time import CODEC_THROUGHPUT_GBS
    slow = {k: v / 1000 for k, v in CODEC_THROUGHPUT_GBS["gpu"].items()}
    path = tmp_path / "speeds.json"
    path.write_text(json.dumps({"codec_throughput_gbs": slow}))
    out, measured = fixpoint_rows(["--codec-speeds", str(path)])
    assert f"codec speeds: {path}" in out
    common = set(base) & set(measured)
    assert common and all(measured[k] > base[k] for k in common)
    path.write_text('{"codec_throughput_gbs": {"fixpoint": -1}}')
    assert plan_compression.main(argv + ["--codec-speeds", str(path)]) == 2
    assert f"--codec-speeds {path}: codec_throughput_gbs.fixpoint is -1" in \
        capsys.readouterr().err


def test_plan_from_a_hugging_face_config(cluster_yaml, tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, '
                   '"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, '
                   '"vocab_size": 1000, "max_position_embeddings": 128, '
                   '"tie_word_embeddings": false}')
    assert plan_compression.main(["plan", "--model", str(cfg), "--cluster", cluster_yaml,
                                  "--seq-length", "64", "--global-batch-size", "16",
                                  "--micro-batch-size", "1", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "model: 0.00B parameters" in out and "recommended:" in out


@pytest.mark.parametrize("argv,fragment", [
    (["bytes", "--world-size", "3", "--vocab-size", "64", "--pipeline-model-parallel-size",
      "2"], "world size (3) is not divisible"),
    (["bytes", "--world-size", "2", "--vocab-size", "64", "--dp-mode", "preduce"],
     "--dp-mode preduce: its exchanges depend on which replicas are ready"),
    (["bytes", "--world-size", "2", "--vocab-size", "64", "--use-distributed-optimizer",
      "--bf16"], "--use-distributed-optimizer pads the gradient buckets"),
    (["bytes", "--world-size", "2", "--vocab-size", "64", "--pipeline-model-parallel-size",
      "2", "--forward-compress-method", "fixpoint", "--warmup-epochs", "1", "--iteration", "0"],
     "--warmup-epochs needs the iterations per epoch"),
    (["plan", "--model", MODEL, "--cluster", "CLUSTER", "--num-layers", "8"],
     "unrecognised arguments: --num-layers 8"),
    (["plan", "--model", "nothere.json", "--cluster", "CLUSTER"],
     "--model nothere.json: cannot read it as a config.json"),
])
def test_bad_input_is_named(argv, fragment, cluster_yaml, capsys):
    argv = [cluster_yaml if a == "CLUSTER" else a for a in argv]
    assert plan_compression.main(argv) == 2
    assert fragment in capsys.readouterr().err


def test_bad_cluster_yaml_is_named(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER.replace("latency_us: 5", "latency: 5"))
    assert plan_compression.main(["plan", "--model", MODEL, "--cluster", str(path)]) == 2
    err = capsys.readouterr().err
    assert "links.inter_node.latency: unknown key; use bandwidth_gbps and latency_us" in err


def test_bytes_without_traffic_and_help(capsys):
    assert plan_compression.main(["bytes", "--world-size", "1", "--vocab-size", "64"]) == 0
    assert "no channel carries traffic" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        plan_compression.main(["plan", "--help"])
    assert "--quality-budget" in capsys.readouterr().out
