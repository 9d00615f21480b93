"""Local model and task files -> what pretrain_gpt.py loads, made once by rank 0.

The seeds' processes start independently (no process group yet), so rank 0 writes each
artefact under a key of its inputs and renames it into place, and every other rank waits for
that final name. A second run with the same inputs finds the artefacts and skips the work.
"""
import hashlib
import json
import os
import time
from typing import List, Optional, Tuple

from tools.checkpoint.errors import CheckpointError

WAIT_SECONDS = 1800
SEED_TASKS = ("wikitext", "arxiv21", "cot", "pile", "ni", "glue", "qqp", "cola", "qnli")


class RunnerError(ValueError):
    """A seed flag that cannot be mapped; the message names it and says what to use."""


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def _mtime(path: str) -> float:
    return max((os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs),
               default=os.path.getmtime(path)) if os.path.isdir(path) else os.path.getmtime(path)


def wait_for(path: str, what: str) -> None:
    deadline = time.time() + WAIT_SECONDS
    while not os.path.exists(path):
        if time.time() > deadline:
            raise RunnerError(f"waited {WAIT_SECONDS}s for rank 0 to write {what} ({path}); "
                              f"is rank 0 running with the same flags?")
        time.sleep(0.5)


# --------------------------------------------------------------------------- tokenizer

def tokenizer_flags(directory: str) -> List[str]:
    """pretrain_gpt.py / preprocess_data.py tokenizer flags for a local tokenizer directory."""
    if not os.path.isdir(directory):
        raise RunnerError(f"--tokenizer-name {directory}: not a local directory; nothing is "
                          f"downloaded here, give the directory the tokenizer was saved to")
    vocab, merges = (os.path.join(directory, f) for f in ("vocab.json", "merges.txt"))
    if os.path.isfile(vocab) and os.path.isfile(merges):
        return ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab,
                "--merge-file", merges]
    return ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", directory]


# --------------------------------------------------------------------------- model

def hf_config(directory: str) -> Optional[dict]:
    path = os.path.join(directory, "config.json")
    return json.load(open(path)) if os.path.isfile(path) else None


def check_model_source(a) -> str:
    """'hf' or 'checkpoint' for --model-name; refuses what has no counterpart."""
    d = a.model_name
    if not os.path.isdir(d):
        raise RunnerError(f"--model-name {d}: not a local directory; nothing is downloaded "
                          f"here: save the model with save_pretrained() and give that directory")
    if os.path.isfile(os.path.join(d, "latest_checkpointed_iteration.txt")):
        return "checkpoint"
    if os.path.isfile(os.path.join(d, "pytorch_embs.pt")):
        raise RunnerError(f"--model-name {d} holds AC-SGD's per-layer split "
                          f"(convert_gpt2_checkpoint.py output); give the Hugging Face "
                          f"directory it was made from instead")
    config = hf_config(d)
    if config is None:
        raise RunnerError(f"--model-name {d}: no config.json (Hugging Face model) and no "
                          f"latest_checkpointed_iteration.txt (megatron-cc checkpoint)")
    family = config.get("model_type")
    importable = _importable_families()
    if family not in importable:
        raise RunnerError(f"--model-name {d}: config.json model_type {family!r} has no importer "
                          f"(tools/checkpoint/import_hf.py imports "
                          f"{', '.join(sorted(importable))})")
    if a.model_type is not None and seed_model_type(a.model_type) != family:
        raise RunnerError(f"--model-type {a.model_type}, but --model-name {d} is a {family!r} "
                          f"model (config.json model_type); give --model-type "
                          f"{family.replace('_', '')} or drop it")
    return "hf"


def _importable_families() -> set:
    """config.json model_types import_hf.py converts (its family registry)."""
    from tools.checkpoint.hf_families import FAMILIES
    return set(FAMILIES)


def seed_model_type(name: str) -> str:
    """CocktailSGD's --model-type spelling -> config.json's model_type: its scripts write
    gptneox / gptj / opt / llama, with flash_ variants of the same architectures."""
    name = name.lower()
    name = name[len("flash_"):] if name.startswith("flash_") else name
    return {"gptneox": "gpt_neox", "gpt-neox": "gpt_neox", "gpt-j": "gptj"}.get(name, name)


def import_model(a, pp: int, tok_flags: List[str]) -> Tuple[str, dict]:
    """Import the Hugging Face model at (1, pp); returns (checkpoint dir, its model args)."""
    from tools.checkpoint import import_hf
    from tools.checkpoint.layout import read_latest  # noqa: F401  (layout is the reader)
    root = os.path.abspath(a.runner_cache_dir)
    key = _key(os.path.realpath(a.model_name), _mtime(a.model_name), pp, a.seq_length, tok_flags)
    ckpt = os.path.join(root, f"model_{os.path.basename(os.path.normpath(a.model_name))}_{key}")
    done = os.path.join(ckpt, "latest_checkpointed_iteration.txt")
    if a.rank == 0 and not os.path.exists(done):
        os.makedirs(root, exist_ok=True)
        argv = ["--hf-model", a.model_name, "--save", ckpt, "--pipeline-model-parallel-size",
                str(pp), "--seq-length", str(a.seq_length), "--no-progress"] + \
            [x for x in tok_flags if x != "--tokenizer-type"
             and x not in ("GPT2BPETokenizer", "HuggingFaceTokenizer")]
        if import_hf.main(argv) != 0:
            raise RunnerError(f"--model-name {a.model_name}: the import failed (message above)")
    wait_for(done, "the imported model")
    return ckpt, checkpoint_model_args(ckpt)


def checkpoint_model_args(ckpt: str) -> dict:
    from tools.checkpoint.layout import read_checkpoint
    try:
        first = next(iter(read_checkpoint(ckpt).shards.values()))
    except CheckpointError as e:
        raise RunnerError(f"--model-name {ckpt}: {e}") from None
    return first["args"]


# --------------------------------------------------------------------------- task data

def parse_task(spec: str) -> List[Tuple[str, Optional[float]]]:
    items = []
    for part in spec.split(","):
        path, weight = part, None
        head, sep, tail = part.rpartition(":")
        if sep and head:
            try:
                weight = float(tail)
                path = head
            except ValueError:
                pass
        items.append((path, weight))
    return items


def task_prefixes(a, tok_flags: List[str]) -> List[str]:
    """--data-path values for --task-name: tokenised local .jsonl files or existing prefixes."""
    items = parse_task(a.task_name)
    weights = [w for _, w in items]
    if len(items) > 1 and any(w is None for w in weights):
        raise RunnerError(f"--task-name {a.task_name}: several tasks need a weight each, "
                          f"e.g. a.jsonl:0.7,b.jsonl:0.3")
    out = []
    for path, weight in items:
        prefix = _prefix_for(a, path, tok_flags)
        out += ([str(weight)] if len(items) > 1 else []) + [prefix]
    return out


def _prefix_for(a, path: str, tok_flags: List[str]) -> str:
    if os.path.isfile(path + ".bin") and os.path.isfile(path + ".idx"):
        return path
    if not os.path.isfile(path):
        if path.lower() in SEED_TASKS:
            raise RunnerError(f"--task-name {path}: the seed downloads this task; nothing is "
                              f"downloaded here: give a local .jsonl file ({{\"text\": ...}} "
                              f"per line; tools/text_to_jsonl.py converts raw text such as "
                              f"wikitext's) or a .bin/.idx prefix of tools/preprocess_data.py")
        raise RunnerError(f"--task-name {path}: no such file and no {path}.bin/.idx")
    root = os.path.abspath(a.runner_cache_dir)
    stem = os.path.splitext(os.path.basename(path))[0]
    base = os.path.join(root, f"task_{stem}_{_key(os.path.realpath(path), _mtime(path), tok_flags)}")
    prefix, done = base + "_text_document", base + ".done"
    if a.rank == 0 and not os.path.exists(done):
        os.makedirs(root, exist_ok=True)
        from tools import preprocess_data
        code = preprocess_data.main(["--input", path, "--output-prefix", base, "--json-keys",
                                     "text", "--append-eod", "--workers", "1"] + tok_flags)
        if code not in (0, None):
            raise RunnerError(f"--task-name {path}: tokenising failed (message above)")
        open(done, "w").close()
    wait_for(done, f"the tokenised task {path}")
    return prefix


def train_samples_per_epoch(data_path: List[str], split: str, seq_length: int) -> int:
    """Samples in one pass over the training split, as GPTDataset counts them: the training
    documents' tokens, less the one extra token each sample reads, in seq_length windows."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    parts = [float(x) for x in split.replace("/", ",").split(",")]
    share = parts[0] / sum(parts)
    prefixes = data_path[1::2] if len(data_path) > 1 else data_path
    total = 0
    for prefix in prefixes:
        ds = IndexedDataset(prefix)
        n_docs = len(ds.document_indices) - 1
        end_doc = int(round(share * n_docs))
        end_seq = int(ds.document_indices[end_doc])
        tokens = int(ds.sequence_lengths[:end_seq].sum())
        total += max(0, (tokens - 1) // seq_length)
    return total
