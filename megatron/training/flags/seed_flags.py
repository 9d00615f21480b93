"""Megatron-LM v2.5 / Optimus-CC flags that the paper's scripts pass, mapped onto this trainer.

RecomputeArgs: activation recomputation in today's spelling and in v2.5's, both mapped onto
megatron-core's recompute fields. CompatArgs: flags with one possible value here, the
launcher's --local-rank, and sample-based training, which `resolve_sample_based` converts
into iterations before validation. `seed_notes` gives the start-up notes where a flag means
nothing more here or differs from the seed.
"""
from dataclasses import dataclass
from typing import List, Optional

from megatron.training.config.config_flags import ConfigError, flag


@dataclass
class RecomputeArgs:
    recompute_activations: bool = flag(
        False, "Recompute each layer's core attention in the backward pass instead of storing "
               "it (= --recompute-granularity selective).")
    recompute_granularity: Optional[str] = flag(
        None, "full: store only the input of each recompute unit of layers and rerun the unit "
              "in backward; selective: recompute only core attention.",
        choices=["full", "selective"])
    recompute_method: Optional[str] = flag(
        None, "full recompute: uniform (units of --recompute-num-layers layers) or block (the "
              "first --recompute-num-layers layers of each stage).", choices=["uniform", "block"])
    recompute_num_layers: Optional[int] = flag(
        None, "Layers per recompute unit (uniform) or recomputed per stage (block); default 1.")
    checkpoint_activations: bool = flag(
        False, "Megatron-LM v2.5 spelling of --recompute-granularity full --recompute-method "
               "uniform.")
    activations_checkpoint_method: Optional[str] = flag(
        None, "Megatron-LM v2.5 spelling of --recompute-granularity full --recompute-method M.",
        choices=["uniform", "block"])
    activations_checkpoint_num_layers: Optional[int] = flag(
        None, "Megatron-LM v2.5 spelling of --recompute-num-layers.")
    distribute_checkpointed_activations: bool = flag(
        False, "Split the stored unit inputs across the tensor-parallel group (needs full "
               "recompute and --tensor-model-parallel-size > 1); megatron-core's "
               "distribute_saved_activations.", aliases=("--distribute-saved-activations",))

    def resolved(self):
        """(granularity, method, num_layers) after folding the v2.5 spellings in."""
        gran, method = self.recompute_granularity, self.recompute_method
        layers = self.recompute_num_layers or self.activations_checkpoint_num_layers
        if self.recompute_activations and gran is None:
            gran = "selective"
        if self.checkpoint_activations or self.activations_checkpoint_method:
            gran = gran or "full"
            method = method or self.activations_checkpoint_method or "uniform"
        if gran == "full":
            method = method or "uniform"
            layers = layers or 1
        return gran, method, layers

    def validate(self, tp: int, layers_per_stage: int) -> None:
        gran, method, layers = self.resolved()
        if gran == "selective" and (self.recompute_method or self.recompute_num_layers):
            raise ConfigError("--recompute-method/--recompute-num-layers choose units of full "
                              "recompute; with --recompute-granularity selective drop them or "
                              "use --recompute-granularity full")
        if gran is None and (self.recompute_method or self.recompute_num_layers
                             or self.activations_checkpoint_num_layers):
            raise ConfigError("--recompute-method/--recompute-num-layers need "
                              "--recompute-granularity full (or --checkpoint-activations)")
        if layers is not None and not 1 <= layers <= layers_per_stage and gran == "full":
            raise ConfigError(f"--recompute-num-layers {layers} must be between 1 and the "
                              f"layers of one pipeline stage ({layers_per_stage})")
        if self.distribute_checkpointed_activations:
            if gran != "full":
                raise ConfigError("--distribute-checkpointed-activations splits the inputs "
                                  "stored by full recompute; add --recompute-granularity full "
                                  "(or --checkpoint-activations)")
            if tp < 2:
                raise ConfigError("--distribute-checkpointed-activations splits stored "
                                  "activations across the tensor-parallel group; it needs "
                                  "--tensor-model-parallel-size > 1")

    def transformer_config_kwargs(self) -> dict:
        gran, method, layers = self.resolved()
        if gran is None:
            return {}
        if gran == "selective":
            return {"recompute_granularity": "selective"}
        return {"recompute_granularity": "full", "recompute_method": method,
                "recompute_num_layers": layers,
                "distribute_saved_activations": self.distribute_checkpointed_activations}


@dataclass
class CompatArgs:
    data_impl: str = flag(
        "mmap", "Megatron-LM v2.5 dataset implementation; only mmap (megatron-core's "
                "IndexedDataset reads the .bin by memory map) exists here.",
        choices=["mmap", "infer", "lazy", "cached"])
    DDP_impl: str = flag(
        "local", "Megatron-LM v2.5 DDP implementation; the gradient buffers are always "
                 "megatron-core's DistributedDataParallel (the 'local' implementation's "
                 "successor), which the compressed dp channel hooks into.",
        choices=["local", "torch"])
    local_rank: Optional[int] = flag(
        None, "Set by `python -m torch.distributed.launch`; the LOCAL_RANK environment "
              "variable takes precedence when both are present.")
    no_masked_softmax_fusion: bool = flag(
        False, "Use the unfused scale-mask-softmax kernel (always so on CPU).")
    train_samples: Optional[int] = flag(
        None, "Train on this many samples instead of --train-iters (iterations follow from the "
              "global batch size and --rampup-batch-size).")
    lr_decay_samples: Optional[int] = flag(
        None, "Learning-rate decay length in samples (with --train-samples; default "
              "--train-samples).")
    lr_warmup_samples: int = flag(
        0, "Learning-rate warm-up length in samples (with --train-samples).")
    pp_mode: str = flag(
        "1f1b", "Pipeline schedule: 1f1b (Megatron's, at most pp micro-batches in flight) or "
                "gpipe (all forwards, then all backwards: AC-SGD's --pp-mode gpipe; same "
                "results, M micro-batches of activations held).",
        choices=["1f1b", "gpipe"], aliases=("--pipeline-schedule",))
    rampup_batch_size: Optional[List[int]] = flag(
        None, "START INCREMENT SAMPLES: begin with global batch START and grow it by INCREMENT "
              "in equal steps over the first SAMPLES samples up to --global-batch-size "
              "(Megatron's batch-size ramp-up).")

    def validate(self) -> None:
        if self.data_impl != "mmap" and self.data_impl != "infer":
            raise ConfigError(f"--data-impl {self.data_impl}: only mmap datasets exist here "
                              f"(tools/preprocess_data.py writes them); use --data-impl mmap")
        if self.DDP_impl != "local":
            raise ConfigError(f"--DDP-impl {self.DDP_impl}: gradients always go through "
                              f"megatron-core's DistributedDataParallel (whose buffers the "
                              f"compressed dp channel uses); use --DDP-impl local")


# --------------------------------------------------------------------------- conversions

def _explicit(argv, name: str) -> bool:
    """Was --name (dash or underscore spelling) on the command line?"""
    spellings = {"--" + name.replace("_", "-"), "--" + name}
    return any(a.split("=")[0] in spellings for a in argv)


def resolve_sample_based(args, argv) -> None:
    """--train-samples & co. -> iterations, before the groups validate themselves.

    Like Megatron: --train-samples excludes --train-iters / --lr-decay-iters /
    --lr-warmup-iters; the LR schedule then counts samples (the trainer steps it by the global
    batch of each iteration), so a ramp-up moves the schedule by the samples really seen.
    """
    c, t = args.compat, args.training
    if c.rampup_batch_size is not None:
        _check_rampup(c.rampup_batch_size, t.global_batch_size,
                      t.micro_batch_size * args.dp)
    if c.train_samples is None:
        for name in ("lr_decay_samples", "rampup_batch_size"):
            if getattr(c, name) is not None:
                raise ConfigError(f"--{name.replace('_', '-')} counts samples; it needs "
                                  f"--train-samples instead of --train-iters")
        if c.lr_warmup_samples:
            raise ConfigError("--lr-warmup-samples needs --train-samples; with --train-iters "
                              "use --lr-warmup-iters")
        return
    for name in ("train_iters", "lr_decay_iters", "lr_warmup_iters"):
        if _explicit(argv, name):
            raise ConfigError(f"--train-samples trains by samples; drop --{name.replace('_', '-')} "
                              f"(use --train-samples / --lr-decay-samples / --lr-warmup-samples)")
    if c.lr_warmup_samples and t.lr_warmup_fraction is not None:
        raise ConfigError("--lr-warmup-samples and --lr-warmup-fraction are mutually "
                          "exclusive; give one")
    from megatron.training.schedules.batch_rampup import BatchRampup
    ramp = BatchRampup.from_args(args)
    t.train_iters = max(1, ramp.iterations_for(c.train_samples))
    t.lr_decay_iters = None


def _check_rampup(values, global_batch: int, granule: int) -> None:
    if len(values) != 3:
        raise ConfigError(f"--rampup-batch-size takes three numbers START INCREMENT SAMPLES, "
                          f"got {len(values)}")
    start, incr, samples = values
    if start < 1 or incr < 1 or samples < 0:
        raise ConfigError("--rampup-batch-size START and INCREMENT must be >= 1 and SAMPLES >= 0")
    if start > global_batch or (global_batch - start) % incr:
        raise ConfigError(f"--rampup-batch-size: --global-batch-size ({global_batch}) - START "
                          f"({start}) must be a non-negative multiple of INCREMENT ({incr})")
    if start % granule or incr % granule:
        raise ConfigError(f"--rampup-batch-size: START ({start}) and INCREMENT ({incr}) must be "
                          f"multiples of --micro-batch-size x data-parallel size ({granule})")


def validate_seed_flags(args) -> None:
    """Cross-group checks of the two groups above (called from validate_args)."""
    args.compat.validate()
    args.recompute.validate(args.tp, args.model.num_layers // max(args.pp, 1))
    if args.compat.pp_mode == "gpipe" and args.compression.inter_grad_comp_epilogue_only:
        raise ConfigError("--inter-grad-comp-epilogue-only compresses 1F1B's critical-path "
                          "sends; with --pp-mode gpipe drop it (or use --pp-mode 1f1b)")
    validate_seed_compression(args)
    if args.compat.rampup_batch_size is not None:
        if args.compression.inter_grad_comp_epilogue_only:
            raise ConfigError("--rampup-batch-size changes the number of micro-batches per "
                              "iteration, but --inter-grad-comp-epilogue-only picks the "
                              "critical-path sends for a fixed number; drop one of them")
        if args.data.repeat_epoch or args.compression.uses_epochs:
            raise ConfigError("--rampup-batch-size is a pretraining schedule; epochs over one "
                              "split (--repeat-epoch, delta codecs, --warmup-epochs) need a "
                              "fixed global batch")


def validate_seed_compression(args) -> None:
    """Optimus-CC's remaining compression options against the other groups' flags."""
    comp = args.compression
    if comp.emb_grad_comp and args.model.untie_embeddings_and_output_weights:
        raise ConfigError("--emb-grad-comp compresses the gradient of the tied word embedding; "
                          "with --untie-embeddings-and-output-weights nothing is shared between "
                          "the first and last stage: drop one of them")
    if comp.grad_comp_type == "RandomizedSVD" and args.parallel.overlap_grad_reduce:
        raise ConfigError("--grad-comp-type RandomizedSVD runs after backward (each subspace "
                          "iteration needs the whole gradient); drop --overlap-grad-reduce or "
                          "use --grad-comp-type PowerSGD")


def seed_notes(args) -> List[str]:
    """What rank 0 prints at start-up about flags kept for the seed's scripts."""
    notes = []
    c, comp = args.compat, args.compression
    if args.parallel.sequence_parallel and args.tp == 1:
        notes.append("--sequence-parallel at --tensor-model-parallel-size 1: off, as in "
                     "Megatron-LM (there is no tensor-parallel group to shard the sequence over)")
    if c.data_impl == "infer":
        notes.append("--data-impl infer: the .idx/.bin pairs are always read by memory map")
    gran, method, layers = args.recompute.resolved()
    if args.recompute.checkpoint_activations or args.recompute.activations_checkpoint_method:
        notes.append(f"v2.5 activation checkpointing -> --recompute-granularity {gran} "
                     f"--recompute-method {method} --recompute-num-layers {layers}")
    k = comp.selective_grad_comp_way
    if comp.grad_comp and comp.selective_grad_comp and k is not None and k > args.pp:
        notes.append(f"--selective-grad-comp-way {k} > pipeline size {args.pp}: every stage "
                     f"compresses its dp gradients (as Optimus-CC does)")
    if comp.use_error_feedback and comp.grad_comp and not comp.compressed_backprop:
        notes.append("--use-error-feedback with --grad-comp and no CB: PowerSGD's error "
                     "feedback, which --grad-comp always applies here")
    if comp.grad_comp and comp.grad_comp_type == "RandomizedSVD":
        niter = 1 if comp.grad_comp_niter is None else comp.grad_comp_niter
        notes.append(f"--grad-comp-type RandomizedSVD: a randomized SVD of the replicas' mean "
                     f"gradient, {1 + niter} all-reduces of P and Q per step (Optimus-CC "
                     f"averages each replica's own SVD factors)")
    if comp.emb_grad_comp:
        where = "every replica's first and last stage (--emb-comm-opt)" if comp.emb_comm_opt \
            else "each replica's first and last stage"
        notes.append(f"--emb-grad-comp: PowerSGD rank {comp.emb_grad_comp_rank} over {where}; "
                     f"error feedback keeps each stage's share of the residual")
    if comp.comp_seed is None and (comp.grad_comp or comp.compressed_backprop
                                   or comp.emb_grad_comp):
        notes.append(f"--comp-seed not given: the compressors draw from --seed "
                     f"{args.training.seed} (Optimus-CC's default is 714)")
    return notes
