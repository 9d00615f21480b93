"""Checkpoints the tool tests share, each made once per session.

Distributed jobs are few on purpose (each costs a process start per rank):
  job (2,2,1), 4 ranks: train 6 iterations saving at 3 and 6 -> ck22 (the losses of iterations
      4-6 are the reference, and the training loop's validation loss at 6); reshard
      iteration 3 to (1,4) inside the job and resume it -> losses to compare.
  job (1,4,2), 8 ranks: train 3 iterations -> ck14.
  job "single", 1 rank: our model's logits at (1,1) from each merged checkpoint, and
      val_ppl on ck22 (see test_export_eval.py).
Everything else (reshard, export, import, lm-eval) runs in the pytest process.
"""
import json
import os

import pytest

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TRAIN_ITERS = 6
SAVE_AT = 3


def _argv(corpus, tp, pp, **extra):
    return tiny_gpt_argv(corpus, **{"tensor-model-parallel-size": tp,
                                    "pipeline-model-parallel-size": pp,
                                    "train-iters": TRAIN_ITERS, "eval-iters": 2, **extra})


def _run(argv, world, evaluate=False):
    """One Trainer: train, optionally evaluate; (losses, validation loss) on the last rank."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.loop.training import Trainer
    args = parse_args(argv, world_size=world)
    initialize_distributed(args)
    trainer = Trainer(args)
    trainer.train()
    valid = trainer.evaluate() if evaluate else None
    losses = list(trainer.loss_history)
    trainer.close()
    ps.destroy_model_parallel()
    last = dist.get_rank() == dist.get_world_size() - 1
    return (losses, valid) if last else None


def _job_22(rank, world, corpus, root):
    import torch.distributed as dist
    from tools.checkpoint.reshard import reshard
    ck22, ck14r = os.path.join(root, "ck22"), os.path.join(root, "ck22_to_14")
    ref = _run(_argv(corpus, 2, 2, save=ck22, **{"save-interval": SAVE_AT}), world,
               evaluate=True)
    if rank == 0:
        reshard(ck22, ck14r, tp=1, pp=4, iteration=SAVE_AT)
    dist.barrier()
    resumed = _run(_argv(corpus, 1, 4, load=ck14r), world)
    if rank != world - 1:
        return None
    return {"uninterrupted": ref[0], "valid_loss": ref[1], "resharded_14": resumed[0]}


def _job_14(rank, world, corpus, root):
    out = _run(_argv(corpus, 1, 4, save=os.path.join(root, "ck14"),
                     **{"exit-interval": SAVE_AT}), world)
    return out


@pytest.fixture(scope="session")
def ckpts(tiny_corpus, tmp_path_factory):
    """Trained checkpoints at (2,2,1) and (1,4,2) and the losses of the resume comparison."""
    root = str(tmp_path_factory.mktemp("ckpts"))
    r22 = run_distributed(_job_22, 4, (tiny_corpus, root), timeout=900)[-1]
    r14 = run_distributed(_job_14, 8, (tiny_corpus, root), timeout=900)[-1]
    return {"root": root, "ck22": os.path.join(root, "ck22"),
            "ck22_to_14": os.path.join(root, "ck22_to_14"),
            "ck14": os.path.join(root, "ck14"), "losses22": r22, "losses14": r14[0]}


# --------------------------------------------------------------------------- Hugging Face side

def write_vocab1000_tokenizer(directory: str):
    """A 1000-token GPT-2 BPE (not a multiple of 128: exercises vocabulary padding)."""
    import glob
    import sysconfig
    from tokenizers import ByteLevelBPETokenizer
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:40]
    texts = [open(f, encoding="utf-8", errors="ignore").read()[:6000] for f in files]
    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(texts, vocab_size=1000, show_progress=False,
                            special_tokens=["<|endoftext|>"])
    os.makedirs(directory, exist_ok=True)
    tok.save_model(directory)
    return os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")


@pytest.fixture(scope="session")
def hf_gpt2(tmp_path_factory):
    """A random GPT2LMHeadModel (every tensor perturbed, tanh GeLU) with its tokenizer, saved."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from megatron.training.data.tokenizer import build_tokenizer
    root = tmp_path_factory.mktemp("hf_gpt2")
    vocab, merges = write_vocab1000_tokenizer(str(root / "tok"))
    tok = build_tokenizer("GPT2BPETokenizer", vocab, merges)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=4,
                        n_head=4, activation_function="gelu_new", bos_token_id=tok.eod,
                        eos_token_id=tok.eod)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # non-trivial biases and LayerNorms
    path = str(root / "model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return {"dir": path, "vocab": vocab, "merges": merges,
            "state": {k: v.clone() for k, v in model.state_dict().items()}}


def write_local_tasks(directory: str, texts):
    """lm-eval task YAMLs + data: a multiple-choice task and a rolling-perplexity task."""
    os.makedirs(directory, exist_ok=True)
    mc = os.path.join(directory, "tiny_mc.jsonl")
    with open(mc, "w") as f:
        for i in range(8):
            f.write(json.dumps({"question": f"def f{i}(self, x):\n    return",
                                "choices": [" x", " None", " self.x"], "label": i % 3}) + "\n")
    ppl = os.path.join(directory, "tiny_ppl.jsonl")
    with open(ppl, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    common = "test_split: test\n"
    with open(os.path.join(directory, "tiny_mc.yaml"), "w") as f:
        f.write(f"task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                f"    test: {mc}\n{common}output_type: multiple_choice\n"
                "doc_to_text: \"{{question}}\"\ndoc_to_choice: \"{{choices}}\"\n"
                "doc_to_target: label\nmetric_list:\n"
                "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
                "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"
                "metadata:\n  version: 1.0\n")
    with open(os.path.join(directory, "tiny_ppl.yaml"), "w") as f:
        f.write(f"task: tiny_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                f"    test: {ppl}\n{common}output_type: loglikelihood_rolling\n"
                "doc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\nmetric_list:\n"
                "  - metric: word_perplexity\n    aggregation: weighted_perplexity\n"
                "    higher_is_better: false\n"
                "  - metric: byte_perplexity\n    aggregation: weighted_perplexity\n"
                "    higher_is_better: false\n"
                "  - metric: bits_per_byte\n    aggregation: bits_per_byte\n"
                "    higher_is_better: false\n"
                "metadata:\n  version: 1.0\n")
    return directory
