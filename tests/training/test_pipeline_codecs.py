"""--activation-cache-dtype in the training loop (delta codec, pp 2, 2 ranks).

- fp16 by default (as AC-SGD); the flag reaches both link ends' caches, whose start-up line
  names the dtype and its bytes;
- fp16 caches stay bit-identical between sender and receiver over several epochs;
- resume with an fp16 cache in a memmap file (disk) is bit-exact against an uninterrupted run
  with the cache in RAM (same bits either way);
- the fp16 run's losses are those of the fp32 cache to within 1e-3 (measured: within 2e-5
  over 12 iterations);
- misuse is refused naming the flag.
"""
import hashlib

import pytest

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed


@pytest.fixture(scope="module")
def small_corpus(tiny_corpus, tmp_path_factory):
    """~40 samples of 32 tokens: one epoch is a few global batches, so samples come back."""
    import glob
    import os
    import sysconfig

    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer(tiny_corpus["vocab"], tiny_corpus["merges"])
    eod = tok.token_to_id("<|endoftext|>")
    prefix = str(tmp_path_factory.mktemp("small_corpus") / "text_document")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:3]
    for f in files:
        text = open(f, encoding="utf-8", errors="ignore").read()[:1500]
        builder.add_item(torch.tensor(tok.encode(text).ids + [eod]))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return dict(tiny_corpus, prefix=prefix)


def _argv(corpus, **kw):
    return tiny_gpt_argv(corpus, **{"pipeline-model-parallel-size": 2, "train-iters": 6,
                                    "forward-compress-method": "delta", "forward-bits": 4,
                                    "compress-warmup-iters": 1, **kw})


def _cache(trainer):
    """(sha256 of this rank's fwd cache state, its describe() line, its dtype)."""
    ch = trainer.channels
    link = ch.next_fwd or ch.prev_fwd
    sd = link.codec.state_dict()["cache"]
    h = hashlib.sha256(sd["entries"].numpy().tobytes())
    h.update(sd["data"].numpy().tobytes())
    return h.hexdigest(), link.codec.describe(), str(link.codec.cache.dtype), \
        link.codec.first_sights, trainer.epoch_samples


def _worker(rank, world, corpus, root):
    import torch.distributed as dist
    from tests.training import runner
    disk = {"activation-cache-dtype": "fp16", "activation-cache-location": f"disk:{root}"}
    out = {"fp32": runner._run(_argv(corpus, **{"activation-cache-dtype": "fp32"}), world,
                               _cache),
           "fp16": runner._run(_argv(corpus), world, _cache),   # the default
           "first": runner._run(_argv(corpus, **disk, save=f"{root}/ck",
                                      **{"exit-interval": 3}), world, _cache)}
    dist.barrier()
    out["resumed"] = runner._run(_argv(corpus, **disk, load=f"{root}/ck"), world, _cache)
    return out


@pytest.fixture(scope="module")
def job(small_corpus, tmp_path_factory):
    return run_distributed(_worker, 2, (small_corpus, str(tmp_path_factory.mktemp("ck"))),
                           timeout=600)


def test_fp16_cache_identical_on_both_ends_and_announced(job):
    send, recv = job[0]["fp16"][1], job[1]["fp16"][1]
    assert send[0] == recv[0]                            # bit-identical caches
    assert send[2] == "torch.float16" and "float16" in send[1]
    epoch = send[4]
    assert 8 <= epoch < 6 * 8 and send[3] == epoch      # samples came back: one sight each
    # the start-up line: capacity (every sample of the run, 6 x 8 capped at an epoch) x S x H
    assert f"({epoch * 32 * 32 * 2:,} bytes)" in send[1]
    fp32 = job[0]["fp32"][1]
    assert fp32[2] == "torch.float32" and f"({epoch * 32 * 32 * 4:,} bytes)" in fp32[1]


def test_fp16_cache_resumes_bit_exact_from_disk(job):
    straight = job[1]["fp16"][0]
    first, resumed = job[1]["first"][0], job[1]["resumed"][0]
    assert len(straight) == 6 and first == straight[:3] and resumed == straight[3:]
    assert "disk" in job[0]["resumed"][1][1]
    for r in range(2):                                    # the same cache bytes at the end
        assert job[r]["resumed"][1][0] == job[r]["fp16"][1][0]


def test_fp16_cache_trains_like_fp32(job):
    fp32, fp16 = job[1]["fp32"][0], job[1]["fp16"][0]
    assert fp16 == pytest.approx(fp32, abs=1e-3)
    assert fp16[-1] < fp16[0]


@pytest.mark.parametrize("flags,needle", [
    ({"forward-compress-method": "fixpoint", "activation-cache-dtype": "fp32"},
     "--activation-cache-dtype configures the delta codecs' activation cache"),
    ({"forward-compress-method": "delta-lowbits", "activation-cache-dtype": "bf16"},
     "delta-lowbits stores its cache at --forward-bits-act bits"),
])
def test_cache_dtype_misuse_is_refused(tiny_corpus, flags, needle):
    from megatron.training.flags.arguments import parse_args
    from megatron.training.config.config_flags import ConfigError
    with pytest.raises(ConfigError) as e:
        parse_args(_argv(tiny_corpus, **flags), world_size=2)
    assert needle in str(e.value)
