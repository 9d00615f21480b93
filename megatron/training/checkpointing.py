"""Checkpoints in Megatron-LM's directory layout, written atomically, resumable bit for bit.

    <dir>/latest_checkpointed_iteration.txt
    <dir>/iter_0000010/mp_rank_{tp:02d}_{pp:03d}/model_optim_rng.pt   one per model shard
    <dir>/iter_0000010/rank_state/rank_{global:05d}.pt                 one per process

`model_optim_rng.pt` (written by data-parallel rank 0) holds the model shard and, keyed by each
parameter's name in the unsplit model, its optimizer state, so tools/checkpoint can reshard
both. `rank_{r}.pt` holds what differs between replicas: RNG states and every registered
component's state (codec error buffers, Q matrices, activation caches, counters). Components
register with `CheckpointManager.register(name, obj)`; obj has state_dict()/load_state_dict().

Atomicity: everything is written under iter_XXXXXXX.tmp/, then rank 0 renames the directory
and replaces the `latest` file (write + os.replace). A save killed part-way leaves only a
.tmp directory behind and `latest` still names the previous, complete checkpoint.
"""
import os
import random
import shutil
from typing import Dict

import numpy as np
import torch
import torch.distributed as dist

from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.training.checkpoint_match import check_state_matches
from megatron.training.model import global_param_names, unwrap

LATEST = "latest_checkpointed_iteration.txt"
CHECKPOINT_VERSION = 1


def iter_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def shard_dir_name(tp_rank: int, pp_rank: int) -> str:
    return f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def read_latest(root: str) -> int:
    path = os.path.join(root, LATEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--load {root}: no {LATEST}; is this a checkpoint directory?")
    text = open(path).read().strip()
    if not text.isdigit():
        raise ValueError(f"--load {root}: {LATEST} holds '{text}', not an iteration number")
    return int(text)


def atomic_torch_save(obj, path: str) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def atomic_write_text(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- optimizer state by name

def _torch_optimizers(optimizer):
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return [getattr(o, "optimizer", None) for o in chained]


def _is_fp32_optimizer(optimizer) -> bool:
    from megatron.core.optimizer.optimizer import FP32Optimizer
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return all(isinstance(o, FP32Optimizer) for o in chained)


def _by_name_supported(optimizer) -> bool:
    """FP32Optimizer, or the mixed-precision one (bf16/fp16), not the distributed optimizer
    (its state is sharded over data-parallel ranks)."""
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return all(_is_fp32_optimizer(o) or hasattr(o, "fp32_from_float16_groups") for o in chained)


def _model_params(optimizer) -> Dict[int, torch.nn.Parameter]:
    """{id(param the torch optimizer steps): model parameter it stands for}. fp32 runs: the
    parameter itself; bf16/fp16 runs: the fp32 main copy of a 16-bit model parameter."""
    out = {}
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        for model_group, main_group in zip(getattr(o, "float16_groups", []),
                                           getattr(o, "fp32_from_float16_groups", [])):
            out.update({id(main): model for model, main in zip(model_group, main_group)})
    return out


def named_optimizer_state(optimizer, model) -> Dict[str, dict]:
    """{global param name: {'step', 'exp_avg', 'exp_avg_sq'[, 'main_param']}}, reshardable
    like the params. 'main_param' is the fp32 main weight of a bf16/fp16 run (the 16-bit model
    weight is a rounding of it, so resuming from the model weight alone would not be exact)."""
    names = {id(p): g for _, g, p in global_param_names(unwrap(model))}
    to_model = _model_params(optimizer)
    out = {}
    for opt in _torch_optimizers(optimizer):
        for group in opt.param_groups:
            for p in group["params"]:
                model_param = to_model.get(id(p), p)
                entry = {k: (v.detach().cpu().clone() if torch.is_tensor(v) else v)
                         for k, v in opt.state.get(p, {}).items()}
                if model_param is not p:
                    entry["main_param"] = p.detach().cpu().clone()
                if entry:
                    out[names[id(model_param)]] = entry
    return out


def load_named_optimizer_state(optimizer, model, state: Dict[str, dict]) -> None:
    """Inverse of named_optimizer_state, onto whatever device the parameters live on. A
    bf16/fp16 run given no main weights (e.g. from an fp32 run) rebuilds them from the model."""
    names = {id(p): g for _, g, p in global_param_names(unwrap(model))}
    to_model = _model_params(optimizer)
    for opt in _torch_optimizers(optimizer):
        for group in opt.param_groups:
            for p in group["params"]:
                s = state.get(names[id(to_model.get(id(p), p))])
                if s is None:
                    continue
                s = dict(s)
                main = s.pop("main_param", None)
                if main is not None and to_model.get(id(p)) is not None:
                    with torch.no_grad():
                        p.copy_(main.to(p.device))
                opt.state[p] = {k: (v.to(p.device).clone() if torch.is_tensor(v) else v)
                                for k, v in s.items()}


def grad_scaler_state(optimizer):
    """fp16's dynamic loss-scale state (None without a scaler)."""
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    scaler = getattr(chained[0], "grad_scaler", None)
    return None if scaler is None else scaler.state_dict()


def load_grad_scaler_state(optimizer, sd) -> None:
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        if sd is not None and getattr(o, "grad_scaler", None) is not None:
            o.grad_scaler.load_state_dict(sd)


# ---------------------------------------------------------------- rng

def rng_state() -> dict:
    return {"random": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}


def set_rng_state(s: dict) -> None:
    random.setstate(s["random"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if s["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(s["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(s["tracker"])


# ---------------------------------------------------------------- manager

class CheckpointManager:
    def __init__(self, args, trainer):
        self.args = args
        self.trainer = trainer
        self.components: Dict[str, object] = {}

    def register(self, name: str, component) -> None:
        """Add a component whose state_dict() goes into every process's rank file."""
        self.components[name] = component

    def save(self, root: str) -> str:
        t = self.trainer
        final = iter_dir(root, t.iteration)
        tmp = final + ".tmp"
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(os.path.join(tmp, "rank_state"), exist_ok=True)
        dist.barrier()
        tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        if ps.get_data_parallel_rank() == 0:
            shard = os.path.join(tmp, shard_dir_name(tp_rank, pp_rank))
            os.makedirs(shard, exist_ok=True)
            by_name = _by_name_supported(t.optimizer)
            atomic_torch_save({
                "checkpoint_version": CHECKPOINT_VERSION,
                "iteration": t.iteration,
                "consumed_samples": t.consumed_samples,
                "args": self.args.to_dict(),
                "layout": {"tp": self.args.tp, "pp": self.args.pp, "tp_rank": tp_rank,
                           "pp_rank": pp_rank, "padded_vocab_size": t.padded_vocab_size,
                           "vocab_size": t.tokenizer.vocab_size},
                "model": unwrap(t.model).state_dict(),
                "optimizer_by_name": (named_optimizer_state(t.optimizer, t.model)
                                      if by_name else None),
                "optimizer": None if by_name else t.optimizer.state_dict(),
                "grad_scaler": grad_scaler_state(t.optimizer),
                "opt_param_scheduler": t.scheduler.state_dict(),
            }, os.path.join(shard, "model_optim_rng.pt"))
        atomic_torch_save({
            "rng": rng_state(),
            "components": {k: c.state_dict() for k, c in self.components.items()},
        }, os.path.join(tmp, "rank_state", f"rank_{dist.get_rank():05d}.pt"))
        dist.barrier()
        if dist.get_rank() == 0:
            if os.path.exists(final):  # re-saving the same iteration: replace it whole
                shutil.rmtree(final)
            os.replace(tmp, final)
            atomic_write_text(os.path.join(root, LATEST), str(t.iteration))
        dist.barrier()
        if dist.get_rank() == dist.get_world_size() - 1:
            print(f"  saved checkpoint at iteration {t.iteration:7d} to {root}", flush=True)
        return final

    def load(self, root: str) -> None:
        t, c = self.trainer, self.args.checkpoint
        iteration = read_latest(root)
        tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        path = os.path.join(iter_dir(root, iteration), shard_dir_name(tp_rank, pp_rank),
                            "model_optim_rng.pt")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"--load {root}: {path} is missing. The checkpoint was saved with a different "
                f"tp/pp layout or is incomplete; reshard it with tools/checkpoint/reshard.py")
        sd = torch.load(path, map_location="cpu", weights_only=False)
        layout = sd["layout"]
        if (layout["tp"], layout["pp"]) != (self.args.tp, self.args.pp):
            raise ValueError(f"--load {root}: saved at tp={layout['tp']} pp={layout['pp']}, "
                             f"running tp={self.args.tp} pp={self.args.pp}; reshard it with "
                             f"tools/checkpoint/reshard.py")
        model = unwrap(t.model)
        check_state_matches(sd["model"], model.state_dict(), sd.get("args"), self.args.model,
                            path)
        model.load_state_dict(sd["model"], strict=True)
        t.optimizer.reload_model_params()  # bf16/fp16: main weights from the loaded model
        if c.finetune:
            return
        t.iteration, t.consumed_samples = sd["iteration"], sd["consumed_samples"]
        if not c.no_load_optim:
            if sd["optimizer_by_name"] is not None:
                load_named_optimizer_state(t.optimizer, t.model, sd["optimizer_by_name"])
                load_grad_scaler_state(t.optimizer, sd.get("grad_scaler"))
            else:
                t.optimizer.load_state_dict(sd["optimizer"])
            if sd["opt_param_scheduler"] is None:
                raise ValueError(f"--load {root}: this checkpoint holds weights only (e.g. made "
                                 f"by tools/checkpoint/import_hf.py); load it with --finetune")
            t.scheduler.load_state_dict(sd["opt_param_scheduler"])
        rank_file = os.path.join(iter_dir(root, iteration), "rank_state",
                                 f"rank_{dist.get_rank():05d}.pt")
        if os.path.isfile(rank_file):
            rs = torch.load(rank_file, map_location="cpu", weights_only=False)
            if not c.no_load_rng:
                set_rng_state(rs["rng"])
            for name, comp in self.components.items():
                if name in rs["components"]:
                    comp.load_state_dict(rs["components"][name])
        elif dist.get_rank() == 0:
            print(f"  note: {rank_file} not found (different world size?); RNG and codec "
                  f"state start fresh", flush=True)
        if dist.get_rank() == dist.get_world_size() - 1:
            print(f"  loaded checkpoint from {root} at iteration {iteration}", flush=True)
