"""The README's numbers about `make demo` come from one recorded run, and the counted ones
cannot drift: the demo's own flags (read from `make -n demo`, so the Makefile is the one
source) give, per iteration, the bytes and ratios of every channel that the recorded run's
log and the README state.

Losses and times depend on the machine and the corpus; bytes depend only on shapes and codecs,
so a short run on a small corpus with the default corpus's vocabulary size measures them.
"""
import os
import re
import shlex
import subprocess
import sys

from tests.distributed import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(ROOT, "bench", "results", "demo")
CHANNEL = re.compile(r"([a-z-]+) bytes: ([0-9.]+[KMG]?B) \(x([0-9.]+)\)")


def _iteration_lines(text):
    return [ln for ln in text.splitlines() if ln.lstrip().startswith("iteration")]


def _channels(line):
    return {name: (size, ratio) for name, size, ratio in CHANNEL.findall(line)}


def _recorded_log():
    with open(os.path.join(RECORD, "log.txt")) as f:
        return f.read()


def _demo_command():
    """The pretrain_gpt.py argument list `make demo` runs (continuation lines joined)."""
    # the demo as the README runs it: a `make test ARGS=...` around this test must not
    # hand its pytest flags to the demo through MAKEFLAGS
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "-n", "-s", "demo", "ARGS="], cwd=ROOT, capture_output=True,
                         text=True, check=True, env=env).stdout.replace("\\\n", " ")
    line = next(ln for ln in out.splitlines() if "pretrain_gpt.py" in ln)
    words = shlex.split(line)
    return words[words.index("pretrain_gpt.py") + 1:], \
        int(words[words.index("--nproc-per-node") + 1])


def test_readme_states_the_recorded_run():
    log = _recorded_log()
    with open(os.path.join(RECORD, "README.md")) as f:
        record = f.read()
    assert "make demo" in record
    last = _channels(_iteration_lines(log)[-1])
    vals = re.findall(r"validation loss at iteration\s+(\d+) \| lm loss value: ([0-9.E+-]+)",
                      log)
    peak = re.search(r"peak memory \(MB\): max over ranks ([0-9.]+)", log).group(1)
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    demo = readme[readme.index("`make demo` compresses"):]
    demo = " ".join(demo[:demo.index("\n\n")].split())
    stated = dict(re.findall(r"([a-z-]+) x([0-9.]+)", demo))
    assert stated == {k: r for k, (_, r) in last.items()}, (stated, last)
    for it, v in vals:
        assert f"{float(v):.2f} ({int(it)})" in demo, (it, v, demo)
    assert f"{float(peak):.0f} MB" in demo, (peak, demo)
    for line in (_iteration_lines(log)[0], _iteration_lines(log)[-1]):
        it, loss = re.search(r"iteration\s+(\d+)/.*lm loss: ([0-9.E+-]+)", line).groups()
        assert f"{float(loss):.2f} at iteration {it}" in demo, (it, loss, demo)


def test_demo_bytes_match_the_record(tiny_corpus, tmp_path):
    from tests.conftest import _local_texts, write_indexed
    from tokenizers import ByteLevelBPETokenizer
    from megatron.training.data.corpus import EOD_TOKEN, VOCAB_SIZE, train_tokenizer

    texts = _local_texts(limit=400)
    vocab, merges = train_tokenizer(texts, str(tmp_path))
    tok = ByteLevelBPETokenizer(vocab, merges)
    prefix = write_indexed(texts, tok, tok.token_to_id(EOD_TOKEN), str(tmp_path / "text_document"))
    assert tok.get_vocab_size() == VOCAB_SIZE

    argv, nproc = _demo_command()
    # bytes per iteration, past the dp codec's warm-up (exact, x1.0, for its first 10%)
    argv += ["--data-path", prefix, "--vocab-file", vocab, "--merge-file", merges,
             "--split", "98,2,0", "--log-interval", "1", "--exit-interval", "2",
             "--grad-comp-warm-up", "0", "--save", str(tmp_path / "ckpt"),
             "--save-interval", "1000"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), os.path.join(ROOT, "pretrain_gpt.py")] + argv
    r = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=600)
    errors = [line for line in (r.stdout + r.stderr).splitlines() if "error" in line.lower()]
    assert r.returncode == 0, "\n".join(errors[:20]) + r.stdout[-2000:]
    measured = _channels(_iteration_lines(r.stdout)[-1])
    recorded = _channels(_iteration_lines(_recorded_log())[-1])
    assert measured == recorded, (measured, recorded)
