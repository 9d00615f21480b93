"""The training loop: one Trainer whose methods each do one step of Megatron's pretrain().

    trainer = Trainer(args); trainer.train(); trainer.close()

An iteration reads top to bottom in `train_step`: zero grads -> forward/backward over all
micro-batches (pipeline channels fwd/bwd) -> gradient sync (dp and emb channels) -> optimizer
step -> LR step. Compression lives entirely in the channel objects that
megatron/training/compression/channels.py builds from the flags; the loop does not know which codecs run.
"""
import math
import time
from functools import partial
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

from megatron.cc.data_parallel.replica_adam import use_replica_adam
from megatron.cc.kernels import dispatch
from megatron.training.loop.cross_entropy import cross_entropy
from megatron.training.loop.fused_adam import use_fused_adam
from megatron.training.loop.muon import build_muon_optimizer
from megatron.training.compression.channels import build_grad_sync, build_pipeline_channels
from megatron.training.runtime.nodes import node_of_ranks
from megatron.cc.pipeline.schedule import PAIRED, PREFETCH, SYNC, Schedule, forward_backward, run_backward
from megatron.cc.common.stats import ChannelStats
from megatron.training.data import datasets as data_mod
from megatron.training.compression import comp_summary
from megatron.training.model import subspace
from megatron.training.schedules.batch_rampup import BatchRampup
from megatron.training.schedules.lr_schedule import build_scheduler, sample_based
from megatron.training.loop.run_log import RunLog, run_dir
from megatron.training.checkpointing.save_load import (
    RANK, SHARD, CheckpointManager, ModelState, OptimizerState, Progress, RngState,
    SchedulerState, counter)
from megatron.training.config.config_flags import ConfigError
from megatron.training.model.mixed_precision import loss_scale_field, loss_scaler, loss_scaling
from megatron.training.model.compiled import compile_layers
from megatron.training.model.model import build_gpt_model, transformer_config, unwrap
from megatron.training.compression.tp_channel import (build_tp_channel, count_cross_entropy,
                                          sequence_parallel_params,
                                          sum_sequence_parallel_grads)
from megatron.training.runtime.signals import ExitSignal
from megatron.training.data.tokenizer import build_tokenizer
from megatron.training.runtime.topology import Topology, to_device


def print_rank_last(msg: str) -> None:
    """Megatron logs from the last rank: it holds the loss."""
    if dist.get_rank() == dist.get_world_size() - 1:
        print(msg, flush=True)


def print_rank_0(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, flush=True)


def prefetch_receives(transport) -> bool:
    """May --overlap-p2p-comm post receives ahead? Not on NCCL (schedule.py: out of order
    on one stream it can deadlock). Asked of the pipeline transport's own group, which
    --pp-backend may put on another backend than the job's default."""
    group = None if transport is None else transport.group
    return dist.get_backend(group) != "nccl"


def pipeline_schedule(args, transport, forward_only: bool) -> Schedule:
    """How the 1F1B loop exchanges: GPipe's stay synchronous; --overlap-p2p-comm posts ahead
    (prefetch) or in pairs, by the pipeline transport's backend."""
    gpipe = args.compat.pp_mode == "gpipe"
    exchange = SYNC
    if args.parallel.overlap_p2p_comm and not gpipe:
        exchange = PREFETCH if prefetch_receives(transport) else PAIRED
    return Schedule(exchange, gpipe, forward_only, virtual_stages=args.vp)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int, tp_rank: int,
            tp_channel=None, tp_size: int = 1) -> torch.Tensor:
    """Per-token cross entropy over the *real* vocabulary (`vocab_size`).

    logits: (B, S, V/tp), this rank's vocabulary slice. Megatron pads the vocabulary to a
    multiple of 128 x tp and lets the padding rows join the softmax; here their logits are
    masked out, so the loss does not depend on the padding (a Hugging Face GPT-2 imported
    with zero padding rows gives exactly Hugging Face's loss). At tp 1 on CUDA the fused
    kernels of loop/cross_entropy.py compute it from the logits in their own dtype.
    """
    from megatron.core import tensor_parallel
    width = logits.size(-1)
    real = vocab_size - tp_rank * width
    if tp_size == 1 and dispatch.enabled(logits):
        return cross_entropy(logits, labels, min(real, width))
    logits = logits.float()
    if real < width:   # this slice holds padding rows: decided on the host, from sizes
        # the mask is made on the logits' device: no host tensor copied up per micro-batch
        padded = torch.arange(width, device=logits.device) >= real
        logits = logits.masked_fill(padded, float("-inf"))
    count_cross_entropy(tp_channel, labels)
    return tensor_parallel.vocab_parallel_cross_entropy(logits, labels)


@dataclass
class StageStep:
    """Forward/backward of this pipeline stage for one micro-batch (see megatron.cc.pipeline.schedule):
    the model, where the rank sits, this step's micro-batches and the loss; nothing else."""
    model: Any
    topo: Topology
    batches: Any                       # data.MicroBatchSchedule
    lm_loss: Callable                  # (logits, labels) -> per-token loss
    scale_loss: Optional[Callable]     # fp16 loss scaling; None: none
    feeds_every_stage: bool            # subspace: every stage rebuilds x0 from the tokens
    dataset: Any
    consumed: int
    forward_only: bool = False
    losses: List[torch.Tensor] = field(default_factory=list)

    def sample_ids(self, mb: int) -> torch.Tensor:
        return self.batches.sample_ids(self.consumed, mb, self.topo.dp_rank)

    def forward(self, input_tensor, mb: int, chunk: Optional[int] = None):
        """`chunk`: the model chunk to run (interleaved 1F1B; None: the one model)."""
        model, M = self.model, self.batches.num_microbatches
        c = chunk or 0
        first, last = self.topo.chunk_is_first(c), self.topo.chunk_is_last(c)
        feed = first or self.feeds_every_stage
        batch = to_device(data_mod.collate(self.dataset, self.sample_ids(mb)),
                          self.topo.device) if feed or last else {}
        which = {} if chunk is None else {"chunk": chunk}
        unwrap(model).set_input_tensor(input_tensor, **which)
        with torch.set_grad_enabled(not self.forward_only):
            out = model(batch.get("tokens") if feed else None,
                        batch.get("position_ids") if feed else None, None, **which)
            if not last:
                return out
            per_token = self.lm_loss(out, batch["labels"])   # (B, S)
        mask = batch["loss_mask"].float()
        loss = (per_token * mask).sum() / mask.sum()
        self.losses.append(loss.detach())
        return loss / M

    def backward(self, input_tensor, output_tensor, output_grad):
        if output_grad is None and self.scale_loss is not None:  # last stage, fp16
            output_tensor = self.scale_loss(output_tensor)
        return run_backward(input_tensor, output_tensor, output_grad)


class Trainer:
    iteration, consumed_samples = counter("iteration"), counter("consumed_samples")

    def __init__(self, args, topology: Optional[Topology] = None):
        self.args = args
        self.topo = topology or Topology.from_parallel_state()   # initialize_distributed's
        self.progress = Progress()
        self.skipped_iters = 0   # since the last log line (fp16 overflow steps)
        self.stats = ChannelStats()
        self.tokenizer = self._build_tokenizer()
        nodes = node_of_ranks()   # inter-node traffic is counted apart; auto plans with it
        if args.compression.compression == "auto":   # before anything reads the codec flags
            from megatron.training.compression.auto_compression import auto_compress
            auto_compress(args, self.topo, nodes, self.tokenizer.vocab_size)
        self.padded_vocab_size = args.model.padded_vocab_size(self.tokenizer.vocab_size, args.tp)
        self.config = transformer_config(args)
        self.model = self._build_model()
        self.optimizer, self.scheduler = self._build_optimizer()
        self.scale_loss = loss_scaler(self.optimizer)
        self.batches = data_mod.MicroBatchSchedule(args.training.micro_batch_size, args.dp,
                                                   args.num_microbatches)
        self.rampup = BatchRampup.from_args(args)   # --rampup-batch-size (else constant)
        self.train_ds, self.valid_ds, _ = self._build_datasets()
        self.epoch_samples = self._epoch_samples()
        self.channels = build_pipeline_channels(args, self.config, self.stats, self.topo,
                                                epoch_samples=self.epoch_samples, nodes=nodes)
        self.grad_sync = build_grad_sync(args, self.model, self.stats, self.topo, nodes)
        self.tp_channel = build_tp_channel(args, unwrap(self.model), self.topo.tp_group,
                                           self.stats)
        self.sp_params = sequence_parallel_params(unwrap(self.model))   # --sequence-parallel
        self.writer = self._tensorboard()
        self.run_log = RunLog(args.logging, dist.get_rank() == dist.get_world_size() - 1)
        self.comp_total: Dict[str, Dict[str, int]] = {}   # --check-comp-ratio's running sum
        self.ckpt = CheckpointManager(args, self.progress, self.padded_vocab_size,
                                      self.tokenizer.vocab_size, self.topo)
        for name, state in (("model", ModelState(self.model, self.optimizer, args.model)),
                            ("optimizer", OptimizerState(self.optimizer, self.model))):
            self.ckpt.register(name, state, SHARD, gathers=state.gathers)
        self.ckpt.register("opt_param_scheduler", SchedulerState(self.scheduler), SHARD)
        self.ckpt.register("rng", RngState(), RANK)
        self.ckpt.register("pipeline_channels", self.channels)
        self.ckpt.register("grad_sync", self.grad_sync)
        if self.tp_channel is not None:
            self.ckpt.register("tp_channel", self.tp_channel)
        if args.compression.syncs_parameters:  # replicas differ: each keeps its own weights
            from megatron.training.checkpointing.replica_state import ReplicaState
            self.ckpt.register("replica", ReplicaState(self.model, self.optimizer))
        self.loss_history: List[float] = []
        self.valid_history: List[tuple] = []
        self.valid_mean_history: List[tuple] = []   # "replica average" (param-syncing modes)
        self.exit_signal = (ExitSignal(self.topo.collective_device)
                            if args.checkpoint.exit_signal_handler else None)
        self.exit_requested = False
        if args.checkpoint.load:
            self.ckpt.load(args.checkpoint.load)
            use_fused_adam(self.optimizer)   # the loaded param groups carry their own flags

    # ---------------------------------------------------------------- construction
    def _build_tokenizer(self):
        d = self.args.data
        return build_tokenizer(d.tokenizer_type, d.vocab_file, d.merge_file, d.tokenizer_model)

    def _build_model(self):
        model = build_gpt_model(self.args, self.config, self.padded_vocab_size, self.topo)
        g = self.args.gpu
        if g.torch_compile:
            compile_layers(model)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False,
            use_distributed_optimizer=g.use_distributed_optimizer,
            overlap_param_gather=g.overlap_param_gather, bucket_size=None)
        return DistributedDataParallel(config=self.config, ddp_config=ddp_config, module=model)

    def _build_optimizer(self):
        a, m = self.args.training, self.args.model
        opt_config = OptimizerConfig(
            # muon: the AdamW half's config (build_muon_optimizer makes the Muon half)
            optimizer="adam" if a.optimizer == "muon" else a.optimizer,
            sgd_momentum=a.sgd_momentum,
            lr=a.lr, min_lr=a.min_lr, weight_decay=a.weight_decay,
            adam_beta1=a.adam_beta1, adam_beta2=a.adam_beta2, adam_eps=a.adam_eps,
            clip_grad=a.clip_grad, bf16=m.bf16, fp16=m.fp16,
            params_dtype=self.config.params_dtype, **loss_scaling(self.args.gpu),
            use_distributed_optimizer=self.args.gpu.use_distributed_optimizer,
            overlap_param_gather=self.args.gpu.overlap_param_gather)
        if a.optimizer == "muon":
            optimizer = build_muon_optimizer(opt_config, self.model, a.muon_momentum,
                                             a.muon_num_ns_steps, a.muon_scale_mode)
        else:
            optimizer = get_megatron_optimizer(opt_config, [self.model])
        if self.args.compression.dp_adam_correction:
            use_replica_adam(optimizer, self.args.dp)
        use_fused_adam(optimizer)   # CUDA only: torch's fused AdamW where megatron-core fell back
        return optimizer, build_scheduler(self.args, optimizer)

    def _build_datasets(self):
        a = self.args
        gbs = self.batches.global_batch_size
        # --repeat-epoch (implied by per-sample activation caches, which key samples by dataset
        # index across epochs): the training split is built as ONE epoch and the loop wraps
        # around it (_epoch_samples); otherwise megatron-core draws train_iters x gbs samples
        # over as many epochs as needed.
        epochs = a.data.repeat_epoch or a.compression.uses_epochs
        train = None if epochs else a.training.train_iters * gbs
        sizes = [train,
                 max(1, a.logging.eval_iters) * gbs * (a.training.train_iters // max(1, a.logging.eval_interval) + 1),
                 0]
        # megatron-core builds on rank 0 first and makes the others wait for its index cache.
        data_path = a.data.data_path
        if a.data.task_name:   # weighted jsonl files, tokenised on the fly (rank 0)
            from megatron.training.data.tasks import resolve_task_name
            data_path = resolve_task_name(a.data.task_name, self.tokenizer, a.data.data_cache_path)
        return data_mod.build_datasets(data_path, a.data.split, a.model.seq_length,
                                       a.training.seed, self.tokenizer, sizes,
                                       a.data.data_cache_path)

    def _epoch_samples(self) -> int:
        """Samples in one pass over the training split, whole global batches only (the tail
        is dropped): each sample then sits in the same replica and micro-batch slot every
        epoch, so the same activation-cache pair sees it again."""
        gbs = self.batches.global_batch_size
        n = len(self.train_ds) // gbs * gbs
        if n == 0:
            raise ConfigError(f"the training split has {len(self.train_ds)} samples, fewer than "
                              f"one global batch ({gbs}); use more data or a smaller "
                              f"--global-batch-size")
        return n

    def _tensorboard(self):
        d = run_dir(self.args.logging)   # --tensorboard-dir[/--experiment-name]
        if not d or dist.get_rank() != dist.get_world_size() - 1:
            return None
        from torch.utils.tensorboard import SummaryWriter
        return SummaryWriter(log_dir=d)

    # ---------------------------------------------------------------- one iteration
    def forward_backward(self, dataset, consumed: int, forward_only=False) -> StageStep:
        loss = partial(lm_loss, vocab_size=self.tokenizer.vocab_size, tp_rank=self.topo.tp_rank,
                       tp_channel=self.tp_channel, tp_size=self.topo.tp_size)
        step = StageStep(self.model, self.topo, self.batches, loss, self.scale_loss,
                         subspace.sends_coefficients(self.args), dataset, consumed, forward_only)
        forward_backward(step, self.channels, self.batches.num_microbatches, self.iteration,
                         self.topo.pp_rank, self.args.pp,
                         pipeline_schedule(self.args, self.channels.transport, forward_only))
        return step

    def _set_batch_size(self) -> None:
        """--rampup-batch-size: this iteration's global batch, from consumed samples alone."""
        gbs = self.rampup.batch_size(self.consumed_samples)
        if gbs != self.batches.global_batch_size:
            mbs, dp = self.args.training.micro_batch_size, self.args.dp
            self.batches = data_mod.MicroBatchSchedule(mbs, dp, gbs // (mbs * dp))

    def train_step(self) -> Dict[str, float]:
        self._set_batch_size()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        self.grad_sync.begin(self.model, self.iteration)   # --overlap-grad-reduce hooks
        if self.tp_channel is not None:   # its warm-ups count iterations
            self.tp_channel.iteration = self.iteration
        step = self.forward_backward(self.train_ds, self.consumed_samples % self.epoch_samples)
        self.grad_sync(self.model, self.iteration)
        sum_sequence_parallel_grads(self.tp_channel, self.sp_params)
        ok, grad_norm, _ = self.optimizer.step()
        self.skipped_iters += 0 if ok else 1  # fp16 overflow: megatron-core skipped the step
        self.grad_sync.after_optimizer_step(self.model, self.iteration)  # parameter-syncing dp modes
        # sample-based training (--train-samples) counts the schedule in samples
        self.scheduler.step(increment=self.batches.global_batch_size
                            if sample_based(self.args) else 1)
        self.iteration += 1
        self.consumed_samples += self.batches.global_batch_size
        return {"lm loss": self._reduce_loss(step.losses), "grad norm": grad_norm or 0.0,
                "skipped": 0 if ok else 1}

    def _reduce_loss(self, losses: List[torch.Tensor], force_dp: bool = False) -> float:
        """Mean over micro-batches and replicas, known on the last stage (nan elsewhere).
        Its `.item()` is the step's one host sync (the loss goes on every log line)."""
        if not self.topo.is_last:
            return float("nan")
        value = torch.stack(losses).mean().reshape(1)
        if not (self.grad_sync.lockstep or force_dp):  # preduce/adpsgd: no dp barrier; own loss
            return value.item()
        dist.all_reduce(value, group=self.topo.dp_group)
        return value.item() / self.topo.dp_size

    # ---------------------------------------------------------------- loop
    def train(self) -> None:
        a = self.args
        t_log, iters_since_log = time.time(), 0
        self.stats.reset()
        while self.iteration < a.training.train_iters:
            metrics = self.train_step()
            iters_since_log += 1
            if self.topo.is_last:
                self.loss_history.append(metrics["lm loss"])
            if self.iteration % a.logging.log_interval == 0:
                elapsed = (time.time() - t_log) / iters_since_log
                self.log(metrics, elapsed, iters_since_log)
                t_log, iters_since_log = time.time(), 0
            if a.logging.eval_interval and self.iteration % a.logging.eval_interval == 0:
                self.evaluate()
            if a.checkpoint.save and a.checkpoint.save_interval and \
                    self.iteration % a.checkpoint.save_interval == 0:
                self.ckpt.save(a.checkpoint.save)
            if a.checkpoint.exit_interval and self.iteration % a.checkpoint.exit_interval == 0:
                break
            self.ckpt.finalize(blocking=False)   # commit a finished --async-save
            if self.exit_signal is not None and self.exit_signal.requested():
                self.exit_requested = True
                print_rank_0(f" {self.exit_signal.name} received: saving iteration "
                             f"{self.iteration} and exiting")
                break
        if a.checkpoint.save and (not a.checkpoint.save_interval
                                  or self.iteration % a.checkpoint.save_interval):
            self.ckpt.save(a.checkpoint.save)
        self.grad_sync.flush(self.model)  # after the save: a resumed run applies it itself
        self.ckpt.finalize(blocking=True)

    def log(self, metrics: Dict[str, float], elapsed: float, iters: int) -> None:
        a = self.args
        snapshots = [None] * dist.get_world_size()
        dist.all_gather_object(snapshots, self.stats.snapshot())  # sync point: log steps only
        totals = ChannelStats.merge(snapshots)
        self.stats.reset()
        comp_summary.accumulate(self.comp_total, totals)
        tokens_per_s = self.batches.global_batch_size * a.model.seq_length / max(elapsed, 1e-9)
        lr = self.scheduler.get_lr(self.optimizer.param_groups[0])
        line = (f" iteration {self.iteration:8d}/{a.training.train_iters:8d} |"
                f" consumed samples: {self.consumed_samples:12d} |"
                f" elapsed time per iteration (ms): {elapsed * 1000:.1f} |"
                f" learning rate: {lr:.6E} |"
                f" global batch size: {self.batches.global_batch_size:5d} |"
                f" lm loss: {metrics['lm loss']:.6E} |"
                f" grad norm: {metrics['grad norm']:.3f} |"
                f"{loss_scale_field(self.optimizer)}"
                f" number of skipped iterations: {self.skipped_iters:3d} |"
                f" tokens/s: {tokens_per_s:.0f} |")
        self.skipped_iters = 0
        comm = ChannelStats.format(totals, iters)
        if comm:
            line += f" {comm} |"
        print_rank_last(line)
        self.run_log.write(line)
        if self.writer is not None:
            self.writer.add_scalar("lm loss", metrics["lm loss"], self.iteration)
            self.writer.add_scalar("learning-rate", lr, self.iteration)
            self.writer.add_scalar("grad-norm", metrics["grad norm"], self.iteration)
            self.writer.add_scalar("tokens-per-second", tokens_per_s, self.iteration)
            for c, v in totals.items():
                if "sent" in v or "bytes" in v:   # "<channel> inter-node": what left the node
                    self.writer.add_scalar(f"bytes/{c}", v.get("sent", v.get("bytes"))
                                           / max(iters, 1), self.iteration)
                elif "seconds" in v:   # "<channel> wait": ms per iteration, mean over ranks
                    self.writer.add_scalar(f"wait-ms/{c[:-5]}", ChannelStats.wait_ms(v, iters),
                                           self.iteration)

    @torch.no_grad()
    def evaluate(self) -> Optional[float]:
        """Validation on the same first `eval_iters` batches every time: comparable curves.

        In the parameter-syncing dp modes the replicas' weights differ between syncs: there the
        mean of the replicas' weights is validated too (logged as "replica average").
        """
        a = self.args
        if not a.logging.eval_iters or self.valid_ds is None or len(self.valid_ds) == 0:
            return None
        loss = self._validation_loss(all_replicas=False)
        self._log_validation(loss, "")
        if a.compression.syncs_parameters and a.dp > 1:
            from megatron.cc.grad_sync.param_sync import replica_average
            with replica_average(self.model, self.topo.dp_group):
                mean_loss = self._validation_loss(all_replicas=True)
            self._log_validation(mean_loss, " (replica average)")
        return loss

    def _validation_loss(self, all_replicas: bool) -> float:
        """all_replicas: average over every replica's share even when the dp mode is not in
        lockstep (the replicas then hold the same weights and meet here anyway)."""
        self.model.eval()
        losses = []
        for i in range(self.args.logging.eval_iters):
            step = self.forward_backward(self.valid_ds, i * self.batches.global_batch_size,
                                         forward_only=True)
            losses.append(self._reduce_loss(step.losses, force_dp=all_replicas))
        self.model.train()
        return sum(losses) / len(losses)

    def _log_validation(self, loss: float, what: str) -> None:
        if not self.topo.is_last:
            return
        ppl = math.exp(min(20.0, loss)) if not math.isnan(loss) else float("nan")
        (self.valid_mean_history if what else self.valid_history).append((self.iteration, loss))
        msg = (f" validation loss{what} at iteration {self.iteration} | lm loss value: "
               f"{loss:.6E} | lm loss PPL: {ppl:.6E} |")
        print_rank_last("-" * len(msg) + "\n" + msg + "\n" + "-" * len(msg))
        self.run_log.write(msg)
        if self.writer is not None:
            tag = "lm loss validation" + (" replica average" if what else "")
            self.writer.add_scalar(tag, loss, self.iteration)
            self.writer.add_scalar(tag + " ppl", ppl, self.iteration)

    def final_evaluate(self) -> None:
        """Validation after the last iteration, unless the loop just ran it."""
        interval = self.args.logging.eval_interval
        if self.exit_requested:
            return   # pre-empted: the grace period is for the checkpoint, not for validation
        if not interval or self.iteration % interval:
            self.evaluate()

    def close(self) -> None:
        if self.args.compression.check_comp_ratio:
            self.report_compression()
        self.report_peak_memory()
        self.channels.close()
        if self.writer is not None:
            self.writer.close()

    def report_compression(self) -> None:
        """--check-comp-ratio: whole-run bytes per channel (the tail since the last log line
        included). Collective: every rank calls it."""
        snapshots = [None] * dist.get_world_size()
        dist.all_gather_object(snapshots, self.stats.snapshot())
        self.stats.reset()
        comp_summary.accumulate(self.comp_total, ChannelStats.merge(snapshots))
        text = comp_summary.format_summary(self.comp_total, self.iteration)
        print_rank_last(text)
        self.run_log.write(text)

    def report_peak_memory(self) -> None:
        """Peak memory per rank (GPU: max allocated; CPU: peak RSS), printed by the last rank."""
        if self.topo.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated() / 2**20
        else:
            import resource
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        peaks = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, peak)
        print_rank_last(f" peak memory (MB): max over ranks {max(peaks):.1f} | per rank: "
                        + " ".join(f"{p:.0f}" for p in peaks))
