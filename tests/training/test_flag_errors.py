"""A bad flag is refused in parse_args, before any process group or model exists, in a few
lines: argparse's own errors without the usage of every flag, each with the closest flag or
choice; value errors with the flag's allowed values."""
import os
import subprocess
import sys

import pytest

from megatron.training.flags.arguments import ConfigError, parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the Makefile's `demo` flags (world 8: tp 2 x pp 2 x dp 2), one iteration
DEMO = ("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers 4 "
        "--hidden-size 128 --num-attention-heads 4 --seq-length 128 --micro-batch-size 4 "
        "--global-batch-size 32 --train-iters 1 --lr 1e-3 --min-lr 1e-4 "
        "--forward-compress-method fixpoint --forward-bits 8 --inter-grad-comp "
        "--inter-grad-comp-rank 16 --use-error-feedback --grad-comp --grad-comp-rank 8 "
        "--grad-comp-warm-up 0.1 --selective-grad-comp --selective-grad-comp-way 1 "
        "--emb-comm-opt").split()


def _argparse_error(capsys, argv):
    with pytest.raises(SystemExit) as e:
        parse_args(DEMO + argv, world_size=8)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) <= 3 and "usage:" not in err, err
    assert "--help" in err, err
    return err


def test_unknown_flag_names_the_closest(capsys):
    err = _argparse_error(capsys, ["--tensor-model-paralel-size", "2"])
    assert "unrecognized arguments: --tensor-model-paralel-size 2" in err
    assert "did you mean --tensor-model-parallel-size?" in err


def test_misspelled_choice_names_the_closest(capsys):
    err = _argparse_error(capsys, ["--forward-compress-method", "fixpiont"])
    assert "invalid choice: 'fixpiont'" in err and "did you mean 'fixpoint'?" in err


def test_wrong_type_is_one_line(capsys):
    err = _argparse_error(capsys, ["--forward-bits", "four"])
    assert "--forward-bits" in err and "invalid int value: 'four'" in err


@pytest.mark.parametrize("argv,message", [
    (["--forward-bits", "0"], "--forward-bits must be in 1..8, got 0"),
    (["--backward-compress-method", "fixpoint", "--backward-bits", "9"],
     "--backward-bits must be in 1..8, got 9"),
    (["--mp-acti-comp-rank", "0"], "--mp-acti-comp-rank must be >= 1, got 0"),
    (["--forward-compress-method", "delta", "--max-activation-cache-size", "2"],
     "--max-activation-cache-size 2 is smaller than one micro-batch (--micro-batch-size 4)"),
    (["--forward-compress-method", "subspace", "--hidden-dropout", "0", "--subspace-rank", "0"],
     "the subspace rank must be in 1..--hidden-size (128)"),
    # refused only once the model was built or the loop ran, before
    (["--seq-length", "0"], "--seq-length must be >= 1, got 0"),
    (["--hidden-size", "0"], "--hidden-size must be >= 1, got 0"),
    (["--num-layers", "0"], "--num-layers must be >= 1, got 0"),
    (["--num-attention-heads", "0"], "--num-attention-heads must be >= 1, got 0"),
    (["--make-vocab-size-divisible-by", "0"], "--make-vocab-size-divisible-by must be >= 1"),
    (["--init-method-std", "-1"], "--init-method-std must be >= 0, got -1.0"),
    (["--seed", "-1"], "--seed must be in 0..4294967295, got -1"),
    (["--log-interval", "0"], "--log-interval must be >= 1, got 0"),
    (["--eval-iters", "-1"], "--eval-iters must be >= 0, got -1"),
    (["--distributed-timeout-minutes", "0"], "--distributed-timeout-minutes must be > 0"),
])
def test_value_refused_in_parse_args(argv, message):
    import torch.distributed as dist
    with pytest.raises(ConfigError) as e:
        parse_args(DEMO + argv, world_size=8)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not dist.is_initialized()


def test_refusal_needs_no_megatron_core():
    """The checks import nothing heavy: every rank refuses a bad flag as soon as torch is
    imported, instead of after megatron-core's import (seconds per rank, more when the ranks
    of a node start together)."""
    code = ("import sys\n"
            "from megatron.training.flags.arguments import ConfigError, parse_args\n"
            "try:\n"
            f"    parse_args({DEMO + ['--forward-bits', '0']!r}, world_size=8)\n"
            "except ConfigError as e:\n"
            "    print(e)\n"
            "print('megatron.core' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert out.stdout.splitlines() == ["--forward-bits must be in 1..8, got 0", "False"], \
        out.stdout + out.stderr
