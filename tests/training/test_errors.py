"""Bad input stops every rank with one clear line naming the flag or file, long before any
collective timeout (each launch is given 120 s: room for torchrun's start-up and teardown
on a loaded machine).

The flag and input-file checks run in each rank's parse of the flags, from the flags and the
WORLD_SIZE the launcher set, before any process group exists: every case calls the entry point
as each of its ranks would, and two of them also launch pretrain_gpt.py under torchrun, as a
user would.
"""
import os
import subprocess
import sys

import pytest

from tests.conftest import tiny_gpt_argv
from tests.distributed import free_port, run_distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launch(nproc, argv, timeout=120):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), os.path.join(ROOT, "pretrain_gpt.py")] + argv
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def corrupt(tiny_corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("corrupt")
    with open(tiny_corpus["prefix"] + ".idx", "rb") as f:
        idx = f.read()
    with open(tiny_corpus["prefix"] + ".bin", "rb") as f:
        binary = f.read()
    (d / "trunc.idx").write_bytes(idx[: len(idx) // 2])
    (d / "trunc.bin").write_bytes(binary)
    (d / "foreign.idx").write_bytes(b"NOTANIDX" + idx[8:])
    (d / "foreign.bin").write_bytes(binary)
    (d / "vocab.json").write_text("{not json")
    return d


CASES = [
    # (id, nproc, flag overrides, expected fragment)
    ("world-not-divisible", 3, {"tensor-model-parallel-size": 2},
     "world size (3) is not divisible by --tensor-model-parallel-size (2)"),
    ("gbs-not-divisible", 2, {"global-batch-size": 7},
     "--global-batch-size (7) is not divisible by --micro-batch-size (1) x data-parallel size (2)"),
    ("layers-not-divisible", 2, {"pipeline-model-parallel-size": 2, "num-layers": 3},
     "--num-layers (3) is not divisible by --pipeline-model-parallel-size (2)"),
    ("heads-not-divisible", 2, {"tensor-model-parallel-size": 2, "num-attention-heads": 3,
                                "hidden-size": 48},
     "--num-attention-heads (3) is not divisible by --tensor-model-parallel-size (2)"),
    ("hidden-not-divisible", 1, {"num-attention-heads": 4, "hidden-size": 30},
     "--hidden-size (30) is not divisible by --num-attention-heads (4)"),
    ("missing-data", 2, {"data-path": "/nonexistent/corpus_text_document"},
     "/nonexistent/corpus_text_document.bin does not exist"),
    ("truncated-idx", 2, {"data-path": "{corrupt}/trunc"}, "trunc.idx is truncated or corrupt"),
    ("foreign-idx", 2, {"data-path": "{corrupt}/foreign"}, "foreign.idx is not a Megatron .idx"),
    ("missing-vocab", 2, {"vocab-file": "/nonexistent/vocab.json"},
     "--vocab-file /nonexistent/vocab.json does not exist"),
    ("corrupt-vocab", 2, {"vocab-file": "{corrupt}/vocab.json"}, "is not valid JSON"),
]


# also launched under torchrun: one verdict that needs the launcher's world size, one on a file
LAUNCHED = ("gbs-not-divisible", "missing-vocab")


def _overrides(overrides, corrupt):
    return {k: (v.format(corrupt=corrupt) if isinstance(v, str) else v)
            for k, v in overrides.items()}


def _check_error_lines(stderr, nproc, expected):
    for rank in range(nproc):
        lines = [l for l in stderr.splitlines() if l.startswith(f"[rank {rank}] error:")]
        assert lines, f"rank {rank} printed no error line:\n{stderr[-3000:]}"
        assert expected in lines[0], lines[0]
        assert len(lines[0]) < 400, "one line, not a traceback"


@pytest.mark.parametrize("name,nproc,overrides,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_fast_on_every_rank(tiny_corpus, corrupt, name, nproc, overrides,
                                            expected, capfd, monkeypatch):
    """pretrain_gpt's main() as each rank runs it (RANK, WORLD_SIZE as torchrun sets them):
    exit code 2 and the one line, with no process group and no training started."""
    from megatron.training import pretrain
    argv = tiny_gpt_argv(tiny_corpus, **_overrides(overrides, corrupt))
    monkeypatch.setattr(pretrain.time, "sleep", lambda s: None)   # the rank's linger
    monkeypatch.setattr(pretrain, "resolve_default_data",
                        lambda a: pytest.fail("the flags passed their checks"))
    for rank in range(nproc):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(nproc))
        assert pretrain.main(argv) == 2
    _check_error_lines(capfd.readouterr().err, nproc, expected)


@pytest.mark.parametrize("name,nproc,overrides,expected",
                         [c for c in CASES if c[0] in LAUNCHED], ids=LAUNCHED)
def test_bad_input_under_torchrun(tiny_corpus, corrupt, name, nproc, overrides, expected):
    result = _launch(nproc, tiny_gpt_argv(tiny_corpus, **_overrides(overrides, corrupt)))
    assert result.returncode != 0
    _check_error_lines(result.stderr, nproc, expected)


def _train_and_save(rank, world, argv):
    from tests.training import runner
    return runner.train(argv, world)


def test_truncated_checkpoint_is_one_line_naming_the_file(tiny_corpus, tmp_path):
    """--load of a checkpoint whose file was cut short (and has no .sha256 beside it): one
    line naming the file and --ckpt-fallback, exit 2, not our traceback."""
    import glob
    save = tmp_path / "ckpt"
    run_distributed(_train_and_save, 1, (tiny_gpt_argv(tiny_corpus, **{
        "train-iters": 1, "save": str(save), "save-interval": 1}),), timeout=300)
    (path,) = glob.glob(str(save / "iter_*" / "mp_rank_00" / "model_optim_rng.pt"))
    for digest in glob.glob(path + ".sha256"):
        os.remove(digest)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    result = _launch(1, tiny_gpt_argv(tiny_corpus, **{"train-iters": 2, "load": save}))
    assert result.returncode != 0, result.stderr[-3000:]   # torchrun's own status: 1
    assert "exitcode: 2" in result.stderr, result.stderr[-3000:]
    lines = [l for l in result.stderr.splitlines() if l.startswith("[rank 0] error:")]
    assert lines and path in lines[0] and "--ckpt-fallback" in lines[0], result.stderr[-3000:]
    assert "corrupt or truncated" in lines[0] and "training failed" not in result.stderr


def test_unknown_flag_is_reported_once_not_per_rank(tiny_corpus):
    result = _launch(2, tiny_gpt_argv(tiny_corpus) + ["--tensor-model-paralel-size", "1"])
    assert result.returncode != 0
    lines = [l for l in result.stderr.splitlines() if "error: unrecognized arguments" in l]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "did you mean --tensor-model-parallel-size?" in result.stderr
