"""tools/ckpt_convert.py with the Optimus-CC README's argument shape: a trained (2,2) checkpoint
merged to (1,1) (--save) and written as Hugging Face GPT-2 (-o), whose logits equal our
model's on the merged checkpoint."""
import os

import numpy as np
import pytest

from tests.distributed import run_distributed
from tests.tools.checkpoint.test_export_eval import LOGIT_TOL, _hf_logits, _our_logits, _tokens
from tools import ckpt_convert


def _readme_argv(corpus, run_dir, iteration, save, out, **over):
    flags = {"--model-type": "GPT", "--tensor-model-parallel-size": 2,
             "--pipeline-model-parallel-size": 2, "--target-pipeline-model-parallel-size": 1,
             "--vocab-file": corpus["vocab"], "--merge-file": corpus["merges"],
             "--num-layers": 4, "--hidden-size": 32, "--num-attention-heads": 4,
             "--seq-length": 32, "--max-position-embeddings": 32, "--load": run_dir,
             "--save": save, "--experiment_name": "merge_baseline",
             "--tokenizer-type": "GPT2BPETokenizer", "--activations-checkpoint-method": "uniform",
             "--data-impl": "mmap", "--DDP-impl": "local",
             "-i": os.path.join(run_dir, f"iter_{iteration:07d}") + "/", "-o": out,
             "-i_g": 1, "-p": 1, **over}
    argv = []
    for k, v in flags.items():
        argv += [k, str(v)]
    return argv + ["--no-progress"]


def _logits_job(rank, world, path, tokens):
    return _our_logits(path, tokens)[0]


@pytest.fixture(scope="module")
def converted(ckpts, tiny_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt_convert")
    save, out = str(root / "merge"), str(root / "merged")
    argv = _readme_argv(tiny_corpus, ckpts["ck22"], 6, save, out)
    assert ckpt_convert.main(argv) == 0
    return {"save": save, "out": out, "root": root}


def test_readme_command_merges_and_exports_with_equal_logits(converted):
    from tools.checkpoint.layout import read_checkpoint
    merged = read_checkpoint(converted["save"])
    assert (merged.tp, merged.pp, merged.iteration) == (1, 1, 6)
    tokens = _tokens()
    ours = run_distributed(_logits_job, 1, (converted["save"], tokens), timeout=300)[0]
    hf = _hf_logits(converted["out"], tokens)
    diff = np.abs(ours[..., :hf.shape[-1]] - hf).max()
    print(f"\nmax |logit diff| merged (1,1) vs Hugging Face export: {diff:.3e}")
    assert diff < LOGIT_TOL


@pytest.mark.parametrize("over,fragment", [
    ({"--tensor-model-parallel-size": 4}, "--tensor-model-parallel-size 4: the checkpoint was saved at 2"),
    ({"--hidden-size": 64}, "--hidden-size 64: the checkpoint's model has 32"),
    ({"-i_g": 2}, "-i_g 2"),
    ({"--model-type": "BERT"}, "--model-type BERT"),
])
def test_wrong_readme_flags_are_refused(ckpts, tiny_corpus, tmp_path, capsys, over, fragment):
    argv = _readme_argv(tiny_corpus, ckpts["ck22"], 6, str(tmp_path / "s"), str(tmp_path / "o"),
                        **over)
    assert ckpt_convert.main(argv) == 2
    assert fragment in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "s")


def test_readme_command_with_legacy_layout(ckpts, tiny_corpus, converted, tmp_path):
    """--legacy-layout on the trained checkpoint: the file loads weights-only, and the GPT-2
    its tensors make (as transformers 4.x's converter makes it) gives -o's logits."""
    import torch
    from tests.tools.checkpoint.test_legacy_layout import gpt2_from_legacy, logits
    save = str(tmp_path / "legacy")
    argv = _readme_argv(tiny_corpus, ckpts["ck22"], 6, save, str(tmp_path / "hf"))
    assert ckpt_convert.main(argv + ["--legacy-layout"]) == 0
    sd = torch.load(os.path.join(save, "iter_0000006", "mp_rank_00", "model_optim_rng.pt"),
                    map_location="cpu", weights_only=True)
    assert (sd["checkpoint_version"], sd["iteration"], sd["args"].padded_vocab_size) == \
        (3.0, 6, 1024)
    tokens = _tokens()
    diff = (logits(gpt2_from_legacy(sd), tokens) - logits(converted["out"], tokens)).abs().max()
    print(f"\nmax |logit diff| legacy layout vs Hugging Face export: {diff:.3e}")
    assert diff == 0
