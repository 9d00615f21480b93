"""Every dp mode and the emb channel: per-rank compute of a 2-replica job on a fake GPU.

The model is the driver's (1,1,1) Trainer on cuda:0; the dp channel is built by
channels.build_grad_sync from flags parsed for 2 replicas, with megatron-core's dp group
replaced by a FakeGroup of 2 ranks whose peer mirrors this one (fake_gpu.py): every
collective a 2-replica job issues is issued here, under the emulated backend's rules (gloo:
no CUDA tensors in send/recv or a coalesced all-reduce; NCCL: CUDA tensors on this rank's
GPU only). A training step (parameter-syncing modes act after the optimizer step), the
state round trip of a resume onto the GPU, a second step (which applies what the first left
in flight: CocktailSGD's stale exchange, DiLoCo's delayed reduce) and the flush. What the peer would send is this rank's own data, so values prove nothing here; the
CPU tests (tests/cc/grad_sync, tests/training/test_dp_modes.py) check them.

Not run here: --overlap-grad-reduce with PowerSGD (its buckets are found by data_ptr(),
which a fake tensor does not have; the exact overlapped mode runs) and the gradient hooks
of the overlapped modes (fired by autograd's engine, which cannot run: the test fires them
as the engine would, after backward).
"""
import pytest
import torch

from megatron.cc.common.stats import ChannelStats
from tests.conftest import tiny_gpt_argv
from tests.fake_cuda.fake_gpu import FakeGPU, FakeGroup, guard_library, real_copy
from tests.fake_cuda.test_training_step import SMALL, build_trainer, unexpected_reads

MODES = {
    "allreduce": {},
    "allreduce-overlap": {"overlap-grad-reduce": True},
    "powersgd": {"grad-comp": True, "grad-comp-rank": 2},
    "randomized-svd": {"grad-comp": True, "grad-comp-rank": 2,
                       "grad-comp-type": "RandomizedSVD"},
    "cocktail": {"dp-mode": "cocktail_sgd", "cocktail-no-overlap": True},
    "cocktail-overlap": {"dp-mode": "cocktail_sgd"},
    "diloco": {"dp-mode": "diloco", "diloco-inner-steps": 1},
    "diloco-int8-fragments": {"dp-mode": "diloco", "diloco-inner-steps": 2,
                              "diloco-compression": "int8", "diloco-fragments": 2},
    "diloco-cocktail-delay": {"dp-mode": "diloco", "diloco-inner-steps": 2,
                              "diloco-compression": "cocktail", "diloco-sync-delay": 1},
    "diloco-powersgd-fragments": {"dp-mode": "diloco", "diloco-inner-steps": 2,
                                  "diloco-compression": "powersgd-2", "diloco-fragments": 2},
    "sparseloco": {"dp-mode": "sparseloco", "diloco-inner-steps": 1},
    "sparseloco-delay": {"dp-mode": "sparseloco", "diloco-inner-steps": 2,
                         "diloco-sync-delay": 1, "stochastic-rounding": True},
    "preduce": {"dp-mode": "preduce", "ssp-bound": 1},
    "adpsgd": {"dp-mode": "adpsgd"},
}
# host syncs a dp mode may make: gloo is a host library, so CUDA messages to it are staged
# through host memory (the copy down must be complete before gloo reads it); and the wait
# of a background job's own thread for its stream (background.py; inline here)
GLOO_STAGING = ("megatron/cc/common/transport.py", "megatron/cc/data_parallel/sharded_exchange.py")
BACKGROUND = "megatron/cc/common/background.py"


def _unexpected(gpu, start):
    return [r for r in unexpected_reads(gpu, start) if BACKGROUND not in r
            and not (gpu.backend == "gloo" and any(s in r for s in GLOO_STAGING))]


@pytest.fixture(scope="module")
def world(request, tiny_corpus):
    """A fake GPU on `backend` with the (1,1,1) fp32 Trainer built on it (once per module)."""
    lib = guard_library()
    if isinstance(lib, str):
        pytest.skip(lib)
    with FakeGPU(backend=request.param) as gpu:
        trainer = build_trainer(gpu, tiny_gpt_argv(tiny_corpus, **{
            **SMALL, "distributed-backend": request.param}))
        yield gpu, trainer


def _dp_sync(trainer, flags, group):
    """build_grad_sync as a 2-replica job's rank 0 would call it."""
    import dataclasses
    from megatron.training.flags.arguments import parse_args
    from megatron.training.compression.channels import build_grad_sync
    d = trainer.args.data
    corpus = {"prefix": d.data_path[0], "vocab": d.vocab_file, "merges": d.merge_file}
    args = parse_args(tiny_gpt_argv(corpus, **{**SMALL, **flags}), world_size=2)
    topo = dataclasses.replace(trainer.topo, dp_group=group, dp_size=2, dp_rank=0)
    return build_grad_sync(args, trainer.model, ChannelStats(), topo)


def _step(trainer, gpu):
    """train_step, firing the overlapped modes' gradient hooks after backward as the engine
    would (once per parameter and micro-batch)."""
    sync = trainer.grad_sync.dp
    ready = getattr(sync, "_param_ready", None)
    if ready is not None:
        forward_backward = trainer.forward_backward

        def with_hooks(*a, **k):
            step = forward_backward(*a, **k)
            for _ in range(trainer.batches.num_microbatches):
                for p in trainer.model.parameters():
                    ready(p)
            return step
        trainer.forward_backward = with_hooks
    try:
        trainer.train_step()
    finally:
        trainer.__dict__.pop("forward_backward", None)


def _off_gpu(state, gpu, path="state"):
    """Float state not on the GPU (generator states and counters are host metadata)."""
    if torch.is_tensor(state):
        return [] if state.device == gpu.device or not state.is_floating_point() else [path]
    if isinstance(state, dict):
        return [p for k, v in state.items() for p in _off_gpu(v, gpu, f"{path}.{k}")]
    if isinstance(state, (list, tuple)):
        return [p for i, v in enumerate(state) for p in _off_gpu(v, gpu, f"{path}[{i}]")]
    return []


# on NCCL (every tensor a collective takes must be on this rank's GPU) one mode per code
# path: the variants above differ in their compute, not in what they hand the backend
# (CocktailSGD's exchange is the ShardedExchange diloco-int8-fragments runs)
NCCL_MODES = ("allreduce", "powersgd", "diloco-int8-fragments", "diloco-powersgd-fragments",
              "sparseloco", "preduce", "adpsgd")


RUNS = [("gloo", m) for m in MODES] + [("nccl", m) for m in NCCL_MODES]


@pytest.mark.parametrize("world,mode", RUNS, indirect=["world"],
                         ids=[f"{b}-{m}" for b, m in RUNS])
def test_dp_mode_per_rank_compute(world, mode):
    gpu, trainer = world
    group = FakeGroup(2, backend=gpu.backend)
    trainer.grad_sync = _dp_sync(trainer, MODES[mode], group)
    start, calls = len(gpu.events), len(gpu.dist.log)
    _step(trainer, gpu)
    assert len(gpu.dist.log) > calls, "the dp mode issued no collective"
    assert _unexpected(gpu, start) == []
    with gpu.lenient():
        sd = trainer.grad_sync.state_dict()
    assert _off_gpu(sd, gpu) == []
    resumed = _dp_sync(trainer, MODES[mode], group)
    resumed.load_state_dict(real_copy(sd))
    trainer.grad_sync = resumed
    start = len(gpu.events)
    _step(trainer, gpu)
    trainer.grad_sync.flush(trainer.model)
    assert _unexpected(gpu, start) == []
    with gpu.lenient():   # the resumed state moved to the GPU (no outer step on the CPU)
        assert _off_gpu(trainer.grad_sync.state_dict(), gpu) == []


@pytest.mark.parametrize("world", ["gloo", "nccl"], indirect=True)
@pytest.mark.parametrize("channel", ["plain", "fused", "powersgd"])
def test_emb_channel_per_rank_compute(world, channel):
    """The tied embedding gradient summed over a 2-rank embedding group (first and last
    stage), plain (Megatron), fused with the dp scaling (Optimus-CC FE), or PowerSGD."""
    from megatron.cc.embedding.fused_sync import FusedEmbeddingSync
    from megatron.cc.grad_sync.sync import EmbeddingSync, ExactDataParallelSync, GradSync
    from megatron.cc.embedding.powersgd_sync import EmbPowerSGDSync
    from megatron.cc.grad_sync.sync import shared_embedding_weight
    gpu, trainer = world
    stats, group = ChannelStats(), FakeGroup(2, backend=gpu.backend)
    emb = EmbeddingSync(group, stats) if channel == "plain" else \
        FusedEmbeddingSync(group, stats, dp_world=2)
    if channel == "powersgd":
        emb = EmbPowerSGDSync(emb, stats, rank=2)
    trainer.grad_sync = GradSync(ExactDataParallelSync(group, stats), emb)
    start = len(gpu.events)
    _step(trainer, gpu)
    assert shared_embedding_weight(trainer.model).main_grad.device == gpu.device
    assert stats.messages["emb"] >= 1 and _unexpected(gpu, start) == []


@pytest.mark.parametrize("world", ["gloo", "nccl"], indirect=True)
def test_diloco_schedule_and_exact_final_sync(world):
    """--diloco-sync-steps at the next two steps, the first through int8, the second the
    run's last (--train-iters) and exact (--diloco-final-compression none): it repays the
    replica's residual and the owner's server error, all on the GPU."""
    gpu, trainer = world
    group = FakeGroup(2, backend=gpu.backend)
    step = trainer.iteration + 1
    flags = {"dp-mode": "diloco", "diloco-inner-steps": 4, "diloco-compression": "int8",
             "diloco-sync-steps": f"{step},{step + 1}", "train-iters": step + 1,
             "diloco-final-compression": "none"}
    trainer.grad_sync = _dp_sync(trainer, flags, group)
    sync = trainer.grad_sync.dp
    start = len(gpu.events)
    _step(trainer, gpu)
    assert sync.residual[0] is not None and sync.exchange.server_error
    _step(trainer, gpu)
    assert sync.residual[0] is None and not sync.exchange.server_error   # repaid
    assert _unexpected(gpu, start) == []
    assert sync.global_copy[0].device == gpu.device


@pytest.mark.parametrize("world", ["gloo", "nccl"], indirect=True)
def test_diloco_residual_in_model(world):
    """--diloco-residual-in-model: after a fixpoint-2 sync the replica restarts from the
    global copy minus its own residual, computed and copied into the weights on the GPU."""
    gpu, trainer = world
    group = FakeGroup(2, backend=gpu.backend)
    step = trainer.iteration + 1
    flags = {"dp-mode": "diloco", "diloco-inner-steps": 4, "diloco-compression": "fixpoint-2",
             "diloco-sync-steps": f"{step},{step + 1}", "train-iters": step + 1,
             "diloco-error-decay": 0.0, "diloco-residual-in-model": True}
    trainer.grad_sync = _dp_sync(trainer, flags, group)
    sync = trainer.grad_sync.dp
    assert sync.residual_in_model and sync.last_step == step + 1
    start = len(gpu.events)
    _step(trainer, gpu)
    assert sync.residual[0] is not None and sync.residual[0].device == gpu.device
    _step(trainer, gpu)
    assert _unexpected(gpu, start) == []
    assert all(p.device == gpu.device for p in trainer.model.parameters())
