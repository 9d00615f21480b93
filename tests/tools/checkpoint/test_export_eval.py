"""Export/import with Hugging Face, lm-eval offline, and val_ppl against the training loop.

Our logits come from a one-process GPTModel loaded with the merged checkpoint (the merge itself
is shown lossless by test_reshard.py: a resharded run continues with the same losses).
"""
import argparse
import json
import os

import numpy as np
import pytest
import torch

from tests.distributed import run_distributed
from tests.tools.checkpoint.conftest import write_local_tasks
from tools.checkpoint import export_hf, import_hf

LOGIT_TOL = 1e-4
SEQ = 32


def _tokens():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, 1000, (2, SEQ), generator=g)


def _our_logits(path, tokens):
    """(logits (B, S, padded V), {global name: (our partition dim, megatron-core's)})."""
    from megatron.core import parallel_state as ps
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.model.model import build_gpt_model, global_param_names, transformer_config
    from tools.checkpoint.common import tokenizer_vocab_size
    from tools.checkpoint.layout import merge, partition_dim, read_checkpoint, split
    from tools.checkpoint.val_ppl import eval_args
    full = merge(read_checkpoint(path))
    args = eval_args(full)
    topo = initialize_distributed(args)
    try:
        vocab = full.vocab_size or tokenizer_vocab_size(argparse.Namespace(), full.args)
        shard = split(full, 1, 1, vocab_size=vocab, with_optimizer=False)[(0, 0)]
        model = build_gpt_model(args, transformer_config(args),
                                shard["layout"]["padded_vocab_size"], topo)
        model.load_state_dict(shard["model"], strict=True)
        model.eval()
        rules = {g: (partition_dim(g), p.partition_dim if getattr(p, "tensor_model_parallel",
                                                                   False) else -1)
                 for _, g, p in global_param_names(model)}
        with torch.no_grad():
            pos = torch.arange(tokens.shape[1]).expand_as(tokens)
            logits = model(tokens, pos, None)
    finally:
        ps.destroy_model_parallel()
    return logits.float().numpy(), rules


def _single_job(rank, world, sources, tokens, val_source):
    import contextlib
    import io
    import re
    import torch.distributed as dist
    from tools.checkpoint import val_ppl
    out = {name: _our_logits(path, tokens) for name, path in sources.items()}
    # val_ppl as its command line runs it: without a process group, it makes its own.
    dist.destroy_process_group()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = val_ppl.main(["--load", val_source])
    printed = buf.getvalue()
    assert code == 0, printed
    out["val_ppl"] = float(re.search(r"validation loss ([0-9.E+-]+) \| perplexity", printed)[1])
    out["val_ppl_line"] = printed.strip().splitlines()[-1]
    return out


@pytest.fixture(scope="session")
def imported22(hf_gpt2, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("imported") / "ck")
    assert import_hf.main(["--hf-model", hf_gpt2["dir"], "--save", path,
                           "--tensor-model-parallel-size", "2",
                           "--pipeline-model-parallel-size", "2", "--no-progress"]) == 0
    return path


@pytest.fixture(scope="session")
def single(ckpts, imported22):
    sources = {"(2,2,1)": ckpts["ck22"], "(1,4,2)": ckpts["ck14"], "imported": imported22}
    return run_distributed(_single_job, 1, (sources, _tokens(), ckpts["ck22"]),
                           timeout=600)[0]


@pytest.fixture(scope="session")
def exported(ckpts, tmp_path_factory):
    root = tmp_path_factory.mktemp("exported")
    out = {}
    for name, key in (("(2,2,1)", "ck22"), ("(1,4,2)", "ck14")):
        path = str(root / key)
        assert export_hf.main(["--load", ckpts[key], "--output", path, "--no-progress"]) == 0
        out[name] = path
    return out


def _hf_logits(path_or_model, tokens):
    from transformers import AutoModelForCausalLM
    model = path_or_model
    if isinstance(path_or_model, str):
        model = AutoModelForCausalLM.from_pretrained(path_or_model, local_files_only=True)
    model.eval()
    with torch.no_grad():
        return model(tokens).logits.float().numpy()


@pytest.mark.parametrize("name", ["(2,2,1)", "(1,4,2)"])
def test_exported_model_gives_our_logits(single, exported, name):
    ours, _ = single[name]
    hf = _hf_logits(exported[name], _tokens())
    vocab = hf.shape[-1]
    diff = np.abs(ours[..., :vocab] - hf).max()
    print(f"\n{name}: max |logit diff| ours vs exported HF = {diff:.3e} "
          f"(logits up to {np.abs(hf).max():.2f})")
    assert diff < LOGIT_TOL


def test_exported_directory_is_a_complete_gpt2(exported, tiny_corpus):
    from transformers import AutoTokenizer
    from megatron.training.data.tokenizer import build_tokenizer
    path = exported["(2,2,1)"]
    files = set(os.listdir(path))
    assert {"config.json", "model.safetensors"} <= files
    config = json.load(open(os.path.join(path, "config.json")))
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["vocab_size"] == 1024
    assert config["activation_function"] == "gelu"   # exact GeLU: no --openai-gelu
    hf_tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    ours = build_tokenizer("GPT2BPETokenizer", tiny_corpus["vocab"], tiny_corpus["merges"])
    text = "def forward(self, x):\n    return self.linear(x)  # tensor parallel"
    assert hf_tok(text)["input_ids"] == ours.tokenize(text)


def test_imported_gpt2_gives_hf_logits(single, hf_gpt2):
    from transformers import AutoModelForCausalLM
    ours, _ = single["imported"]
    hf = _hf_logits(AutoModelForCausalLM.from_pretrained(hf_gpt2["dir"], local_files_only=True),
                    _tokens())
    diff = np.abs(ours[..., :hf.shape[-1]] - hf).max()
    print(f"\nimported HF GPT-2 at (2,2): max |logit diff| ours vs HF = {diff:.3e}")
    assert diff < LOGIT_TOL
    assert not ours[..., hf.shape[-1]:].any()   # zero padding rows: logit 0


def test_partition_rules_match_megatron_core(single):
    _, rules = single["(2,2,1)"]
    wrong = {g: r for g, r in rules.items() if r[0] != r[1]}
    assert not wrong, f"layout.partition_dim disagrees with megatron-core: {wrong}"


def test_import_then_export_is_exact(hf_gpt2, imported22, tmp_path):
    from safetensors.torch import load_file
    out = str(tmp_path / "hf_again")
    assert export_hf.main(["--load", imported22, "--output", out, "--no-progress"]) == 0
    again = load_file(os.path.join(out, "model.safetensors"))
    original = hf_gpt2["state"]
    for k, v in original.items():
        if k == "lm_head.weight" and k not in again:   # tied: stored once, as wte
            k2 = "transformer.wte.weight"
        else:
            k2 = k
        assert torch.equal(again[k2], v), k
    assert set(again) <= set(original)
    c0 = json.load(open(os.path.join(hf_gpt2["dir"], "config.json")))
    c1 = json.load(open(os.path.join(out, "config.json")))
    for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
              "activation_function", "layer_norm_epsilon", "tie_word_embeddings"):
        assert c0[k] == c1[k], k


def test_val_ppl_equals_the_training_loop_validation_loss(single, ckpts):
    loop = ckpts["losses22"]["valid_loss"]
    tool = single["val_ppl"]
    print(f"\nvalidation loss: training loop (2,2,1) {loop:.8f} | val_ppl (1 process) {tool:.8f}"
          f"\nval_ppl printed: {single['val_ppl_line']}")
    assert abs(tool - loop) <= 1e-5 * abs(loop)


def test_lm_eval_runs_offline_on_local_tasks(exported, tiny_corpus, tmp_path, capsys):
    from tools.checkpoint.eval_lm import main
    texts = [json.loads(line)["text"][:400] for line in open(tiny_corpus["jsonl"])][:4]
    tasks = write_local_tasks(str(tmp_path / "tasks"), texts)
    out_json = str(tmp_path / "results.json")
    assert main(["--model", exported["(2,2,1)"], "--include-path", tasks,
                 "--tasks", "tiny_mc,tiny_ppl", "--offline", "--device", "cpu",
                 "--only-include-path",
                 "--batch-size", "4", "--output-path", out_json]) == 0
    printed = capsys.readouterr().out
    with capsys.disabled():
        print("\n" + printed)
    assert "tiny_mc" in printed and "acc" in printed
    assert "tiny_ppl" in printed and "word_perplexity" in printed
    results = json.load(open(out_json))["results"]
    assert 0.0 <= results["tiny_mc"]["acc,none"] <= 1.0
    assert results["tiny_ppl"]["byte_perplexity,none"] > 1.0


def test_eval_lm_refuses_unknown_tasks_with_a_message(ckpts, tmp_path, capsys):
    """Also the --load path: the checkpoint is exported to a temporary directory first."""
    from tools.checkpoint.eval_lm import main
    tasks = write_local_tasks(str(tmp_path / "tasks"), ["some text"])
    assert main(["--load", ckpts["ck22"], "--tasks", "tiny_mc,no_such_task_xyz",
                 "--include-path", tasks, "--only-include-path", "--offline"]) == 2
    assert "unknown task(s) no_such_task_xyz" in capsys.readouterr().err


def test_import_function_takes_a_directory_or_a_model(hf_gpt2):
    from transformers import AutoModelForCausalLM
    from tools.checkpoint.import_hf import import_hf_gpt2
    model = AutoModelForCausalLM.from_pretrained(hf_gpt2["dir"], local_files_only=True)
    from_dir = import_hf_gpt2(hf_gpt2["dir"], tp=2, pp=2)
    from_obj = import_hf_gpt2(model, tp=2, pp=2)
    assert [(s["layout"]["pp_rank"], s["layout"]["tp_rank"]) for s in from_dir] == \
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    for a, b in zip(from_dir, from_obj):
        assert a["model"].keys() == b["model"].keys()
        assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items()
                   if torch.is_tensor(v))


def test_export_without_tokenizer_writes_the_model_and_says_so(tmp_path, capsys):
    """A Hugging Face directory with no tokenizer files: import, then export, both succeed."""
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(1)
    config = GPT2Config(vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                        bos_token_id=299, eos_token_id=299)
    src = str(tmp_path / "hf_no_tok")
    GPT2LMHeadModel(config).save_pretrained(src)   # config + weights, no tokenizer files
    ck, out = str(tmp_path / "ck"), str(tmp_path / "hf_again")
    assert import_hf.main(["--hf-model", src, "--save", ck, "--no-progress"]) == 0
    capsys.readouterr()
    assert export_hf.main(["--load", ck, "--output", out, "--no-progress"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    notes = [line for line in printed if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: no tokenizer written"), printed
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json",
                                       "model.safetensors"]
    c = json.load(open(os.path.join(out, "config.json")))
    assert (c["vocab_size"], c["eos_token_id"], c["bos_token_id"]) == (300, 299, 299)
    again, original = load_file(os.path.join(out, "model.safetensors")), \
        load_file(os.path.join(src, "model.safetensors"))
    assert again.keys() == original.keys()
    assert all(torch.equal(again[k], original[k]) for k in original)


def test_export_without_tokenizer_is_refused_where_one_is_needed(tmp_path, capsys):
    """eval_lm tokenizes its tasks: it asks for the tokenizer flags instead."""
    from transformers import GPT2Config, GPT2LMHeadModel
    src, ck = str(tmp_path / "hf_no_tok"), str(tmp_path / "ck")
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=32, n_embd=32, n_layer=2,
                               n_head=4)).save_pretrained(src)
    assert import_hf.main(["--hf-model", src, "--save", ck, "--no-progress"]) == 0
    with pytest.raises(Exception, match="pass --vocab-file and --merge-file, or "
                                        "--tokenizer-model"):
        export_hf.export(ck, str(tmp_path / "out"), require_tokenizer=True)
    assert not os.path.exists(tmp_path / "out")
