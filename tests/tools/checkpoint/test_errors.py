"""Every refusal, tried, with its message (the tools exit 2 and print one 'error:' line)."""
import os
import shutil

import pytest
import torch

from megatron.training.checkpointing.checkpoint_args import args_dict
from megatron.training.checkpointing.checkpoint_io import safe_load, write_file
from tools.checkpoint import export_hf, import_hf, reshard, val_ppl
from tools.checkpoint.errors import CheckpointError
from tools.checkpoint.gpt2_mapping import unsupported_features


@pytest.fixture
def ck(ckpts, tmp_path):
    """A private copy of the (2,2) checkpoint (iterations 3 and 6) to damage."""
    dst = str(tmp_path / "ck22")
    shutil.copytree(ckpts["ck22"], dst)
    return dst


def _iter_dir(root):
    return os.path.join(root, "iter_0000006")


def _refused(capsys, main, argv, *expected):
    assert main(argv) == 2
    err = capsys.readouterr().err
    with capsys.disabled():
        print(f"\n{err.strip().splitlines()[-1]}")
    for text in expected:
        assert text in err, err
    return err


def _rewrite_args(ck, change):
    """Apply change(args dict) to every shard file of ck's iteration."""
    for sub in os.listdir(_iter_dir(ck)):
        if sub.startswith("mp_rank_"):
            path = os.path.join(_iter_dir(ck), sub, "model_optim_rng.pt")
            sd = safe_load(path)
            change(args_dict(sd["args"]))   # the grouped dict inside the saved Namespace
            write_file(sd, path)   # a consistent file: the tool must refuse its content


def _reshard_argv(ck, tmp_path):
    return ["--load", ck, "--save", str(tmp_path / "out"), "--no-progress"]


def test_missing_shard(ck, tmp_path, capsys):
    gone = os.path.join(_iter_dir(ck), "mp_rank_01_001", "model_optim_rng.pt")
    os.remove(gone)
    _refused(capsys, reshard.main, _reshard_argv(ck, tmp_path), "missing shard", gone)
    assert not os.path.exists(tmp_path / "out" / "latest_checkpointed_iteration.txt")


def test_missing_shard_directory(ck, tmp_path, capsys):
    gone = os.path.join(_iter_dir(ck), "mp_rank_00_001")
    shutil.rmtree(gone)
    _refused(capsys, export_hf.main, ["--load", ck, "--output", str(tmp_path / "hf")],
             "missing shard(s) of the tp=2 pp=2 checkpoint", "mp_rank_00_001")
    assert not os.path.exists(tmp_path / "hf")


def test_shard_from_another_layout_in_the_directory(ck, ckpts, tmp_path, capsys):
    stray = os.path.join(ckpts["ck14"], "iter_0000003", "mp_rank_00_003")
    shutil.copytree(stray, os.path.join(_iter_dir(ck), "mp_rank_00_003"))
    _refused(capsys, reshard.main, _reshard_argv(ck, tmp_path), "mismatched layouts",
             "tp=2 pp=2", "mp_rank_00_003")


def test_shard_file_of_another_layout(ck, ckpts, tmp_path, capsys):
    other = os.path.join(ckpts["ck14"], "iter_0000003", "mp_rank_00_001", "model_optim_rng.pt")
    for suffix in ("", ".sha256"):   # a consistent file, checksum included
        shutil.copy(other + suffix, os.path.join(_iter_dir(ck), "mp_rank_00_001",
                                                 "model_optim_rng.pt" + suffix))
    _refused(capsys, reshard.main, _reshard_argv(ck, tmp_path), "mismatched layouts",
             "says tp=1 pp=4")


def test_corrupt_file(ck, tmp_path, capsys):
    path = os.path.join(_iter_dir(ck), "mp_rank_01_000", "model_optim_rng.pt")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])   # a save cut short
    _refused(capsys, reshard.main, _reshard_argv(ck, tmp_path), "is truncated", path)
    os.remove(path + ".sha256")          # no checksum to compare: unpickling still fails
    _refused(capsys, reshard.main, _reshard_argv(ck, tmp_path), "corrupt or truncated", path)


def test_flipped_byte_fails_the_checksum(ck, tmp_path, capsys):
    path = os.path.join(_iter_dir(ck), "mp_rank_00_001", "model_optim_rng.pt")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01   # silent corruption: same size, still unpicklable
    open(path, "wb").write(bytes(data))
    _refused(capsys, reshard.main, _reshard_argv(ck, tmp_path), "is corrupt", "sha256", path)


def test_pickle_that_runs_code_is_refused(ck, tmp_path, capsys):
    """A shard whose pickle calls a function: refused by weights_only, the code never runs."""
    marker = tmp_path / "ran"
    path = os.path.join(_iter_dir(ck), "mp_rank_00_000", "model_optim_rng.pt")
    sd = safe_load(path)
    sd["model"]["evil"] = _RunsCode(str(marker))
    write_file(sd, path)   # with a valid checksum: the attacker controls both files
    _refused(capsys, reshard.main, _reshard_argv(ck, tmp_path), "needs arbitrary unpickling",
             "--trust-checkpoint", path)
    _refused(capsys, export_hf.main, ["--load", ck, "--output", str(tmp_path / "hf")],
             "needs arbitrary unpickling")
    assert not marker.exists()


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):   # unpickling calls open(marker, "w"): visible if it ever runs
        return (open, (self.marker, "w"))


def test_not_a_checkpoint_directory(tmp_path, capsys):
    os.makedirs(tmp_path / "empty")
    _refused(capsys, val_ppl.main, ["--load", str(tmp_path / "empty")],
             "no latest_checkpointed_iteration.txt")


def test_target_layout_that_does_not_divide_the_model(ck, tmp_path, capsys):
    _refused(capsys, reshard.main, _reshard_argv(ck, tmp_path)
             + ["--target-tensor-parallel-size", "3"],
             "target tensor-parallel size 3 does not divide --num-attention-heads (4)")
    _refused(capsys, reshard.main, _reshard_argv(ck, tmp_path)
             + ["--target-pipeline-parallel-size", "3"],
             "target pipeline size 3 does not divide --num-layers (4)")


def test_save_over_load_is_refused(ck, capsys):
    _refused(capsys, reshard.main, ["--load", ck, "--save", ck, "--no-progress"],
             "is the --load directory")


def test_untied_embeddings_cannot_be_exported(ck, tmp_path, capsys):
    _rewrite_args(ck, lambda a: a["model"].update(untie_embeddings_and_output_weights=True))
    _refused(capsys, export_hf.main, ["--load", ck, "--output", str(tmp_path / "hf")],
             "cannot be written as a Hugging Face model",
             "--untie-embeddings-and-output-weights=True",
             "GPT2LMHeadModel ties lm_head to wte")
    assert not os.path.exists(tmp_path / "hf")


def test_other_non_gpt2_flags_are_named():
    reasons = unsupported_features({"num_attention_heads": 4, "swiglu": True,
                                    "normalization": "RMSNorm", "num_query_groups": 2})
    text = "; ".join(reasons)
    assert "--swiglu=True" in text and "--normalization=RMSNorm" in text
    assert "--num-query-groups=2" in text


def test_import_refuses_an_activation_we_do_not_have(hf_gpt2, tmp_path, capsys):
    import json
    bad = str(tmp_path / "relu_gpt2")
    shutil.copytree(hf_gpt2["dir"], bad)
    cfg_path = os.path.join(bad, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["activation_function"] = "relu"
    json.dump(cfg, open(cfg_path, "w"))
    _refused(capsys, import_hf.main, ["--hf-model", bad, "--save", str(tmp_path / "ck")],
             "activation_function 'relu'")


def test_import_refuses_a_layout_the_model_cannot_split_into(hf_gpt2, tmp_path, capsys):
    _refused(capsys, import_hf.main, ["--hf-model", hf_gpt2["dir"], "--save",
                                      str(tmp_path / "ck"), "--pipeline-model-parallel-size",
                                      "3"],
             "--num-layers (4) is not divisible by --pipeline-model-parallel-size (3)")


def test_export_without_a_tokenizer_writes_the_model_alone(ck, tmp_path, capsys):
    """The tokenizer files are gone: the model is exported, one line says no tokenizer was;
    where one is needed (eval_lm tokenizes its tasks) it is refused, naming the flags."""
    _rewrite_args(ck, lambda a: a["data"].update(vocab_file="/nonexistent/vocab.json"))
    out = str(tmp_path / "hf")
    assert export_hf.main(["--load", ck, "--output", out, "--no-progress"]) == 0
    notes = [l for l in capsys.readouterr().out.splitlines() if l.startswith("note:")]
    assert len(notes) == 1 and "no tokenizer written" in notes[0], notes
    assert "vocab.json" not in os.listdir(out) and "model.safetensors" in os.listdir(out)
    with pytest.raises(CheckpointError, match="no tokenizer.*--vocab-file"):
        export_hf.export(ck, str(tmp_path / "hf2"), require_tokenizer=True)


def test_interrupted_write_keeps_the_previous_checkpoint(ck, tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "out")
    assert reshard.main(["--load", ck, "--save", out, "--no-progress"]) == 0
    calls = []

    def dying_save(obj, path, *a, **k):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed while writing the second shard
        return real_save(obj, path, *a, **k)
    real_save = torch.save
    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        reshard.main(["--load", ck, "--save", out, "--iteration", "3", "--no-progress",
                      "--target-pipeline-parallel-size", "2"])
    monkeypatch.undo()
    assert open(os.path.join(out, "latest_checkpointed_iteration.txt")).read() == "6"
    assert sorted(os.listdir(out)) == ["iter_0000006", "latest_checkpointed_iteration.txt"]
