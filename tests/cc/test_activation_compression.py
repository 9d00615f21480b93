"""AC-SGD / TAH-Quant on the pipeline channels, inside the real training loop.

- config: contradictions are refused before training, naming the flags;
- one link (2 ranks): warm-up messages go uncompressed and fill both caches exactly, a
  sample's first compressed message carries plain b-bit fixpoint of x (its slot starts at
  zero), evaluation messages leave the caches alone;
- training at (pp=2, dp=2) and (pp=4): after N iterations the sender's and receiver's
  activation caches are bit-identical on every boundary (sha256), samples come back in the
  next epoch under the same key, and bytes on the wire are exactly the codec's payload sizes;
- resume with delta-lowbits (stochastic rounding) + tiled fixpoint gradients is bit-exact;
- forward x backward x data-parallel modes compose (tah + CB/LEP + PowerSGD + fused emb);
- fine-tuning from an imported Hugging Face GPT-2 at pp=4 with delta-4 forward and fixpoint-8
  backward starts at HF's own loss on the same batch and the loss falls.

Distributed jobs are few (each costs a process start per rank): every job trains several
Trainers one after the other.
"""
import ast
import hashlib
import os
import sysconfig

import pytest
import torch

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed

S, H = 32, 32   # seq, hidden of tiny_gpt_argv (micro-batch 1, global batch 8)


# ------------------------------------------------------------------------------ fixtures
def _wikitext_style(path: str, n_articles: int = 10, chars: int = 300) -> None:
    """A small wikitext-style file: ' = module = ' headings over stdlib module docstrings."""
    stdlib = sysconfig.get_paths()["stdlib"]
    names = sorted(f for f in os.listdir(stdlib) if f.endswith(".py"))
    with open(path, "w", encoding="utf-8") as out:
        k = 0
        for f in names:
            try:
                doc = ast.get_docstring(ast.parse(open(os.path.join(stdlib, f)).read()))
            except (SyntaxError, UnicodeDecodeError):
                continue
            if not doc or len(doc) < chars // 2:
                continue
            out.write(f" = {f[:-3]} = \n\n")
            for para in doc[:chars].split("\n\n"):
                out.write(" " + " ".join(para.split()) + " \n\n")
            k += 1
            if k == n_articles:
                break


@pytest.fixture(scope="module")
def task(tiny_corpus, tmp_path_factory):
    """A local fine-tuning task made the documented way: raw text -> jsonl -> .bin/.idx.

    Small on purpose: one epoch of the training split is a few global batches, so training
    runs several epochs and the activation caches see their samples again.
    """
    from megatron.training.data.tokenizer import build_tokenizer
    from tools import text_to_jsonl
    from tools.preprocess_data import preprocess
    d = tmp_path_factory.mktemp("task")
    raw, jsonl = str(d / "task.raw"), str(d / "task.jsonl")
    _wikitext_style(raw)
    assert text_to_jsonl.main([raw, "--output", jsonl, "--split", "heading"]) == 0
    tok = build_tokenizer("GPT2BPETokenizer", tiny_corpus["vocab"], tiny_corpus["merges"])
    preprocess(jsonl, str(d / "task"), tok, append_eod=True)
    return dict(tiny_corpus, prefix=str(d / "task_text_document"))


def _argv(corpus, **kw):
    return tiny_gpt_argv(corpus, **kw)


# ------------------------------------------------------------------------------ config
@pytest.mark.parametrize("flags,fragment", [
    ({"forward-compress-method": "delta", "forward-bits": 9}, "--forward-bits must be in 1..8"),
    ({"forward-compress-method": "delta-lowbits", "forward-bits-act": 0},
     "--forward-bits-act must be in 1..8"),
    ({"backward-compress-method": "fixpoint", "backward-bits": 12}, "--backward-bits must be"),
    ({"forward-compress-method": "tah", "tile-size": 48}, "--tile-size must be a power of two"),
    ({"forward-compress-method": "tah", "high-precision-allocation-ratio": 1.5},
     "--high-precision-allocation-ratio must be in [0, 1]"),
    ({"backward-compress-method": "fixpoint", "backward-tile-size": 24},
     "--backward-tile-size must be a power of two"),
    ({"backward-compress-method": "lowrank", "backward-rank": 8, "inter-grad-comp": True,
      "inter-grad-comp-rank": 16}, "--backward-rank 8 and --inter-grad-comp-rank 16"),
    ({"backward-compress-method": "fixpoint", "inter-grad-comp": True},
     "--inter-grad-comp (low-rank CB) and --backward-compress-method fixpoint"),
    ({"backward-rank": 4}, "--backward-rank is the rank of --backward-compress-method lowrank"),
    ({"forward-compress-method": "delta", "warmup-epochs": 1, "compress-warmup-iters": 3},
     "both set the warm-up"),
    ({"forward-compress-method": "fixpoint", "max-activation-cache-size": 8},
     "--max-activation-cache-size configures the delta codecs' activation cache"),
    ({"forward-compress-method": "delta", "activation-cache-location": "disk:/no/such/dir"},
     "--activation-cache-location must be 'ram', 'device' or"),
    ({"forward-compress-method": "tah", "stochastic-rounding": True},
     "--stochastic-rounding changes the fixpoint / delta quantisers"),
    ({"forward-compress-method": "delta", "pipeline-model-parallel-size": 1},
     "with --pipeline-model-parallel-size 1 nothing does"),
    ({"forward-compress-method": "delta", "data-path": None}, None),   # valid
])
def test_contradictions_are_refused_before_training(tiny_corpus, flags, fragment):
    from megatron.training.flags.arguments import ConfigError, parse_args
    flags = {"pipeline-model-parallel-size": 2, **flags}
    argv = _argv(tiny_corpus, **flags)
    if fragment is None:
        args = parse_args(argv, world_size=2)
        assert args.compression.activation_cache and args.compression.uses_epochs
        return
    with pytest.raises(ConfigError) as e:
        parse_args(argv, world_size=2)
    assert fragment in str(e.value)


@pytest.mark.parametrize("flag,value,fragment", [
    ("compress-warmup-iters", "abc", "expected a whole number of iterations, got 'abc'"),
    ("compress-warmup-iters", "1.5", "expected a whole number of iterations, got '1.5'"),
    ("warmup-epochs", "x", "expected a number of epochs, got 'x'"),
])
def test_a_warmup_that_is_not_a_number_is_named(tiny_corpus, capsys, flag, value, fragment):
    """argparse names the flag; the converter says what it expected (not 'invalid in_iters')."""
    from megatron.training.flags.arguments import parse_args
    argv = _argv(tiny_corpus, **{"pipeline-model-parallel-size": 2}) + [f"--{flag}", value]
    with pytest.raises(SystemExit):
        parse_args(argv, world_size=2)
    err = capsys.readouterr().err
    assert f"argument --{flag}" in err and fragment in err


@pytest.mark.parametrize("flags", [{"repeat-epoch": True},
                                   {"forward-compress-method": "delta"},
                                   {"forward-compress-method": "tah", "warmup-epochs": 1}])
def test_epochs_need_one_dataset_not_a_blend(tiny_corpus, flags):
    from megatron.training.flags.arguments import ConfigError, parse_args
    p = tiny_corpus["prefix"]
    argv = _argv(tiny_corpus, **{"pipeline-model-parallel-size": 2, "data-path": None,
                                 **flags}) + ["--data-path", "0.5", p, "0.5", p]
    with pytest.raises(ConfigError, match="a weighted --data-path blend has no epochs"):
        parse_args(argv, world_size=2)


def test_lowrank_method_is_compressed_backprop(tiny_corpus):
    from megatron.training.flags.arguments import parse_args
    a = parse_args(_argv(tiny_corpus, **{"pipeline-model-parallel-size": 2,
                                         "backward-compress-method": "lowrank",
                                         "backward-rank": 3, "use-error-feedback": True}), 2)
    assert a.compression.compressed_backprop and a.compression.inter_grad_comp_rank == 3
    a = parse_args(_argv(tiny_corpus, **{"pipeline-model-parallel-size": 2,
                                         "inter-grad-comp": True,
                                         "backward-compress-method": "lowrank"}), 2)
    assert a.compression.compressed_backprop


def test_warmup_epochs_and_default_cache_size(tiny_corpus):
    from megatron.training.flags.arguments import ConfigError, parse_args
    from megatron.training.compression.pipeline_codecs import cache_capacity, warmup_iters

    def args(**kw):   # world 4 at pp=2: dp=2, global batch 8
        return parse_args(_argv(tiny_corpus, **{"pipeline-model-parallel-size": 2,
                                                "forward-compress-method": "delta", **kw}), 4)
    assert warmup_iters(args(**{"warmup-epochs": 1.5}), epoch_samples=32) == 6   # 4 per epoch
    assert warmup_iters(args(**{"compress-warmup-iters": 3}), epoch_samples=None) == 3
    with pytest.raises(ConfigError, match="--warmup-epochs needs"):
        warmup_iters(args(**{"warmup-epochs": 1}), epoch_samples=None)
    # every sample one replica sees: min(train-iters x 8, one epoch) / dp
    assert cache_capacity(args(**{"train-iters": 5}), epoch_samples=400) == 20
    assert cache_capacity(args(**{"train-iters": 500}), epoch_samples=400) == 200
    assert cache_capacity(args(**{"max-activation-cache-size": 7}), epoch_samples=400) == 7
    with pytest.raises(ConfigError, match="smaller than one micro-batch"):
        cache_capacity(args(**{"max-activation-cache-size": 1, "micro-batch-size": 2,
                               "global-batch-size": 8}), epoch_samples=400)


# ------------------------------------------------------------------------------ one link
def _link_worker(rank, world):
    from megatron.cc.codecs import get_codec
    from megatron.cc.pipeline.p2p import Link, Message, PipelineChannels
    from megatron.cc.pipeline.policy import WarmupPolicy
    from megatron.cc.common.stats import ChannelStats
    shape = (8, 2, 16)
    codec = get_codec("delta", bits=4, capacity=6, sample_shape=(8, 16))
    link = Link("pp-fwd", 1 - rank, codec, WarmupPolicy(1))
    ch = PipelineChannels(shape, torch.float32, ChannelStats(),
                          **({"next_fwd": link} if rank == 0 else {"prev_fwd": link}))
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(shape, generator=g)
    x1 = x0 + 0.01 * torch.randn(shape, generator=g)
    x2 = torch.randn(shape, generator=g)
    steps = [(0, [3, 5], x0, True),    # warm-up: uncompressed, both ends record x0
             (1, [3, 5], x1, True),    # compressed delta against x0
             (1, [7, 8], x2, True),    # first sight: slots start at zero
             (1, [3, 5], x2, False),   # evaluation: uncompressed, caches untouched
             (2, [3, 5], x1, True)]    # x1 again: a smaller delta, a closer copy
    out, hashes = [], []
    for it, ids, x, train in steps:
        msg = Message(microbatch=0, iteration=it, sample_ids=torch.tensor(ids), train=train)
        if rank == 0:
            ch.send_forward(x, msg)
        else:
            out.append(ch.recv_forward(msg).detach())
        hashes.append(_cache_hash(codec))
    # numpy, not tensors: torch shares tensors through files that vanish with this process
    return {"out": [o.numpy() for o in out], "hashes": hashes,
            "first_sights": codec.first_sights, "stats": ch.stats.snapshot(),
            "x": [x.numpy() for x in (x0, x1, x2)]}


def test_first_sight_warmup_and_evaluation_on_one_link():
    from megatron.cc.codecs import get_codec
    send, recv = run_distributed(_link_worker, 2, timeout=120)
    x0, x1, x2 = (torch.from_numpy(x) for x in send["x"])
    out = [torch.from_numpy(o) for o in recv["out"]]
    assert torch.equal(out[0], x0)                          # warm-up: exact
    assert (out[1] - x1).abs().max() < 0.01 and not torch.equal(out[1], x1)
    fp = get_codec("fixpoint", bits=4)                      # first sight = fixpoint of x
    assert torch.equal(out[2], fp.decode(fp.encode(x2), x2.shape, x2.dtype))
    assert torch.equal(out[3], x2)                          # evaluation: exact ...
    assert send["hashes"][3] == send["hashes"][2]           # ... and caches untouched
    # the same sample again: the delta against the cached out[1] refines it
    assert (out[4] - x1).abs().max() < (out[1] - x1).abs().max() / 4
    assert send["hashes"] == recv["hashes"]                 # bit-identical after every step
    assert send["first_sights"] == recv["first_sights"] == 4
    raw = 8 * 2 * 16 * 4
    packed = 8 * 2 * 16 * 4 // 8 + 2 * 16                   # 4-bit codes + fp16 per channel
    # evaluation traffic is not counted: the ratio is the training iterations'
    assert send["stats"]["pp-fwd"] == {"sent": raw + 3 * packed, "raw": 4 * raw,
                                       "messages": 4}


# ------------------------------------------------------------------------------ training
def _cache_hash(codec) -> str:
    sd = codec.state_dict()["cache"]
    h = hashlib.sha256(sd["entries"].numpy().tobytes())
    h.update(sd["data"].numpy().tobytes())
    return h.hexdigest()


def _link_states(trainer) -> dict:
    """{(channel, sender rank, receiver rank): state summary} of this rank's link ends."""
    import torch.distributed as dist
    me, out = dist.get_rank(), {}
    ch = trainer.channels
    for key, link in (("prev_fwd", ch.prev_fwd), ("next_fwd", ch.next_fwd)):
        if link is None or not hasattr(link.codec, "cache"):
            continue
        pair = (me, link.peer) if key == "next_fwd" else (link.peer, me)
        ids = link.codec.state_dict()["cache"]["entries"][:, 0]
        out[("pp-fwd", *pair)] = {"hash": _cache_hash(link.codec),
                                  "first_sights": link.codec.first_sights,
                                  "ids": sorted(ids.tolist())}
    return out


def _train(argv, world, load=None, stats_channels=("pp-fwd", "pp-bwd")):
    """One Trainer: (losses on the last rank, this rank's link states, job-wide bytes)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.cc.common.stats import ChannelStats
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.loop.training import Trainer
    args = parse_args(argv, world_size=world)
    initialize_distributed(args)
    trainer = Trainer(args)
    args.logging.log_interval = 10**9   # keep every byte count
    trainer.train()
    snaps = [None] * dist.get_world_size()
    dist.all_gather_object(snaps, trainer.stats.snapshot())
    totals = ChannelStats.merge(snaps)
    states = _link_states(trainer)
    info = {"epoch_samples": trainer.epoch_samples, "losses": list(trainer.loss_history)}
    trainer.close()
    ps.destroy_model_parallel()
    return info, states, {c: totals.get(c) for c in stats_channels}


def _gather(states):
    import torch.distributed as dist
    all_states = [None] * dist.get_world_size()
    dist.all_gather_object(all_states, states)
    return all_states


def _job_pp2(rank, world, corpus, ckpt):
    pp2 = {"pipeline-model-parallel-size": 2}
    out = {}
    # delta-4 forward, fixpoint-8 backward, one warm-up iteration; 7 iterations = 2+ epochs;
    # validation at 3 and 6 (uncompressed, not counted, must not touch the caches)
    info, states, nbytes = _train(_argv(corpus, **pp2, **{
        "train-iters": 7, "forward-compress-method": "delta", "forward-bits": 4,
        "backward-compress-method": "fixpoint", "backward-bits": 8,
        "compress-warmup-iters": 1, "eval-interval": 3}), world)
    out["delta"] = (info, _gather(states), nbytes)
    # resume: delta-lowbits with stochastic rounding + tiled fixpoint gradients
    common = {**pp2, "train-iters": 6, "forward-compress-method": "delta-lowbits",
              "forward-bits": 3, "forward-bits-act": 6, "stochastic-rounding": True,
              "backward-compress-method": "fixpoint", "backward-bits": 6,
              "backward-tile-size": 16, "warmup-epochs": 0.5}
    straight, s_states, _ = _train(_argv(corpus, **common), world)
    first, _, _ = _train(_argv(corpus, **common, save=ckpt, **{"exit-interval": 3}), world)
    resumed, r_states, _ = _train(_argv(corpus, **common, load=ckpt), world)
    out["resume"] = (straight["losses"], first["losses"], resumed["losses"],
                     _gather(s_states), _gather(r_states))
    # composition: TAH forward, CB + LEP backward, PowerSGD dp gradients, fused embedding
    info, _, nbytes = _train(_argv(corpus, **pp2, **{
        "train-iters": 6, "forward-compress-method": "tah", "tile-size": 32,
        "backward-compress-method": "lowrank",
        "backward-rank": 4, "use-error-feedback": True, "grad-comp": True,
        "grad-comp-rank": 4, "grad-comp-warm-up": 0.2, "emb-comm-opt": True,
        "compress-warmup-iters": 1, "repeat-epoch": True}), world)
    out["compose"] = (info, nbytes)
    return out if rank == world - 1 else None


@pytest.fixture(scope="module")
def job_pp2(task, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("acsgd_ckpt") / "ck")
    return run_distributed(_job_pp2, 4, (task, ckpt), timeout=900)[-1]


def _pairs(all_states):
    """{link: [state at one end, state at the other]}."""
    ends = {}
    for states in all_states:
        for key, st in states.items():
            ends.setdefault(key, []).append(st)
    return ends


def _check_caches_match(all_states, n_links):
    ends = _pairs(all_states)
    assert len(ends) == n_links
    for key, (a, b) in ends.items():
        assert a["hash"] == b["hash"], key
        assert a["first_sights"] == b["first_sights"] > 0
        assert a["ids"] == b["ids"] and a["ids"]
    return ends


def test_delta_caches_identical_at_pp2_dp2(job_pp2):
    info, all_states, nbytes = job_pp2["delta"]
    ends = _check_caches_match(all_states, n_links=2)   # one boundary, two replicas
    E = info["epoch_samples"]
    assert 8 <= E < 7 * 8   # the task is small: training ran over several epochs
    # each replica's cache holds exactly its own samples of one epoch, keyed by dataset index
    held = sorted(i for (a, _) in ends.values() for i in a["ids"])
    assert held == list(range(E))
    # samples came back in later epochs under the same key: no new slot, no new first sight
    assert sum(a["first_sights"] for (a, _) in ends.values()) == E
    # bytes: iteration 0 uncompressed, then 4-bit codes + fp16 per-channel scales (fwd) and
    # 8-bit codes + scales (bwd); 8 micro-batches of (S, 1, H) per iteration, one boundary
    raw = S * H * 4
    fwd = S * H * 4 // 8 + 2 * H
    bwd = S * H + 2 * H
    assert nbytes["pp-fwd"] == {"sent": 8 * raw + 6 * 8 * fwd, "raw": 7 * 8 * raw,
                                "messages": 7 * 8}
    assert nbytes["pp-bwd"] == {"sent": 8 * raw + 6 * 8 * bwd, "raw": 7 * 8 * raw,
                                "messages": 7 * 8}
    assert info["losses"][-1] < info["losses"][0]


def test_resume_with_activation_caches_is_bit_exact(job_pp2):
    straight, first, resumed, s_states, r_states = job_pp2["resume"]
    assert len(straight) == 6 and first == straight[:3]
    assert resumed == straight[3:], (resumed, straight[3:])
    _check_caches_match(s_states, n_links=2)
    assert s_states == r_states   # same caches, entries and counters after 6 iterations


def test_codecs_compose_with_cb_and_data_parallel_modes(job_pp2):
    info, nbytes = job_pp2["compose"]
    assert info["epoch_samples"] == job_pp2["delta"][0]["epoch_samples"]   # --repeat-epoch
    assert nbytes["pp-fwd"]["sent"] < nbytes["pp-fwd"]["raw"] / 3
    assert nbytes["pp-bwd"]["sent"] < nbytes["pp-bwd"]["raw"]
    assert info["losses"][-1] < info["losses"][0]


# ------------------------------------------------------------------------------ pp = 4
def _hf_loss(hf_dir, trainer):
    """Hugging Face's mean loss over iteration 0's micro-batches (dp replica 0)."""
    from transformers import GPT2LMHeadModel
    from megatron.training.data.datasets import collate
    model = GPT2LMHeadModel.from_pretrained(hf_dir, local_files_only=True).eval()
    losses = []
    with torch.no_grad():
        for mb in range(trainer.args.num_microbatches):
            b = collate(trainer.train_ds, trainer.batches.sample_ids(0, mb, 0))
            logits = model(input_ids=b["tokens"]).logits
            losses.append(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), b["labels"].reshape(-1)))
    return float(torch.stack(losses).mean())


def _finetune(argv, world, hf_dir):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.loop.training import Trainer
    args = parse_args(argv, world_size=world)
    initialize_distributed(args)
    trainer = Trainer(args)
    last = dist.get_rank() == dist.get_world_size() - 1
    hf = _hf_loss(hf_dir, trainer) if last else None
    trainer.train()
    losses = list(trainer.loss_history)
    trainer.close()
    ps.destroy_model_parallel()
    return hf, losses


def _job_pp4(rank, world, corpus, hf):
    pp4 = {"pipeline-model-parallel-size": 4}
    info, states, nbytes = _train(_argv(corpus, **pp4, **{
        "train-iters": 6, "forward-compress-method": "delta", "forward-bits": 2,
        "backward-compress-method": "lowrank", "backward-rank": 2,
        "use-error-feedback": True, "warmup-epochs": 1}), world)
    out = {"delta": (info, _gather(states), nbytes)}
    model_flags = {"num-layers": 4, "hidden-size": 32, "num-attention-heads": 4,
                   "ffn-hidden-size": 128, "max-position-embeddings": 64, "seq-length": S,
                   "openai-gelu": True}
    out["finetune"] = _finetune(_argv(corpus, **pp4, **model_flags, **{
        "train-iters": 8, "load": hf["ckpt"], "finetune": True,
        "forward-compress-method": "delta", "forward-bits": 4,
        "backward-compress-method": "fixpoint", "backward-bits": 8,
        "compress-warmup-iters": 1}), world, hf["dir"])
    return out if rank == world - 1 else None


@pytest.fixture(scope="module")
def hf_import(tiny_corpus, tmp_path_factory):
    """A random tiny GPT-2 (tanh GeLU, every tensor perturbed) and its import at pp=4."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from megatron.training.data.tokenizer import build_tokenizer
    from tools.checkpoint import import_hf
    root = tmp_path_factory.mktemp("hf")
    tok = build_tokenizer("GPT2BPETokenizer", tiny_corpus["vocab"], tiny_corpus["merges"])
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=4,
                        n_head=4, activation_function="gelu_new", resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=tok.eod,
                        eos_token_id=tok.eod)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf_dir, ckpt = str(root / "gpt2"), str(root / "ck_pp4")
    model.save_pretrained(hf_dir)
    assert import_hf.main(["--hf-model", hf_dir, "--save", ckpt, "--seq-length", str(S),
                           "--pipeline-model-parallel-size", "4", "--no-progress",
                           "--vocab-file", tiny_corpus["vocab"],
                           "--merge-file", tiny_corpus["merges"]]) == 0
    return {"dir": hf_dir, "ckpt": ckpt}


@pytest.fixture(scope="module")
def job_pp4(task, hf_import):
    return run_distributed(_job_pp4, 4, (task, hf_import), timeout=900)[-1]


def test_delta_caches_identical_at_pp4_with_cb(job_pp4):
    info, all_states, nbytes = job_pp4["delta"]
    _check_caches_match(all_states, n_links=3)           # three boundaries
    # --warmup-epochs 1: the first epoch went uncompressed both ways
    warm = info["epoch_samples"] // 8
    assert 1 <= warm < 6
    raw = S * H * 4
    assert nbytes["pp-fwd"]["raw"] == 3 * 6 * 8 * raw
    assert nbytes["pp-fwd"]["sent"] == 3 * 8 * (warm * raw + (6 - warm) * (S * H // 4 + 2 * H))
    assert info["losses"][-1] < info["losses"][0]


def test_finetune_from_hugging_face_gpt2_at_pp4(job_pp4):
    hf_loss, losses = job_pp4["finetune"]
    assert abs(losses[0] - hf_loss) <= 1e-5 * hf_loss, (losses[0], hf_loss)
    assert losses[-1] < losses[0] - 0.05, losses


# ------------------------------------------------------------------------------ launcher
def _launch(nproc, argv, timeout=180):
    import subprocess
    import sys
    from tests.distributed import free_port
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), os.path.join(root, "pretrain_gpt.py")] + argv
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_cache_size_printed_at_startup_and_too_large_refused(task, tmp_path):
    flags = {"pipeline-model-parallel-size": 2, "train-iters": 2,
             "forward-compress-method": "delta-lowbits", "forward-bits-act": 4,
             "activation-cache-location": f"disk:{tmp_path}"}
    ok = _launch(2, _argv(task, **flags))
    assert ok.returncode == 0, ok.stderr[-3000:]
    # 16 samples (2 iterations x 8: fewer than one epoch) x (32 x 32 values at 4 bits + 32
    # fp16 row scales)
    per_sample = S * H // 2 + 2 * S
    for line in ("[rank 0] pp-fwd to rank 1 (sender): activation cache: 16 samples x 32x32 "
                 "4-bit in disk", "[rank 1] pp-fwd from rank 0 (receiver): activation cache: "
                 "16 samples x 32x32 4-bit in disk"):
        assert line in ok.stdout, ok.stdout[-3000:]
    assert f"({16 * per_sample:,} bytes)" in ok.stdout
    assert os.listdir(tmp_path) == []   # the memory-mapped files are removed at exit
    big = _launch(2, _argv(task, **{**flags, "activation-cache-location": "ram",
                                    "max-activation-cache-size": 10**10}))
    assert big.returncode != 0
    need = 10**10 * per_sample
    assert f"activation cache needs {need / 2**30:.2f} GiB ({need} bytes" in big.stderr, \
        big.stderr[-3000:]
    assert "lower --max-activation-cache-size" in big.stderr
    assert "training failed" not in big.stderr   # a one-line error, not our traceback
