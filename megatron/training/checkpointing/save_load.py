"""Checkpoints in Megatron-LM's directory layout, written atomically, resumable bit for bit.

    <dir>/latest_checkpointed_iteration.txt
    <dir>/iter_0000010/mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt  one per model shard
    <dir>/iter_0000010/rank_state/rank_{global:05d}.pt                 one per process

The shard file (dp rank 0) holds the model shard and its optimizer state by global parameter
name, so tools/checkpoint can reshard both; the rank file holds what differs between processes
(RNG states, every channel's state). Both hold only what is registered with CheckpointManager.
Files go under iter_XXXXXXX.tmp/ with checksums and are committed by a rename.
Layout and guarantees: docs/checkpoints_and_hf.md, docs/fault_tolerance.md.
"""
import dataclasses
import os
import random
import shutil
from typing import Dict

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

from megatron.core import tensor_parallel
from megatron.training.checkpointing import checkpoint_distopt
from megatron.training.checkpointing.checkpoint_args import file_state, written_by_megatron_lm
from megatron.training.checkpointing.checkpoint_compat import (  # noqa: F401  (shard_dir_name: for tools/)
    find_shard_dir, normalize_shard, shard_dir_name, to_model_names)
from megatron.training.checkpointing.checkpoint_match import check_state_matches
from megatron.training.checkpointing.async_save import AsyncWriter, HostSnapshot
from megatron.training.checkpointing.checkpoint_io import fsync_dir, safe_load, write_file
from megatron.training.checkpointing.checkpoint_select import (  # noqa: F401  (re-exported for tools/)
    LATEST, choose_checkpoint, committed_iterations, iter_dir, read_latest)
from megatron.training.model.model import chunks_of, global_param_names, unwrap
from megatron.training.model.subspace import check_saved_mode, fill_old_state
from megatron.training.runtime.compat import optimizer_parts
from megatron.training.runtime.topology import Topology, cuda_available

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
    return [getattr(o, "optimizer", None) for o in optimizer_parts(optimizer)]


def optimizer_kinds(optimizer) -> list:
    """The kinds of state the chained torch optimizers keep, sorted: 'muon', 'sgd' or 'adam'
    (any Adam: torch's, fused, ReplicaAdamW, whose states load into one another)."""
    def kind(o):
        return ("muon" if isinstance(o, getattr(torch.optim, "Muon", ())) else
                "sgd" if isinstance(o, torch.optim.SGD) else "adam")
    return sorted({kind(o) for o in _torch_optimizers(optimizer) if o is not None})


def _is_fp32_optimizer(optimizer) -> bool:
    from megatron.core.optimizer.optimizer import FP32Optimizer
    return all(isinstance(o, FP32Optimizer) for o in optimizer_parts(optimizer))


def _by_name_supported(optimizer) -> bool:
    """FP32Optimizer, or the mixed-precision one (bf16/fp16); the distributed optimizer's
    sharded state is gathered by name apart (checkpoint_distopt)."""
    return all(_is_fp32_optimizer(o) or hasattr(o, "fp32_from_float16_groups")
               for o in optimizer_parts(optimizer))


def _without_parameter_state(sd: dict) -> bool:
    """A megatron-core state_dict() of the distributed optimizer, as checkpoints before the
    gathered form held it: param groups and loss scale only, no Adam moments."""
    inner = sd.get("optimizer") if isinstance(sd, dict) else None
    return isinstance(inner, dict) and "state" not in inner and "param_groups" in inner


def _model_params(optimizer) -> Dict[int, torch.nn.Parameter]:
    """{id(param the torch optimizer steps): model parameter it stands for}. fp32 runs: the
    parameter itself; bf16/fp16 runs: the fp32 main copy of a 16-bit model parameter."""
    out = {}
    for o in optimizer_parts(optimizer):
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


class OptimizerState:
    """Adam's state by global parameter name where supported (reshardable), else
    megatron-core's own; fp16's loss-scale state (None without a scaler).

    With the distributed optimizer saving is collective over the dp group (`gathers`: the
    manager calls state_dict() on every dp rank, and keeps dp rank 0's)."""

    def __init__(self, optimizer, model):
        self.optimizer, self.model = optimizer, model
        self.gathers = bool(checkpoint_distopt.distributed_optimizers(optimizer))

    def _names(self) -> Dict[int, str]:
        return {id(p): g for _, g, p in global_param_names(unwrap(self.model))}

    def state_dict(self) -> dict:
        o = self.optimizer
        scaler = getattr(optimizer_parts(o)[0], "grad_scaler", None)
        scaler = None if scaler is None else scaler.state_dict()
        if self.gathers:
            state = checkpoint_distopt.gather_state(o, self._names())
            return state if state is None else {"optimizer_by_name": state, "optimizer": None,
                                                "grad_scaler": scaler}
        by_name = _by_name_supported(o)
        return {"optimizer_by_name": named_optimizer_state(o, self.model) if by_name else None,
                "optimizer": None if by_name else o.state_dict(),
                "grad_scaler": scaler, "kinds": optimizer_kinds(o)}

    def load_state_dict(self, sd: dict) -> None:
        o = self.optimizer
        saved = sd.get("kinds")   # absent before Muon: every saved state was Adam's or SGD's
        if saved is not None and saved != optimizer_kinds(o):
            raise ValueError(
                f"the checkpoint's optimizer state is {' + '.join(saved)}'s, this run's optimizer "
                f"is {' + '.join(optimizer_kinds(o))}: keep its --optimizer, or resume the "
                f"weights alone with --no-load-optim (or --finetune)")
        if sd["optimizer_by_name"] is None:
            if _without_parameter_state(sd["optimizer"]):
                raise ValueError(
                    "saved with --use-distributed-optimizer by an earlier version, which kept "
                    "no Adam moments in the checkpoint; resume with --no-load-optim (weights, "
                    "iteration and LR schedule; Adam starts fresh)")
            return o.load_state_dict(sd["optimizer"])
        if self.gathers:
            checkpoint_distopt.load_state(o, self._names(), sd["optimizer_by_name"])
        else:
            load_named_optimizer_state(o, self.model, sd["optimizer_by_name"])
        for each in optimizer_parts(o):
            if sd.get("grad_scaler") is not None and getattr(each, "grad_scaler", None) is not None:
                each.grad_scaler.load_state_dict(sd["grad_scaler"])


def model_keys(num_chunks: int) -> list:
    """Where a shard file keeps its model: 'model', or one 'model<c>' per chunk when
    interleaved (Megatron-LM's keys), each a chunk's own state dict."""
    return ["model"] if num_chunks == 1 else [f"model{c}" for c in range(num_chunks)]


class ModelState:
    """The model shard's weights; loading also refreshes bf16/fp16's fp32 main weights.

    With --overlap-param-gather the other dp ranks' slices of the weights updated by the last
    step arrive only in the next forward: saving first completes that all-gather, so it is
    collective over the dp group (`gathers`)."""

    def __init__(self, model, optimizer, model_args):
        self.model, self.optimizer, self.model_args = model, optimizer, model_args
        ddp_config = getattr(model, "ddp_config", None)
        self.gathers = bool(ddp_config and ddp_config.overlap_param_gather)

    def state_dict(self) -> dict:
        if self.gathers:   # megatron-core's forward pre-hook then finds nothing left to wait for
            self.model.start_param_sync(force_sync=True)
        chunks = chunks_of(self.model)
        return {k: c.state_dict() for k, c in zip(model_keys(len(chunks)), chunks)}

    def load_state_dict(self, sd: dict) -> None:
        chunks = chunks_of(self.model)
        for key, model in zip(model_keys(len(chunks)), chunks):
            if key not in sd:
                raise ValueError(f"no '{key}' in the shard: it was saved with another "
                                 f"--virtual-pipeline-model-parallel-size (model chunks per "
                                 f"rank); run with the saved one")
            expected = model.state_dict()
            saved = to_model_names(sd[key], expected)   # local <-> Transformer Engine spec
            fill_old_state(saved, expected)
            check_state_matches(saved, expected, sd.get("args"), self.model_args)
            check_saved_mode(model, sd.get("args"))
            model.load_state_dict(saved, strict=True)
        self.optimizer.reload_model_params()


class SchedulerState:
    """The learning-rate schedule (megatron-core's OptimizerParamScheduler)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def state_dict(self) -> dict:
        return {"opt_param_scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        if sd["opt_param_scheduler"] is None:
            raise ValueError("this checkpoint holds weights only (e.g. made by "
                             "tools/checkpoint/import_hf.py); load it with --finetune")
        self.scheduler.load_state_dict(sd["opt_param_scheduler"])


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


class RngState:
    """Every generator this process draws from ("rng" of its rank file)."""

    def state_dict(self) -> dict:
        return {"rng": rng_state()}

    def load_state_dict(self, sd: dict) -> None:
        skipped = set_rng_state(sd["rng"])
        if skipped:   # one line: every rank skips the same generators
            _print_rank(0, f"WARNING: --load: RNG state not restored for {'; '.join(skipped)}: "
                           f"kept as --seed initialised them, so dropout draws differ from an "
                           f"uninterrupted run")


@dataclasses.dataclass
class Progress:
    """The counters a resumed run continues from; the Trainer's own (see counter)."""
    iteration: int = 0          # optimizer steps taken
    consumed_samples: int = 0   # training samples drawn, all replicas

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, sd: dict) -> None:
        self.iteration, self.consumed_samples = sd["iteration"], sd["consumed_samples"]


def counter(name: str) -> property:
    """An owner attribute kept in owner.progress: the trainer's counters are its Progress."""
    return property(lambda o: getattr(o.progress, name), lambda o, v: setattr(o.progress, name, v))


# ---------------------------------------------------------------- manager

def _print_rank(rank: int, msg: str) -> None:
    if dist.get_rank() == rank % dist.get_world_size():
        print(msg, flush=True)


SHARD, RANK, COMPONENT = "shard", "rank", "component"   # where a registered state goes


class CheckpointManager:
    """Saves and loads what is registered, in registration order. A SHARD (RANK) Stateful's keys
    go to the top level of dp rank 0's model_optim_rng.pt (the rank file) and it loads from the
    whole file; a COMPONENT's state sits under the rank file's "components"[name]. A SHARD
    Stateful registered with `gathers` is saved collectively over the dp group (every dp rank
    calls its state_dict(), which returns None except on dp rank 0)."""

    def __init__(self, args, progress: Stateful, padded_vocab_size: int, vocab_size: int,
                 topo: Topology):
        self.args, self.progress = args, progress   # progress.iteration names the directory
        self.tp_rank, self.pp_rank, self.dp_rank = topo.tp_rank, topo.pp_rank, topo.dp_rank
        self.collective_device = topo.collective_device   # the async-save handshake's tensor
        self.layout = {"tp": args.tp, "pp": args.pp, "tp_rank": self.tp_rank,
                       "pp_rank": self.pp_rank, "padded_vocab_size": padded_vocab_size,
                       "vocab_size": vocab_size}
        if args.vp > 1:   # interleaved: model0, model1, ... in the shard
            self.layout["vp"] = args.vp
        self.registry: Dict[str, Dict[str, Stateful]] = {SHARD: {}, RANK: {}, COMPONENT: {}}
        self.gathering = set()   # SHARD names saved collectively over the dp group
        self.register("progress", progress, SHARD)
        self.writer = AsyncWriter()
        self.snapshot = HostSnapshot()
        self.pending = None          # (root, iteration) of the async save in flight
        self._cleaned = set()        # save roots whose stale .tmp dirs rank 0 has removed

    def register(self, name: str, obj: Stateful, where: str = COMPONENT,
                 gathers: bool = False) -> None:
        self.registry[where][name] = obj
        if gathers:
            self.gathering.add(name)

    # ------------------------------------------------------------ save
    def _jobs(self, root: str) -> list:
        """(state, path) of every file this rank writes for the current iteration."""
        tmp = iter_dir(root, self.progress.iteration) + ".tmp"
        jobs = []
        # a Stateful that `gathers` (the distributed optimizer's state) is collective over the
        # dp group: every dp rank calls it, in registration order; dp rank 0 writes the result
        shard = {"checkpoint_version": CHECKPOINT_VERSION, **self.progress.state_dict(),
                 "args": self.args.to_dict(), "layout": self.layout}   # progress first
        for name, obj in self.registry[SHARD].items():
            if self.dp_rank == 0 or name in self.gathering:
                shard.update(obj.state_dict() or {})
        if self.dp_rank == 0:
            jobs.append((file_state(shard), os.path.join(
                tmp, shard_dir_name(self.tp_rank, self.pp_rank, self.args.pp),
                "model_optim_rng.pt")))
        mine = {k: v for obj in self.registry[RANK].values() for k, v in obj.state_dict().items()}
        mine["components"] = {n: obj.state_dict() for n, obj in self.registry[COMPONENT].items()}
        jobs.append((mine, os.path.join(tmp, "rank_state", f"rank_{dist.get_rank():05d}.pt")))
        return jobs

    def save(self, root: str) -> str:
        """Save the current iteration (collective); with --async-save, return once snapshotted."""
        c, iteration = self.args.checkpoint, self.progress.iteration
        self.finalize(blocking=True)   # at most one save in flight
        tmp = iter_dir(root, iteration) + ".tmp"
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
            self.pending = (root, iteration)
            return iter_dir(root, iteration)
        for obj, path in jobs:
            write_file(obj, path)
        self._commit(root, iteration)
        return iter_dir(root, iteration)

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
                             device=self.collective_device)
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
        files = [shard_file(root, iteration, self.tp_rank, self.pp_rank, self.args.pp)]
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

    def _restores(self, name: str) -> bool:
        """--finetune: the weights only; --no-load-optim, --no-load-rng: as in Megatron-LM."""
        c = self.args.checkpoint
        if c.finetune:
            return name == "model"
        return not (c.no_load_optim and name in ("optimizer", "opt_param_scheduler")
                    or c.no_load_rng and name == "rng")

    def _restore(self, where: str, sd: dict, path: str) -> None:
        for name, obj in self.registry[where].items():
            state = sd["components"].get(name) if where == COMPONENT else sd
            try:
                if state is not None and self._restores(name):
                    obj.load_state_dict(state)
            except ValueError as e:   # name the file
                raise ValueError(f"--load {path}: {e}") from None

    def _load_iteration(self, root: str, iteration: int) -> None:
        c = self.args.checkpoint
        path = shard_file(root, iteration, self.tp_rank, self.pp_rank, self.args.pp)
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
        if layout.get("vp", 1) != self.args.vp:
            raise ValueError(f"--load {root}: saved with {layout.get('vp', 1)} model chunk(s) "
                             f"per rank (--virtual-pipeline-model-parallel-size), running "
                             f"{self.args.vp}; run with the saved chunks, or (to run without "
                             f"interleaving) convert it with tools/checkpoint/reshard.py, which "
                             f"reads interleaved checkpoints and writes one chunk per rank")
        self._restore(SHARD, sd, path)
        if c.finetune:
            return
        mine = rank_file(root, iteration, dist.get_rank())
        if os.path.isfile(mine):
            rs = safe_load(mine, c.trust_checkpoint)
            self._restore(RANK, rs, mine)
            self._restore(COMPONENT, rs, mine)
        elif dist.get_rank() == 0:
            why = "written by Megatron-LM" if foreign else "different world size?"
            print(f"  note: {mine} not found ({why}); RNG and codec state start fresh",
                  flush=True)
        _print_rank(-1, f"  loaded checkpoint from {root} at iteration {iteration}")
