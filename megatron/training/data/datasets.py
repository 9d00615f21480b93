"""Datasets and the sample-id schedule.

Datasets come from megatron.core.datasets (IndexedDataset .bin/.idx, GPTDataset, the blended
builder). What we add is an explicit, stateless map from (iteration, micro-batch, dp rank) to
the dataset indices of a micro-batch, the same rule as Megatron's pretraining sampler:
within a global batch, micro-batch j of replica d holds samples
    consumed + j*(mbs*dp) + d*mbs + [0, mbs).
Every pipeline stage computes it, so the middle stages know the sample ids of what crosses
them (the activation-delta codec keys its cache by them) without receiving them, and resuming
needs only `consumed_samples`.
"""
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from megatron.training.config.config_flags import ConfigError

_IDX_MAGIC = b"MMIDIDX\x00\x00"


def check_index_file(prefix: str) -> int:
    """Fail early, naming the file, on a truncated or foreign .idx / .bin pair."""
    idx, binf = prefix + ".idx", prefix + ".bin"
    try:
        with open(idx, "rb") as f:
            header = f.read(9 + 8 + 1 + 8 + 8)
    except OSError as e:
        raise ConfigError(f"--data-path: cannot read {idx}: {e}") from None
    if len(header) < 34 or header[:9] != _IDX_MAGIC:
        raise ConfigError(f"--data-path: {idx} is not a Megatron .idx file (bad header); "
                          f"regenerate it with tools/preprocess_data.py")
    dtype_code = header[17]
    seq_count = int.from_bytes(header[18:26], "little")
    doc_count = int.from_bytes(header[26:34], "little")
    dtype_size = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}.get(dtype_code)
    if dtype_size is None:
        raise ConfigError(f"--data-path: {idx} has an unknown dtype code {dtype_code}; "
                          f"regenerate it with tools/preprocess_data.py")
    expected = 34 + seq_count * 4 + seq_count * 8 + doc_count * 8
    if os.path.getsize(idx) not in (expected, expected + seq_count):  # + optional modes
        raise ConfigError(f"--data-path: {idx} is truncated or corrupt ({os.path.getsize(idx)} "
                          f"bytes, header implies {expected}); regenerate it with "
                          f"tools/preprocess_data.py")
    if seq_count:
        lengths = np.memmap(idx, dtype=np.int32, mode="r", offset=34, shape=(seq_count,))
        tokens = int(lengths.astype(np.int64).sum())
        if os.path.getsize(binf) != tokens * dtype_size:
            raise ConfigError(f"--data-path: {binf} has {os.path.getsize(binf)} bytes but "
                              f"{idx} describes {tokens * dtype_size}; the pair does not match")
    return max(doc_count - 1, 0)


@dataclass
class MicroBatchSchedule:
    """Which dataset indices micro-batch j of iteration i holds on replica d."""
    micro_batch_size: int
    data_parallel_size: int
    num_microbatches: int

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.data_parallel_size * self.num_microbatches

    def sample_ids(self, consumed_samples: int, microbatch: int, dp_rank: int) -> torch.Tensor:
        start = (consumed_samples + microbatch * self.micro_batch_size * self.data_parallel_size
                 + dp_rank * self.micro_batch_size)
        return torch.arange(start, start + self.micro_batch_size, dtype=torch.int64)


class _TokenizerAdapter:
    """What GPTDataset needs from a tokenizer: eod (and no pad: loss on every token)."""

    def __init__(self, tokenizer):
        self.eod = tokenizer.eod
        self.vocab_size = tokenizer.vocab_size
        # GPTDataset hashes its config, tokenizer included, to name its index cache.
        self.unique_identifiers = {"class": type(tokenizer).__name__,
                                   "vocab_size": tokenizer.vocab_size, "eod": tokenizer.eod}


def parse_blend(data_path: List[str]):
    if len(data_path) == 1:
        return [data_path[0]], None
    return list(data_path[1::2]), [float(w) for w in data_path[0::2]]


def build_datasets(data_path: List[str], split: str, seq_length: int, seed: int, tokenizer,
                   num_samples: List[int], cache_path: Optional[str]):
    """Train/valid/test GPTDatasets from megatron-core's blended builder."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder)
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    num_docs = min(check_index_file(prefix) for prefix in parse_blend(data_path)[0])
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=parse_blend(data_path), split=split,
        path_to_cache=cache_path, tokenizer=_TokenizerAdapter(tokenizer),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False)
    # A split nobody asked for, or one too small to hold a single document, is not built
    # (GPTDataset would loop forever trying to fill it).
    for i, bounds in enumerate(config.split_matrix):
        if bounds is not None and (num_samples[i] == 0   # None: one epoch, built
                                   or round(bounds[1] * num_docs) <= round(bounds[0] * num_docs)):
            config.split_matrix[i] = None
    return BlendedMegatronDatasetBuilder(GPTDataset, num_samples, lambda: True, config).build()


def collate(dataset, ids: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Stack samples into a micro-batch (B, S) of tokens, labels, loss_mask, position_ids."""
    n = len(dataset)
    items = [dataset[int(i) % n] for i in ids]
    keys = ("tokens", "labels", "loss_mask", "position_ids")
    return {k: torch.stack([it[k] for it in items]) for k in keys}
