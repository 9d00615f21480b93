"""The seeds' model families in and out of Hugging Face at every layout, and fine-tuned.

For Llama (GQA), Qwen2 (qkv bias, tied), GPT-NeoX (partial rope, parallel residual), OPT
(learned positions with offset 2, ReLU) and GPT-J (interleaved partial rope, shared-norm
parallel residual, lm_head bias), each a tiny random model built offline from a transformers
config with every tensor perturbed:
  - import_hf.py at (tp, pp) in (1,1), (2,1), (1,2), (2,2): the shards merge back to the (1,1)
    tensors bit for bit, and the first training loss at each layout equals Hugging Face's loss
    on the same global batch within 1e-5 relative; our logits at (1,1) are within 1e-4 of HF's;
  - at pp=2 the first iteration runs uncompressed, then delta-4 forward + fixpoint-8 backward
    fine-tune and the loss falls (TAH forward too for Qwen2);
  - export_hf.py from (2,2) gives back every Hugging Face tensor exactly;
  - Llama and Qwen2 use Hugging Face tokenizer directories built here with `tokenizers`
    (sentencepiece-style BPE; byte-level BPE), read by HuggingFaceTokenizer, their data
    tokenized by preprocess_data.py; a sentencepiece Unigram directory too; the others use
    a GPT-2 BPE;
  - unsupported config fields are refused by name, and a Llama checkpoint loaded with GPT-NeoX
    flags is refused naming the tensor.
One 4-rank job trains every (family, layout); everything else runs in the pytest process.
"""
import contextlib
import io
import json
import os

import pytest
import torch

from tests.distributed import run_distributed
from tools.checkpoint import export_hf, import_hf

FAMILIES = ["llama", "qwen2", "gpt_neox", "opt", "gptj"]
LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]
S = 32             # sequence length
FINETUNE_ITERS = 6
LOGIT_TOL, LOSS_RTOL = 1e-4, 1e-5


# --------------------------------------------------------------------------- tokenizers

def write_hf_tokenizer(directory, texts, vocab_size, kind):
    """A tokenizer directory trained here: sentencepiece-style "bpe" or "unigram" (metaspace
    pieces, <s> prepended, </s> = eos, as Llama's) or byte-level BPE (Qwen2's kind)."""
    from tokenizers import ByteLevelBPETokenizer, SentencePieceBPETokenizer, \
        SentencePieceUnigramTokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast
    if kind == "bytelevel":
        tok = ByteLevelBPETokenizer()
        tok.train_from_iterator(texts, vocab_size=vocab_size, show_progress=False,
                                special_tokens=["<|endoftext|>"])
        PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, eos_token="<|endoftext|>"
                                ).save_pretrained(directory)
        return
    special = ["<unk>", "<s>", "</s>"]
    if kind == "bpe":
        tok = SentencePieceBPETokenizer()
        tok.train_from_iterator(texts, vocab_size=vocab_size, special_tokens=special,
                                show_progress=False)
    else:
        tok = SentencePieceUnigramTokenizer()
        tok.train_from_iterator(texts, vocab_size=vocab_size, special_tokens=special,
                                unk_token="<unk>", show_progress=False)
    tok.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[
        ("<s>", tok.token_to_id("<s>"))])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, bos_token="<s>",
                                 eos_token="</s>", unk_token="<unk>")
    hf.save_pretrained(directory)


def _hf_config(family, vocab, eos):
    import transformers as T
    common = dict(vocab_size=vocab, bos_token_id=eos, eos_token_id=eos)
    if family in ("llama", "qwen2"):
        cls = T.LlamaConfig if family == "llama" else T.Qwen2Config
        return cls(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   rms_norm_eps=1e-5, tie_word_embeddings=family == "qwen2",
                   rope_parameters={"rope_type": "default",
                                    "rope_theta": 1e4 if family == "llama" else 1e6}, **common)
    if family == "gpt_neox":
        return T.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, max_position_embeddings=64,
                               use_parallel_residual=True, rope_parameters={
                                   "rope_type": "default", "rope_theta": 1e4,
                                   "partial_rotary_factor": 0.25}, **common)
    if family == "opt":
        return T.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=64,
                           word_embed_proj_dim=64, dropout=0.0, pad_token_id=eos, **common)
    return T.GPTJConfig(n_embd=64, n_layer=2, n_head=4, n_positions=64, rotary_dim=8,
                        n_inner=128, **common)


def _import(hf_dir, path, tp, pp, tok_flags):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = import_hf.main(["--hf-model", hf_dir, "--save", path, "--seq-length", str(S),
                               "--tensor-model-parallel-size", str(tp),
                               "--pipeline-model-parallel-size", str(pp), "--no-progress"]
                              + tok_flags)
    assert code == 0
    return out.getvalue().split("--finetune ", 1)[1].split()   # the printed model flags


@pytest.fixture(scope="module")
def zoo(tiny_corpus, tmp_path_factory):
    """Per family: the HF directory, its state dict, imports at every layout, data, flags."""
    from transformers import AutoModelForCausalLM
    from megatron.training.data.tokenizer import build_tokenizer
    from tools import preprocess_data
    root = tmp_path_factory.mktemp("zoo")
    texts = [json.loads(line)["text"] for line in open(tiny_corpus["jsonl"])]
    gpt2 = build_tokenizer("GPT2BPETokenizer", tiny_corpus["vocab"], tiny_corpus["merges"])
    out = {}
    for i, family in enumerate(FAMILIES):
        hf_dir = str(root / family)
        if family in ("llama", "qwen2"):   # HF tokenizer directories, saved with the model
            write_hf_tokenizer(hf_dir, [t[:3000] for t in texts[:40]], 512,
                               "bpe" if family == "llama" else "bytelevel")
            # AutoTokenizer reads config.json's model_type too (Qwen2's class adds its
            # <|endoftext|>): measure the vocabulary as the importer will see it.
            _hf_config(family, 512, 2).save_pretrained(hf_dir)
            tok = build_tokenizer("HuggingFaceTokenizer", tokenizer_model=hf_dir)
            vocab = tok.vocab_size
            prefix = str(root / f"{family}_data")
            with contextlib.redirect_stdout(io.StringIO()):
                assert preprocess_data.main(["--input", tiny_corpus["jsonl"], "--output-prefix",
                                             prefix, "--tokenizer-type", "HuggingFaceTokenizer",
                                             "--tokenizer-model", hf_dir, "--append-eod"]) == 0
            data, tok_flags, data_tok = prefix + "_text_document", [], [
                "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", hf_dir]
        else:
            tok, vocab = gpt2, gpt2.vocab_size
            data = tiny_corpus["prefix"]
            tok_flags = data_tok = ["--vocab-file", tiny_corpus["vocab"], "--merge-file",
                                    tiny_corpus["merges"]]
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_config(_hf_config(family, vocab, tok.eod))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))   # non-trivial biases and norms
        model.save_pretrained(hf_dir)
        ckpts, flags = {}, None
        for tp, pp in LAYOUTS:
            ckpts[(tp, pp)] = str(root / f"{family}_ck{tp}{pp}")
            flags = _import(hf_dir, ckpts[(tp, pp)], tp, pp, tok_flags)
        out[family] = {"hf": hf_dir, "state": {k: v.clone() for k, v in
                                               model.state_dict().items()},
                       "ckpts": ckpts, "flags": flags, "data": data, "tok": data_tok,
                       "vocab": vocab, "tokenizer": tok}
    return out


# --------------------------------------------------------------------------- training job

def _hf_loss(hf, trainer):
    """HF's loss on iteration 0's global batch: mean over replicas and micro-batches."""
    from megatron.core import parallel_state as ps
    from megatron.training.data.datasets import collate
    losses = []
    with torch.no_grad():
        for r in range(ps.get_data_parallel_world_size()):
            for mb in range(trainer.args.num_microbatches):
                b = collate(trainer.train_ds, trainer.batches.sample_ids(0, mb, r))
                logits = hf(input_ids=b["tokens"]).logits
                per_token = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), b["labels"].reshape(-1),
                    reduction="none")
                mask = b["loss_mask"].reshape(-1).float()
                losses.append((per_token * mask).sum() / mask.sum())
    return float(torch.stack(losses).mean())


def _logit_error(hf, trainer, vocab):
    from megatron.training.data.datasets import collate
    from megatron.training.model.model import unwrap
    b = collate(trainer.train_ds, trainer.batches.sample_ids(0, 0, 0))
    model = unwrap(trainer.model).eval()
    with torch.no_grad():
        ours = model(b["tokens"], b["position_ids"], None)[..., :vocab]
        theirs = hf(input_ids=b["tokens"]).logits
    model.train()
    return float((ours - theirs).abs().max())


def _argv(z, tp, pp, **extra):
    flags = {"tensor-model-parallel-size": tp, "pipeline-model-parallel-size": pp,
             "micro-batch-size": 1, "global-batch-size": 4, "train-iters": 1, "lr": 1e-3,
             "lr-decay-style": "constant", "log-interval": 1, "eval-interval": 1000,
             "eval-iters": 1, "split": "90,10,0", "data-path": z["data"],
             "load": z["ckpts"].get((tp, pp)), "finetune": True, **extra}
    argv = list(z["flags"]) + list(z["tok"])
    for k, v in flags.items():
        argv += [f"--{k}"] + ([] if v is True else [str(v)])
    return argv


def _train(argv, world, hf_dir, vocab, logits=False):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from megatron.core import parallel_state as ps
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.loop.training import Trainer
    args = parse_args(argv, world_size=world)
    initialize_distributed(args)
    trainer = Trainer(args)
    out = {}
    if dist.get_rank() == world - 1:
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True).eval()
        out["hf_loss"] = _hf_loss(hf, trainer)
        if logits:
            out["logit_error"] = _logit_error(hf, trainer, vocab)
    trainer.train()
    out["losses"] = list(trainer.loss_history)
    trainer.close()
    ps.destroy_model_parallel()
    return out


_FINETUNE = {"forward-compress-method": "delta", "forward-bits": 4,
             "backward-compress-method": "fixpoint", "backward-bits": 8,
             "compress-warmup-iters": 1, "train-iters": FINETUNE_ITERS}
_TAH = {"forward-compress-method": "tah", "tile-size": 32, "backward-compress-method": "fixpoint",
        "backward-bits": 8, "compress-warmup-iters": 1, "train-iters": FINETUNE_ITERS}


def _mismatch(z_from, z_flags, world):
    """Load a checkpoint of one family with another family's flags: the error text."""
    from megatron.core import parallel_state as ps
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.loop.training import Trainer
    argv = _argv(dict(z_flags, ckpts={(1, 1): z_from["ckpts"][(1, 1)]}), 1, 1)
    args = parse_args(argv, world_size=world)
    initialize_distributed(args)
    try:
        Trainer(args)
    except ValueError as e:
        return str(e)
    finally:
        ps.destroy_model_parallel()
    return None


def _job(rank, world, zoo):
    results = {}
    for family, z in zoo.items():
        z = {k: v for k, v in z.items() if k not in ("state", "tokenizer")}
        for tp, pp in LAYOUTS:
            extra = _FINETUNE if pp == 2 and tp == 1 else {}
            results[(family, tp, pp)] = _train(_argv(z, tp, pp, **extra), world, z["hf"],
                                               z["vocab"], logits=(tp, pp) == (1, 1))
        if family == "qwen2":
            results[(family, "tah")] = _train(_argv(z, 1, 2, **_TAH), world, z["hf"],
                                              z["vocab"])
    neox = {k: v for k, v in zoo["gpt_neox"].items() if k not in ("state", "tokenizer")}
    llama = {k: v for k, v in zoo["llama"].items() if k not in ("state", "tokenizer")}
    results["mismatch"] = _mismatch(llama, dict(neox, tok=llama["tok"], data=llama["data"]),
                                    world)
    return results if rank == world - 1 else None


@pytest.fixture(scope="module")
def trained(zoo):
    return run_distributed(_job, 4, (zoo,), timeout=900)[-1]


# --------------------------------------------------------------------------- tests

@pytest.mark.parametrize("family", FAMILIES)
def test_import_matches_hugging_face_at_every_layout(family, zoo, trained):
    from tools.checkpoint.layout import is_vocab_parallel, merge, read_checkpoint
    vocab = zoo[family]["vocab"]
    ref = merge(read_checkpoint(zoo[family]["ckpts"][(1, 1)])).params
    for tp, pp in LAYOUTS:
        full = merge(read_checkpoint(zoo[family]["ckpts"][(tp, pp)])).params
        assert full.keys() == ref.keys()
        for k in ref:   # the vocabulary padding (zero rows) depends on tp
            a, b = (full[k][:vocab], ref[k][:vocab]) if is_vocab_parallel(k) else (full[k], ref[k])
            assert torch.equal(a, b), (tp, pp, k)
            assert not full[k][vocab:].any() if is_vocab_parallel(k) else True
        r = trained[(family, tp, pp)]
        ours, theirs = r["losses"][0], r["hf_loss"]
        print(f"{family} ({tp},{pp}): first loss {ours:.7f} HF {theirs:.7f} "
              f"rel {abs(ours - theirs) / theirs:.1e}")
        assert abs(ours - theirs) <= LOSS_RTOL * theirs, (family, tp, pp, ours, theirs)
    print(f"{family} (1,1): max |logit - HF| {trained[(family, 1, 1)]['logit_error']:.2e}")
    assert trained[(family, 1, 1)]["logit_error"] <= LOGIT_TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_finetune_at_pp2_with_delta_and_fixpoint_loss_falls(family, trained):
    losses = trained[(family, 1, 2)]["losses"]
    print(f"{family} pp=2 delta-4/fixpoint-8 losses: {[round(x, 4) for x in losses]}")
    assert len(losses) == FINETUNE_ITERS
    assert losses[-1] < losses[0] - 0.05, losses


def test_tah_at_pp2_on_qwen2(trained):
    r = trained[("qwen2", "tah")]
    print(f"qwen2 pp=2 tah/fixpoint-8 losses: {[round(x, 4) for x in r['losses']]}")
    assert abs(r["losses"][0] - r["hf_loss"]) <= LOSS_RTOL * r["hf_loss"]
    assert r["losses"][-1] < r["losses"][0] - 0.05, r["losses"]


@pytest.mark.parametrize("family", FAMILIES)
def test_export_gives_back_every_tensor(family, zoo, tmp_path):
    from transformers import AutoModelForCausalLM
    out = str(tmp_path / "hf")
    with contextlib.redirect_stdout(io.StringIO()):
        assert export_hf.main(["--load", zoo[family]["ckpts"][(2, 2)], "--output", out,
                               "--no-progress"]) == 0
    back = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).state_dict()
    original = zoo[family]["state"]
    assert back.keys() == original.keys()
    for name, t in original.items():
        if family == "opt" and name.endswith("embed_positions.weight"):
            # rows 0 and 1 only serve left padding (position offset 2): exported as zeros
            assert torch.equal(back[name][2:], t[2:]) and not back[name][:2].any()
            continue
        assert torch.equal(back[name], t), name
    assert json.load(open(os.path.join(out, "config.json")))["model_type"] == family


def _first_doc(tiny_corpus):
    return json.loads(open(tiny_corpus["jsonl"]).readline())["text"]


def test_hf_tokenizer_directories_through_preprocess_data(zoo, tiny_corpus):
    """Llama's sentencepiece-style BPE and Qwen2's byte-level BPE, as the families used them."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    text = "def forward(self, x):\n    return x"
    for family in ("llama", "qwen2"):
        z = zoo[family]
        tok = z["tokenizer"]
        assert tok.vocab_size == z["vocab"]
        ids = tok.tokenize(text)
        if family == "llama":
            assert ids[0] == tok.vocab["<s>"] and tok.detokenize([tok.eod]) == "</s>"
            ids = ids[1:]   # BOS by default, as Llama's tokenizer
        assert tok.detokenize(ids) == text
        ds = IndexedDataset(z["data"])   # keep it alive: items are views of its mmap
        assert ds[0].tolist() == tok.tokenize(_first_doc(tiny_corpus)) + [tok.eod]


def test_sentencepiece_unigram_directory(tiny_corpus, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.training.data.tokenizer import build_tokenizer
    from tools import preprocess_data
    texts = [json.loads(line)["text"][:3000] for line in open(tiny_corpus["jsonl"])][:40]
    write_hf_tokenizer(str(tmp_path / "tok"), texts, 400, "unigram")
    tok = build_tokenizer("HuggingFaceTokenizer", tokenizer_model=str(tmp_path / "tok"))
    ids = tok.tokenize("def forward(self, x): return x")
    assert ids[0] == tok.vocab["<s>"] and tok.detokenize(ids[1:]) == "def forward(self, x): " \
        "return x"
    with contextlib.redirect_stdout(io.StringIO()):
        assert preprocess_data.main(["--input", tiny_corpus["jsonl"], "--output-prefix",
                                     str(tmp_path / "d"), "--tokenizer-type",
                                     "HuggingFaceTokenizer", "--tokenizer-model",
                                     str(tmp_path / "tok"), "--append-eod"]) == 0
    ds = IndexedDataset(str(tmp_path / "d_text_document"))
    assert ds[0].tolist() == tok.tokenize(_first_doc(tiny_corpus)) + [tok.eod]


def test_family_mismatch_is_refused_naming_the_tensor(trained):
    msg = trained["mismatch"]
    assert msg is not None
    assert "'decoder.layers.0.input_layernorm.bias'" in msg, msg
    assert "--normalization 'RMSNorm' (saved) vs 'LayerNorm' (given)" in msg, msg


def _save_config(config, directory):
    config.save_pretrained(directory)
    return str(directory)


@pytest.mark.parametrize("case,field", [
    ("qwen2_sliding_window", "sliding_window=8"),
    ("falcon_alibi", "alibi=True"),
    ("llama3_rope_scaling", "rope_parameters.rope_type='llama3'"),
    ("opt_post_layernorm", "do_layer_norm_before=False"),
    ("opt_project_in", "word_embed_proj_dim=32"),
    ("gptj_tied", "tie_word_embeddings=True"),
    ("llama_attention_bias", "attention_bias=True"),
    ("neox_relu", "hidden_act='relu'"),
    ("mistral", "model_type 'mistral' is not supported"),
])
def test_unsupported_config_fields_are_refused_by_name(case, field, tmp_path, capsys):
    import transformers as T
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=64)
    configs = {
        "qwen2_sliding_window": lambda: T.Qwen2Config(use_sliding_window=True, sliding_window=8,
                                                      **small),
        "falcon_alibi": lambda: T.FalconConfig(alibi=True, **small),
        "llama3_rope_scaling": lambda: T.LlamaConfig(rope_parameters={
            "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, **small),
        "opt_post_layernorm": lambda: T.OPTConfig(do_layer_norm_before=False, ffn_dim=64,
                                                  word_embed_proj_dim=32, **small),
        "opt_project_in": lambda: T.OPTConfig(word_embed_proj_dim=32, ffn_dim=64,
                                              hidden_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, vocab_size=64),
        "gptj_tied": lambda: T.GPTJConfig(n_embd=32, n_layer=2, n_head=4, vocab_size=64,
                                          rotary_dim=4, tie_word_embeddings=True),
        "llama_attention_bias": lambda: T.LlamaConfig(attention_bias=True, **small),
        "neox_relu": lambda: T.GPTNeoXConfig(hidden_act="relu", **small),
        "mistral": lambda: T.MistralConfig(sliding_window=None, **small),
    }
    d = _save_config(configs[case](), tmp_path / case)
    assert import_hf.main(["--hf-model", d, "--save", str(tmp_path / "ck")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]   # one line, after any warnings
    assert last.startswith("error: ") and field in last, last
    assert not os.path.exists(tmp_path / "ck")


def test_export_refuses_a_model_no_family_holds(zoo, tmp_path, capsys):
    """Llama flags with a parallel residual: no family has both; each family's reason named."""
    from tools.checkpoint.layout import merge, read_checkpoint, split, write_checkpoint
    full = merge(read_checkpoint(zoo["llama"]["ckpts"][(1, 1)]))
    full.args["model"]["parallel_residual"] = True
    path = str(tmp_path / "ck")
    os.makedirs(path)
    write_checkpoint(path, split(full, 1, 1))
    assert export_hf.main(["--load", path, "--output", str(tmp_path / "hf"),
                           "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "LlamaForCausalLM: --parallel-residual=True (Hugging Face LlamaForCausalLM is " \
           "sequential pre-norm)" in err, err
    assert not os.path.exists(tmp_path / "hf")

