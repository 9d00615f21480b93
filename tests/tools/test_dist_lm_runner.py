"""tools/dist_lm_runner.py runs the seeds' README commands, one process per rank with --rank and
--dist-url as the READMEs launch them: AC-SGD's example (delta activations + fixpoint
gradients, GPipe), TAH-Quant's (tha), and CocktailSGD's OPT script (--dp-mode cocktail_sgd, pp 2
x dp 2). Shrunk: 2 stages, a 4-layer width-32 GPT-2 (or OPT) saved with save_pretrained, a local
jsonl task. The loss must fall."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.distributed import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.path.join(ROOT, "tools", "dist_lm_runner.py")


@pytest.fixture(scope="module")
def seed_inputs(tiny_corpus, tmp_path_factory):
    """A random GPT-2 directory with its tokenizer, and a 24-document jsonl task."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from megatron.training.data.tokenizer import build_tokenizer
    root = tmp_path_factory.mktemp("seed_runner")
    tok = build_tokenizer("GPT2BPETokenizer", tiny_corpus["vocab"], tiny_corpus["merges"])
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=4,
                        n_head=4, bos_token_id=tok.eod, eos_token_id=tok.eod,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model_dir = str(root / "gpt2-tiny")
    GPT2LMHeadModel(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    task = str(root / "task.jsonl")
    texts = [json.loads(line)["text"] for line in open(tiny_corpus["jsonl"])][:24]
    with open(task, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t[:500]}) + "\n")
    return {"model": model_dir, "task": task, "root": root}


def _args(inputs, **over):
    """The README example's ARGS, shrunk (values in `over` replace or add flags)."""
    flags = {"--model-name": inputs["model"], "--tokenizer-name": inputs["model"],
             "--load-pretrained-model": "true", "--task-name": inputs["task"],
             "--n-epochs": 4, "--warmup-epochs": 1, "--num-layers": 2, "--num-heads": 4,
             "--embedding-dim": 32, "--num-iters": 10000000, "--lr": 5e-3, "--seq-length": 32,
             "--batch-size": 8, "--micro-batch-size": 2,
             "--forward-compress-method": "delta", "--forward-bits": 4,
             "--backward-compress-method": "fixpoint", "--backward-bits": 8,
             "--world-size": 2, "--pipeline-group-size": 2, "--pp-mode": "gpipe",
             "--profiling": "no-profiling", "--do-evaluation": "true",
             "--use-cuda": "false", "--runner-cache-dir": str(inputs["root"] / "cache")}
    flags.update(over)
    argv = []
    for k, v in flags.items():
        if v is not None:
            argv += [k, str(v)]
    return argv


def _launch(args, cwd, timeout=600, ranks=2, env=None):
    """One process per rank: `python dist_lm_runner.py $ARGS --cuda-id 0 --rank i`."""
    url = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, **(env or {}))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    procs = [subprocess.Popen([sys.executable, RUNNER] + args + ["--dist-url", url,
                                                                  "--cuda-id", "0",
                                                                  "--rank", str(i)],
                              cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(ranks)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], outs


def _losses(out):
    return [float(x) for x in re.findall(r"\| lm loss: ([0-9.E+-]+)", out)]


@pytest.mark.parametrize("name,over", [
    ("AC-SGD", {}),
    ("TAH-Quant", {"--forward-compress-method": "tha", "--tile-size": 16,
                   "--high-precision-bits": 4, "--low-precision-bits": 3,
                   "--high-precision-allocation-ratio": 0.8, "--forward-bits": 4,
                   "--backward-tile-size": 16, "--backward-bits": 6, "--warmup-epochs": 0,
                   "--do-evaluation": "false", "--profiling": "tidy_profiling", "--n-epochs": 3}),
])
def test_readme_example_trains_with_falling_loss(seed_inputs, tmp_path, name, over):
    codes, outs = _launch(_args(seed_inputs, **over), cwd=tmp_path)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
    command = re.search(r"pretrain_gpt\.py (.*)", outs[0]).group(1)
    assert "--pp-mode gpipe" in command and "--pipeline-model-parallel-size 2" in command
    assert "--num-layers 4" in command                  # 2 per stage x 2 stages
    assert "--load" in command and "--finetune" in command
    losses = _losses(outs[1])                           # the last stage logs the loss
    assert len(losses) >= 3, outs[1][-3000:]
    print(f"\n{name}: lm loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} log lines")
    assert losses[-1] < losses[0] - 0.3
    if name == "AC-SGD":
        assert "--forward-compress-method delta" in command and "--warmup-epochs 1" in command
        assert "validation loss at iteration" in outs[1]
    else:
        assert "--forward-compress-method tah" in command
        traces = os.listdir(tmp_path / "trace_json")
        assert len(traces) == 2 and all(t.endswith("_tidy_profiling_default.json") for t in traces)
        trace = json.load(open(tmp_path / "trace_json" / sorted(traces)[0]))
        assert trace["traceEvents"]


@pytest.fixture(scope="module")
def opt_model(seed_inputs, tiny_corpus):
    """A random OPT (OPTForCausalLM, pre-norm, ReLU) directory with the GPT-2 BPE tokenizer,
    as CocktailSGD's OPT scripts fine-tune."""
    import torch
    from transformers import OPTConfig, OPTForCausalLM
    from megatron.training.data.tokenizer import build_tokenizer
    tok = build_tokenizer("GPT2BPETokenizer", tiny_corpus["vocab"], tiny_corpus["merges"])
    torch.manual_seed(0)
    config = OPTConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=4,
                       ffn_dim=64, num_attention_heads=4, max_position_embeddings=64,
                       word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0,
                       bos_token_id=tok.eod, eos_token_id=tok.eod, pad_token_id=tok.eod)
    model_dir = str(seed_inputs["root"] / "opt-tiny")
    OPTForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return model_dir


COCKTAIL = {"--model-type": "opt", "--optimizer": "adam", "--seed": 42,
            "--checkpoint-steps": 100, "--total-steps": 24, "--warmup-steps": 1,
            "--log-interval": 3, "--train-warmup-steps": 0, "--gradient-accumulate-step": 1,
            "--world-size": 4, "--pipeline-group-size": 2, "--data-group-size": 2,
            "--batch-size": 4, "--dp-backend": "gloo", "--dp-mode": "cocktail_sgd",
            "--pp-mode": "gpipe", "--forward-compress-method": None,
            "--backward-compress-method": None, "--forward-bits": None, "--backward-bits": None,
            "--warmup-epochs": None, "--n-epochs": None, "--num-iters": None,
            "--do-evaluation": "false", "--project-name": "cocktail-sgd", "--job-id": 0,
            "--net-interface": "lo"}
COCKTAIL_ENV = {"QUANT_BITS": "4", "TOPK_RATIO": "0.2", "RANDOMP_RATIO": "0.1"}


def test_cocktail_sgd_command_maps_to_the_trainers_flags(seed_inputs, opt_model, capsys,
                                                         monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for k, v in COCKTAIL_ENV.items():
        monkeypatch.setenv(k, v)
    code, out, err = _print_command(seed_inputs, capsys, **COCKTAIL, **{
        "--model-name": opt_model, "--tokenizer-name": opt_model})
    assert code == 0, err
    for fragment in ("--dp-mode cocktail_sgd", "--dp-backend gloo", "--cocktail-bits 4",
                     "--cocktail-topk-ratio 0.2", "--cocktail-random-ratio 0.1", "--relu",
                     "--optimizer adam", "--train-iters 24", "--lr-warmup-iters 1"):
        assert fragment in out, (fragment, out)


def test_cocktail_sgd_opt_example(seed_inputs, opt_model, tmp_path):
    """finetune_opt1.3b.sh shrunk to 4 ranks: pp 2 x dp 2, CocktailSGD dp over gloo, OPT."""
    args = _args(seed_inputs, **COCKTAIL, **{"--model-name": opt_model,
                                            "--tokenizer-name": opt_model,
                                            "--checkpoint-path": str(tmp_path / "ck")})
    codes, outs = _launch(args, cwd=tmp_path, ranks=4, env=COCKTAIL_ENV)
    assert codes == [0] * 4, "\n".join(o[-2000:] for o in outs)
    losses = _losses(outs[-1])                          # a last-stage rank logs the loss
    assert len(losses) >= 3, outs[-1][-3000:]
    # the dp channel ran CocktailSGD's sparsified, quantised exchange, not an all-reduce
    ratios = [float(x) for x in re.findall(r"\| dp bytes: [^|]*\(x([0-9.]+)\)", outs[-1])]
    print(f"\nCocktailSGD: lm loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} "
          f"log lines; dp bytes x{min(ratios, default=0)}..x{max(ratios, default=0)}")
    assert losses[-1] < losses[0] - 0.3
    assert ratios and min(ratios) > 10, ratios
    assert os.path.isfile(tmp_path / "ck" / "latest_checkpointed_iteration.txt")


@pytest.mark.parametrize("script", ["tools/dist_lm_runner.py", "tools/ckpt_convert.py"])
def test_help_runs_as_a_script(script):
    r = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=""))
    assert r.returncode == 0 and "--" in r.stdout, r.stderr


def _print_command(seed_inputs, capsys, **over):
    """In-process run of --print-command (--use-cuda false hides CUDA from this process: the
    tests calling it restore CUDA_VISIBLE_DEVICES through monkeypatch)."""
    from tools import dist_lm_runner
    code = dist_lm_runner.main(_args(seed_inputs, **over) + [
        "--dist-url", "tcp://127.0.0.1:1", "--rank", "0", "--print-command"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_epochs_and_caps_become_iterations(seed_inputs, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    code, out, _ = _print_command(seed_inputs, capsys, **{"--n-epochs": 3})
    assert code == 0
    per_epoch = int(re.search(r"(\d+) iterations per epoch", out).group(1))
    assert f"--train-iters {3 * per_epoch}" in out and f"--lr-warmup-iters {per_epoch}" in out
    code, out, _ = _print_command(seed_inputs, capsys, **{"--num-iters": 2})
    assert "--train-iters 2 " in out and "--lr-warmup-iters 1 " in out   # warm-up shortened
    code, out, _ = _print_command(seed_inputs, capsys, **{"--total-steps": 5,
                                                          "--data-group-size": 1})
    assert "--train-iters 5 " in out


@pytest.mark.parametrize("over,fragment", [
    ({"--num-layers": 3}, "--num-layers (per stage) x --pipeline-group-size = 6, but"),
    ({"--embedding-dim": 64}, "--embedding-dim = 64, but"),
    ({"--task-name": "wikitext"}, "--task-name wikitext: the seed downloads this task"),
    ({"--model-name": "gpt2-xl"}, "--model-name gpt2-xl: not a local directory"),
    ({"--world-size": 3}, "--world-size 3 != --pipeline-group-size 2 x --data-group-size 1"),
    ({"--forward-scale-method": "l2"}, "--forward-scale-method l2"),
    ({"--dp-bits": 4}, "--dp-bits"),
    ({"--model-type": "opt"}, "--model-type opt, but"),
    ({"--dp-mode": "sharded_ps"}, "--dp-mode sharded_ps: pretrain_gpt.py's data-parallel modes"),
    ({"--dp-backend": "mpi"}, "--dp-backend mpi: expected"),
    ({"--no-such-flag": 1}, "--no-such-flag: neither a runner flag"),
])
def test_unmappable_flags_are_refused_by_name(seed_inputs, capfd, monkeypatch, over, fragment):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    from tools import dist_lm_runner
    code = dist_lm_runner.main(_args(seed_inputs, **over) + [
        "--dist-url", "tcp://127.0.0.1:1", "--rank", "0", "--print-command"])
    assert code == 2
    assert fragment in capfd.readouterr().err
