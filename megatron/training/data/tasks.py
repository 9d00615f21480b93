"""--task-name: fine-tuning data as weighted jsonl files (the CocktailSGD / AC-SGD spelling).

    --task-name a.jsonl:0.5,b.jsonl:1.0,data/c_text_document:0.25

Each entry is a jsonl file ({"text": ...} per line) or a .bin/.idx prefix, with an optional
sampling weight (default 1); weights are normalised and the entries become a weighted
--data-path blend. A jsonl without an up-to-date tokenised copy is tokenised on the fly (on
rank 0, as tools/preprocess_data.py does, written atomically; the others wait) into
--data-cache-path, or next to the file, as <stem>.<tokenizer>-<vocab>_text_document.bin/.idx.
A copy older than its jsonl is rebuilt.
"""
import os
from typing import List, Tuple

from megatron.training.config.config_flags import ConfigError


def parse_task_name(spec: str) -> List[Tuple[str, float]]:
    """'a.jsonl:0.5,b' -> [('a.jsonl', 0.5), ('b', 1.0)]; checks files and weights."""
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        path, weight = item, 1.0
        if ":" in item:
            head, tail = item.rsplit(":", 1)
            try:
                path, weight = head, float(tail)
            except ValueError:
                pass   # a ':' inside the path, no weight
        if not weight > 0:
            raise ConfigError(f"--task-name: weight of {path!r} must be > 0, got {weight}")
        is_jsonl = path.endswith((".jsonl", ".json"))
        if is_jsonl and not os.path.isfile(path):
            raise ConfigError(f"--task-name: {path} does not exist")
        if not is_jsonl and not (os.path.isfile(path + ".bin") and os.path.isfile(path + ".idx")):
            raise ConfigError(f"--task-name: {path!r} is neither a .jsonl file nor a prefix "
                              f"with .bin/.idx files")
        out.append((path, weight))
    if not out:
        raise ConfigError(f"--task-name {spec!r} names no data; give 'a.jsonl:0.5,b.jsonl:1.0'")
    return out


def cached_prefix(path: str, tokenizer, cache_dir) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    where = cache_dir or os.path.dirname(os.path.abspath(path))
    return os.path.join(where, f"{stem}.{type(tokenizer).__name__}-{tokenizer.vocab_size}")


def _stale(jsonl: str, prefix: str) -> bool:
    idx = prefix + "_text_document.idx"
    return not os.path.isfile(idx) or os.path.getmtime(idx) < os.path.getmtime(jsonl)


def resolve_task_name(spec: str, tokenizer, cache_dir=None) -> List[str]:
    """The --data-path blend ['w1', 'prefix1', ...] (weights normalised); may tokenise.

    Collective when torch.distributed is initialised: rank 0 tokenises, every rank waits.
    """
    import torch.distributed as dist
    entries = parse_task_name(spec)
    total = sum(w for _, w in entries)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    blend = []
    for path, weight in entries:
        prefix = path
        if path.endswith((".jsonl", ".json")):
            out = cached_prefix(path, tokenizer, cache_dir)
            if rank0 and _stale(path, out):
                from megatron.training.data.preprocess import preprocess
                preprocess(path, out, tokenizer)
            prefix = out + "_text_document"
        blend += [repr(weight / total), prefix]
    if dist.is_initialized():
        dist.barrier()
    return blend if len(entries) > 1 else [blend[1]]
