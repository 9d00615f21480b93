"""The (1,1,1) training step as pretrain_gpt.py builds it, on one fake GPU over emulated gloo.

parse_args -> initialize_distributed -> Trainer (model on the rank's device, DDP buffers,
optimizer, scheduler, channels) -> train_step (forward, loss, backward, grad sync, optimizer
step, LR step) -> evaluate -> checkpoint save -> a second Trainer resumed from it (onto the
GPU) -> another step; fp32, --bf16 and --fp16, GPT-2 and the Llama-style family.

What runs how (fake_gpu.py): the forward, the loss and every derivative kernel run on fake
cuda tensors (device mismatches raise as on a GPU); autograd's C++ engine cannot run on a
CPU-only torch, so backward is `python_backward` (the same nodes, walked in Python) followed
by megatron DDP's gradient hooks; collectives are emulated with gloo's restrictions; the
checkpoint files are real (torch.save of CPU stand-ins for the cuda tensors, as a GPU
checkpoint loads with map_location="cpu"). Values are not computed: a GPU's numbers are
tests/gpu's job; this tier proves placement, host syncs and the backend's rules.
"""
import pytest
import torch

from tests.conftest import tiny_gpt_argv

FAMILIES = {
    "gpt2": {},
    "llama": {"position-embedding-type": "rope", "normalization": "RMSNorm", "swiglu": True,
              "disable-bias-linear": True, "group-query-attention": True,
              "num-query-groups": 2, "untie-embeddings-and-output-weights": True},
    # Subspace Networks' constrained model (its fp32 basis kept fp32 under --bf16/--fp16)
    "gpt2-subspace": {"subspace-rank": 4},
}
# optimizers other than AdamW, on the GPT-2 family (Muon: no --fp16)
OPTIMIZERS = {"gpt2-muon": {"optimizer": "muon"}}
DTYPES = {"fp32": {}, "bf16": {"bf16": True}, "fp16": {"fp16": True}}
SMALL = {"num-layers": 1, "seq-length": 16, "global-batch-size": 2, "train-iters": 4,
         "distributed-backend": "gloo", "eval-iters": 1}

# Host reads a training step may make, each once per step or per micro-batch: the loss the
# log line prints, megatron-core's grad norm and fp16 overflow check, and megatron-core's
# vocab-parallel cross entropy, which zeroes out-of-slice targets with boolean-mask
# assignments (index_put_ with a mask: a nonzero, i.e. a sync per micro-batch; upstream).
ALLOWED_READS = ("_reduce_loss", "optimizer/clip_grads.py", "optimizer/optimizer.py",
                 "tensor_parallel/cross_entropy.py")


def _argv(corpus, family, dtype, **extra):
    flags = FAMILIES[family] if family in FAMILIES else {**FAMILIES["gpt2"], **OPTIMIZERS[family]}
    return tiny_gpt_argv(corpus, **{**SMALL, **flags, **DTYPES[dtype], **extra})


def build_trainer(gpu, argv):
    """What pretrain_gpt.main does before train()."""
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.loop.training import Trainer
    args = parse_args(argv, world_size=1)
    initialize_distributed(args)
    trainer = Trainer(args)
    gpu.ddp_models.append(trainer.model)   # python_backward fires DDP's gradient hooks
    return trainer


PARAM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def assert_one_dtype(trainer, dtype):
    """Every parameter in the training dtype, as Megatron's Float16Module makes it: a real GPU
    refuses an fp32 activation (fp32 position embedding + bf16 word embedding, fp32 LayerNorm)
    in a bf16 linear, which fake kernels do not check (first seen on an H200)."""
    from megatron.training.model.model import unwrap
    other = {n: p.dtype for n, p in unwrap(trainer.model).named_parameters() if p.dtype != dtype}
    assert not other, f"parameters not in {dtype}: {other}"


def unexpected_reads(gpu, since=0):
    return [str(e) for e in gpu.events[since:] if e.kind in ("read", "d2h", "sync")
            and not any(a in e.where for a in ALLOWED_READS)]


def assert_on_gpu(trainer, gpu, stepped=True):
    from megatron.training.model.model import unwrap
    model = unwrap(trainer.model)
    off = [n for n, p in model.named_parameters() if p.device != gpu.device]
    off += [n for n, b in model.named_buffers() if b.device != gpu.device]
    off += [f"grad buffer {i}" for i, b in enumerate(trainer.model.buffers)
            if b.grad_data.device != gpu.device]
    off += [n for n, p in model.named_parameters() if p.main_grad.device != gpu.device]
    if stepped:
        for opt in getattr(trainer.optimizer, "chained_optimizers", [trainer.optimizer]):
            inner = opt.optimizer
            for group in inner.param_groups:
                for p in group["params"]:
                    if p.device != gpu.device:
                        off.append(f"optimizer param {tuple(p.shape)} on {p.device}")
                    for k, v in inner.state.get(p, {}).items():
                        if torch.is_tensor(v) and k != "step" and v.device != gpu.device:
                            off.append(f"optimizer state {k} {tuple(v.shape)} on {v.device}")
    assert not off, f"not on {gpu.device}: {off}"


# "+distopt": --use-distributed-optimizer, whose checkpoint gathers the sharded Adam state
# (bf16: with the fp32 main weights) and loads it back onto the GPU
RUNS = [(f, d, "gloo") for f in FAMILIES for d in DTYPES] + [("gpt2", "bf16", "nccl"),
                                                            ("gpt2", "bf16", "nccl+distopt")] + [
    ("gpt2-muon", "fp32", "gloo"), ("gpt2-muon", "bf16", "nccl")]


@pytest.mark.parametrize("family,dtype,backend", RUNS, ids=["-".join(r) for r in RUNS])
def test_step_eval_checkpoint_resume(fake_gpu, tiny_corpus, tmp_path, family, dtype, backend,
                                     monkeypatch):
    """gloo: several ranks may share a GPU (tests/gpu runs 8 on one); NCCL: one per GPU."""
    backend, _, distopt = backend.partition("+")
    with fake_gpu(backend=backend) as gpu:
        _step_eval_checkpoint_resume(gpu, tiny_corpus, tmp_path, family, dtype, backend,
                                     monkeypatch, bool(distopt))


def _step_eval_checkpoint_resume(gpu, tiny_corpus, tmp_path, family, dtype, backend,
                                 monkeypatch, distopt=False):
    argv = _argv(tiny_corpus, family, dtype, **{"distributed-backend": backend,
                                                "use-distributed-optimizer": distopt})
    trainer = build_trainer(gpu, argv)
    assert_on_gpu(trainer, gpu, stepped=False)
    assert_one_dtype(trainer, PARAM_DTYPES[dtype])
    if family.endswith("subspace"):   # U orthonormal to fp32 precision in any training dtype
        from megatron.training.model.model import unwrap
        assert unwrap(trainer.model).subspace_basis.dtype == torch.float32
        assert unwrap(trainer.model).subspace_write_scale.dtype == torch.float32   # and a
    start = len(gpu.events)
    metrics = trainer.train_step()
    assert trainer.iteration == 1 and isinstance(metrics["lm loss"], float)
    assert_on_gpu(trainer, gpu)
    assert unexpected_reads(gpu, start) == []
    # the dp channel synchronised the grad buffers (gloo: without a coalesced all-reduce)
    calls = [c for c, be, devs in gpu.dist.log if devs == (str(gpu.device),)]
    assert {"all_reduce", "all_reduce (coalesced)"} & set(calls)
    assert backend == "nccl" or "all_reduce (coalesced)" not in calls

    start = len(gpu.events)
    trainer.evaluate()
    assert unexpected_reads(gpu, start) == []

    monkeypatch.setattr("megatron.training.checkpointing.save_load.write_file", _write_host_copy)
    trainer.ckpt.save(str(tmp_path))
    if distopt:   # gathered by name: whole moments and the fp32 main weight of each bf16 param
        from tools.checkpoint.layout import read_checkpoint
        by_name = read_checkpoint(str(tmp_path)).shards[(0, 0)]["optimizer_by_name"]
        assert by_name and all(set(s) == {"step", "exp_avg", "exp_avg_sq", "main_param"}
                               and s["main_param"].dtype == torch.float32
                               for s in by_name.values())
    from megatron.core import parallel_state as ps
    ps.destroy_model_parallel()
    gpu.ddp_models.clear()
    resumed = build_trainer(gpu, argv + ["--load", str(tmp_path)])
    assert resumed.iteration == 1
    assert all(o.optimizer.state for o in getattr(resumed.optimizer, "chained_optimizers",
                                                   [resumed.optimizer])), "no optimizer state loaded"
    assert_on_gpu(resumed, gpu)   # loaded optimizer state landed on the GPU
    start = len(gpu.events)
    resumed.train_step()
    assert_on_gpu(resumed, gpu)
    assert unexpected_reads(gpu, start) == []


def _write_host_copy(obj, path):
    """checkpoint_io.write_file of what a GPU run would write, with CPU stand-ins."""
    from megatron.training.checkpointing.checkpoint_io import write_file
    from tests.fake_cuda.fake_gpu import real_copy
    write_file(real_copy(obj), path)
