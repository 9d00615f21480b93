"""A bad flag is refused in a few lines: argparse's own errors without the usage of every flag,
each with the closest flag or choice."""
import pytest

from megatron.training.arguments import parse_args

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
