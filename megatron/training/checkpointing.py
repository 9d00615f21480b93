"""Checkpoints in Megatron-LM's directory layout, written atomically, resumable bit for bit.

    <dir>/latest_checkpointed_iteration.txt
    <dir>/iter_0000010/mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt  one per model shard
    <dir>/iter_0000010/rank_state/rank_{global:05d}.pt                 one per process

`model_optim_rng.pt` (written by data-parallel rank 0) holds the model shard and, keyed by each
parameter's name in the unsplit model, its optimizer state, so tools/checkpoint can reshard
both. Directory names and `args` (an argparse.Namespace) are Megatron-LM's, so its loader and
tools read our files; ours read Megatron-LM's (torch format, either layer spec) and our older
layout (mp_rank_XX_000 at pp 1, args as a dict): checkpoint_compat, checkpoint_args. `rank_{r}.pt` holds what differs between replicas: RNG states and every registered
component's state (codec error buffers, Q matrices, activation caches, counters). Components
register with `CheckpointManager.register(name, obj)`; obj has state_dict()/load_state_dict().

Atomicity: everything is written under iter_XXXXXXX.tmp/, each file with a sha256 next to it
(checkpoint_io), then -- once every rank has written its files -- rank 0 renames the directory
and replaces the `latest` file (write + os.replace). A save killed part-way leaves only a
.tmp directory behind and `latest` still names the previous, complete checkpoint.

--async-save: the files are snapshotted to host memory and written by a background thread
(async_save); the commit above happens at the first iteration boundary where every rank's
thread is done (one small all-reduce per iteration while a save is in flight). At most one
save is in flight: the next one waits for it. --keep-last N deletes older checkpoints only
after a newer one is committed. Loading verifies checksums and never unpickles code
(checkpoint_io.safe_load, checkpoint_select).
"""
import os
import random
import shutil
from typing import Dict

import numpy as np
import torch
import torch.distributed as dist

from megatron.core import tensor_parallel
from megatron.training.checkpoint_args import file_state, written_by_megatron_lm
from megatron.training.checkpoint_compat import (  # noqa: F401  (shard_dir_name: for tools/)
    find_shard_dir, normalize_shard, shard_dir_name, to_model_names)
from megatron.training.checkpoint_match import check_state_matches
from megatron.training.async_save import AsyncWriter, HostSnapshot
from megatron.training.checkpoint_io import fsync_dir, safe_load, write_file
from megatron.training.checkpoint_select import (  # noqa: F401  (re-exported for tools/)
    LATEST, choose_checkpoint, committed_iterations, iter_dir, read_latest)
from megatron.training.model import global_param_names, unwrap
from megatron.training.topology import cuda_available

# 2: per-file .sha256 checksums, loadable with weights_only=True. 3: Megatron-LM's layout
# (mp_rank_XX at pp 1, args a Namespace); also Megatron-LM's own number for megatron-core's
# [heads, (q, k, v), head_dim] ordering of linear_qkv, which our model shares.
CHECKPOINT_VERSION = 3


def shard_file(root: str, iteration: int, tp_rank: int, pp_rank: int, pp: int) -> str:
    """The shard file to read: Megatron-LM's directory name, or our older one at pp 1."""
    return os.path.join(find_shard_dir(iter_dir(root, iteration), tp_rank, pp_rank, pp),
                        "model_optim_rng.pt")


def rank_file(root: str, iteration: int, rank: int) -> str:
    return os.path.join(iter_dir(root, iteration), "rank_state", f"rank_{rank:05d}.pt")


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
            # Adam's step stays on the host unless capturable/fused, as torch's own
            # load_state_dict keeps it: a device step would sync on every optimizer step
            host_step = not (group.get("capturable") or group.get("fused"))
            for p in group["params"]:
                s = state.get(names[id(to_model.get(id(p), p))])
                if s is None:
                    continue
                s = dict(s)
                main = s.pop("main_param", None)
                if main is not None and to_model.get(id(p)) is not None:
                    with torch.no_grad():
                        p.copy_(main.to(p.device))
                opt.state[p] = {k: (v.clone() if k == "step" and host_step else
                                    v.to(p.device).clone()) if torch.is_tensor(v) else v
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

def _here() -> str:
    return "cuda" if cuda_available() else "cpu"


def rng_state() -> dict:
    """Every generator this rank draws from. "tracker" holds megatron-core's tensor-parallel
    RNG tracker states: CUDA Philox states on GPUs, CPU Mersenne Twister states on the CPU
    (cpu_shim), hence "tracker_device"."""
    return {"random": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if cuda_available() else None,
            "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
            "tracker_device": _here()}


def _tracker_device(s: dict) -> str:
    """The device whose generator the tracker states are. Checkpoints written before the tag
    existed tell it by size: a CPU generator state (5056 bytes) or a CUDA one (16)."""
    if "tracker_device" in s:
        return s["tracker_device"]
    cpu_bytes = torch.get_rng_state().numel()
    sizes = {t.numel() for t in s["tracker"].values()}
    return "cpu" if sizes <= {cpu_bytes} else "cuda"


def set_rng_state(s: dict) -> list:
    """Restore what applies on this device; return what does not (a GPU checkpoint resumed on
    the CPU, or the reverse): those generators keep their --seed initialisation."""
    random.setstate(s["random"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    here, skipped = _here(), []
    if here == "cuda" and s["cuda"] is not None:
        torch.cuda.set_rng_state(s["cuda"])
    elif here == "cuda" or s["cuda"] is not None:
        skipped.append("the CUDA generator (" + ("absent from a CPU checkpoint" if here == "cuda"
                                                  else "no CUDA here") + ")")
    saved = _tracker_device(s)
    if saved == here or not s["tracker"]:
        tensor_parallel.get_cuda_rng_tracker().set_states(s["tracker"])
    else:
        skipped.append(f"the tensor-parallel RNG tracker ({saved} generator states, "
                       f"running on {here})")
    return skipped


# ---------------------------------------------------------------- manager

def _print_rank(rank: int, msg: str) -> None:
    if dist.get_rank() == rank % dist.get_world_size():
        print(msg, flush=True)


class CheckpointManager:
    def __init__(self, args, trainer):
        self.args = args
        self.trainer = trainer
        self.components: Dict[str, object] = {}
        self.writer = AsyncWriter()
        self.snapshot = HostSnapshot()
        self.pending = None          # (root, iteration) of the async save in flight
        self._cleaned = set()        # save roots whose stale .tmp dirs rank 0 has removed

    def register(self, name: str, component) -> None:
        """Add a component whose state_dict() goes into every process's rank file."""
        self.components[name] = component

    # ------------------------------------------------------------ save
    def _jobs(self, root: str) -> list:
        """(state, path) of every file this rank writes for the current iteration."""
        t = self.trainer
        tmp = iter_dir(root, t.iteration) + ".tmp"
        tp_rank, pp_rank = t.topo.tp_rank, t.topo.pp_rank
        jobs = []
        if t.topo.dp_rank == 0:
            by_name = _by_name_supported(t.optimizer)
            jobs.append((file_state({
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
            }), os.path.join(tmp, shard_dir_name(tp_rank, pp_rank, self.args.pp),
                             "model_optim_rng.pt")))
        jobs.append(({
            "rng": rng_state(),
            "components": {k: c.state_dict() for k, c in self.components.items()},
        }, os.path.join(tmp, "rank_state", f"rank_{dist.get_rank():05d}.pt")))
        return jobs

    def save(self, root: str) -> str:
        """Save the current iteration (collective); with --async-save, return once snapshotted."""
        t, c = self.trainer, self.args.checkpoint
        self.finalize(blocking=True)   # at most one save in flight
        tmp = iter_dir(root, t.iteration) + ".tmp"
        if dist.get_rank() == 0:
            self._remove_stale_tmp(root)
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(os.path.join(tmp, "rank_state"), exist_ok=True)
        dist.barrier()
        jobs = self._jobs(root)
        for _, path in jobs:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        if c.async_save:
            self.writer.submit([(self.snapshot(obj), path) for obj, path in jobs])
            self.pending = (root, t.iteration)
            return iter_dir(root, t.iteration)
        for obj, path in jobs:
            write_file(obj, path)
        self._commit(root, t.iteration)
        return iter_dir(root, t.iteration)

    def finalize(self, blocking: bool) -> bool:
        """Commit the async save in flight once every rank has written it (collective).

        Returns True when nothing is in flight afterwards. Called every iteration (cheap when
        idle: no collective) and with blocking=True before a save, a load or the exit.
        """
        if self.pending is None:
            return True
        error = None
        try:
            done = self.writer.wait() if blocking else self.writer.poll()
        except RuntimeError as e:
            done, error = True, e
        state = torch.tensor([-1 if error else int(done)], dtype=torch.int32,
                             device=self.trainer.topo.collective_device)
        dist.all_reduce(state, op=dist.ReduceOp.MIN)   # sync point, only while a save is in flight
        if state.item() < 0:
            root, iteration = self.pending
            self.pending = None
            raise error or RuntimeError(f"asynchronous save of iteration {iteration} to {root} "
                                        f"failed on another rank; `latest` is unchanged")
        if state.item() == 0:
            return False
        root, iteration = self.pending
        self.pending = None
        self._commit(root, iteration)
        return True

    def _commit(self, root: str, iteration: int) -> None:
        """Every rank's files are on disk: make the checkpoint the latest (collective)."""
        dist.barrier()
        if dist.get_rank() == 0:
            final = iter_dir(root, iteration)
            if os.path.exists(final):  # re-saving the same iteration: replace it whole
                shutil.rmtree(final)
            os.replace(final + ".tmp", final)
            fsync_dir(root)
            atomic_write_text(os.path.join(root, LATEST), str(iteration))
            self._prune(root)
        dist.barrier()
        _print_rank(-1, f"  saved checkpoint at iteration {iteration:7d} to {root}")

    def _prune(self, root: str) -> None:
        """--keep-last N: drop older committed checkpoints (the new one is already latest)."""
        keep = self.args.checkpoint.keep_last
        if not keep:
            return
        for iteration in committed_iterations(root)[keep:]:
            shutil.rmtree(iter_dir(root, iteration), ignore_errors=True)

    def _remove_stale_tmp(self, root: str) -> None:
        """Unfinished saves of an earlier, killed process (never one of ours in flight)."""
        if root in self._cleaned or not os.path.isdir(root):
            self._cleaned.add(root)
            return
        for d in os.listdir(root):
            if d.startswith("iter_") and d.endswith(".tmp"):
                shutil.rmtree(os.path.join(root, d), ignore_errors=True)
        self._cleaned.add(root)

    # ------------------------------------------------------------ load
    def _files_to_read(self, root: str, iteration: int) -> list:
        tp_rank, pp_rank = self.trainer.topo.tp_rank, self.trainer.topo.pp_rank
        files = [shard_file(root, iteration, tp_rank, pp_rank, self.args.pp)]
        mine = rank_file(root, iteration, dist.get_rank())
        return files + ([mine] if os.path.isfile(mine) else [])

    def load(self, root: str) -> None:
        """Resume from the checkpoint in `root` that verifies (collective); none: from scratch."""
        c = self.args.checkpoint
        self.finalize(blocking=True)
        iteration = choose_checkpoint(root, lambda it: self._files_to_read(root, it),
                                      c.ckpt_fallback, log=lambda m: _print_rank(0, m))
        if iteration is None:
            _print_rank(0, f"WARNING: --load {root} holds no checkpoint (no {LATEST}); "
                           f"training starts from scratch")
            return
        self._load_iteration(root, iteration)

    def _load_iteration(self, root: str, iteration: int) -> None:
        t, c = self.trainer, self.args.checkpoint
        tp_rank, pp_rank = t.topo.tp_rank, t.topo.pp_rank
        path = shard_file(root, iteration, tp_rank, pp_rank, self.args.pp)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"--load {root}: {path} is missing. The checkpoint was saved with a different "
                f"tp/pp layout or is incomplete; reshard it with tools/checkpoint/reshard.py")
        sd = normalize_shard(safe_load(path, c.trust_checkpoint),
                             os.path.basename(os.path.dirname(path)))
        if not isinstance(sd, dict) or "layout" not in sd:
            raise ValueError(f"--load {root}: {path} is neither our checkpoint nor "
                             f"Megatron-LM's (no 'layout', no 'args' Namespace with 'model')")
        foreign = written_by_megatron_lm(sd.get("args"))
        if foreign and not (c.finetune or c.no_load_optim):
            raise ValueError(f"--load {root}: a checkpoint written by Megatron-LM; its optimizer "
                             f"state is not readable here. Pass --finetune (weights only, from "
                             f"iteration 0) or --no-load-optim (weights, iteration and consumed "
                             f"samples; Adam and the LR schedule start fresh)")
        layout = sd["layout"]
        if (layout["tp"], layout["pp"]) != (self.args.tp, self.args.pp):
            raise ValueError(f"--load {root}: saved at tp={layout['tp']} pp={layout['pp']}, "
                             f"running tp={self.args.tp} pp={self.args.pp}; reshard it with "
                             f"tools/checkpoint/reshard.py")
        model = unwrap(t.model)
        expected = model.state_dict()
        saved = to_model_names(sd["model"], expected)   # local <-> Transformer Engine spec
        check_state_matches(saved, expected, sd.get("args"), self.args.model, path)
        model.load_state_dict(saved, strict=True)
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
        mine = rank_file(root, iteration, dist.get_rank())
        if os.path.isfile(mine):
            rs = safe_load(mine, c.trust_checkpoint)
            if not c.no_load_rng:
                skipped = set_rng_state(rs["rng"])
                if skipped:   # one line: every rank skips the same generators
                    _print_rank(0, f"WARNING: --load {root}: RNG state not restored for "
                                   f"{'; '.join(skipped)}: kept as --seed initialised them, so "
                                   f"dropout draws differ from an uninterrupted run")
            for name, comp in self.components.items():
                if name in rs["components"]:
                    comp.load_state_dict(rs["components"][name])
        elif dist.get_rank() == 0:
            why = "written by Megatron-LM" if foreign else "different world size?"
            print(f"  note: {mine} not found ({why}); RNG and codec state start fresh",
                  flush=True)
        _print_rank(-1, f"  loaded checkpoint from {root} at iteration {iteration}")
