"""Configuration of every compression channel (fwd, bwd, dp, emb), one dataclass.

The library (megatron.cc) receives this object in constructors and never reads flags itself;
the training driver generates the flags from these fields (megatron.training.config_flags).
"""
import os
from dataclasses import dataclass
from typing import Optional

from megatron.cc.config_fields import ConfigError, flag


@dataclass
class CompressionConfig:
    check_comp_ratio: bool = flag(
        False, "Log bytes sent per channel and the ratio against uncompressed bytes "
               "(always counted; this also prints a per-channel summary at the end).")
    check_comp_speed: bool = flag(
        False, "Log compression / decompression speed per channel on the log line (GB/s of "
               "uncompressed bytes, mean over messages and ranks; codec compute only, not the "
               "collectives): every pipeline codec, --grad-comp-type RandomizedSVD and "
               "--emb-grad-comp. CUDA events read once complete (no sync); wall clock on CPU.")
    comp_seed: Optional[int] = flag(
        None, "Seed of the low-rank compressors' random draws, equal on every rank: the "
              "initial Q of CB, of --grad-comp's PowerSGD and of --emb-grad-comp, and the "
              "RandomizedSVD projections. Default: --seed (Optimus-CC: 714, independent of "
              "--seed). Saved in checkpoints; a resume must keep it.")

    # ---- --compression auto: the planner chooses the codecs
    #      (megatron/training/auto_compression.py)
    compression: str = flag(
        "manual", "manual: the compression flags given (today's behaviour). auto: at start-up "
                  "probe every channel's link (bandwidth, latency) and the compute rate, run the "
                  "planner of tools/plan_compression.py on the launched tp/pp/dp layout, print "
                  "the plan and train with its fastest candidate within --quality-budget "
                  "(codecs, dp mode and --overlap-* flags; give none of them by hand).",
        choices=["manual", "auto"])
    quality_budget: float = flag(
        2.0, "--compression auto: largest expected validation-loss gap in percent "
             "(megatron/cc/plan/quality.py's measured gaps; unmeasured schemes are left out).")

    # ---- fwd channel (+ direct bwd quantisation): AC-SGD / AQ-SGD and TAH-Quant
    forward_compress_method: str = flag(
        "none", "Codec of the activations sent forward between pipeline stages: fixpoint "
                "(b-bit, one scale per hidden channel), delta / delta-lowbits (AC-SGD: the b-bit "
                "change against a per-sample activation cache kept on both ends), tah "
                "(TAH-Quant). Validation passes always send uncompressed.",
        choices=["none", "fixpoint", "delta", "delta-lowbits", "tah"])
    forward_bits: int = flag(4, "Bits per value of fixpoint / delta activations (1..8).")
    forward_bits_act: int = flag(
        8, "delta-lowbits: bits per value of the cached activations (1..8), one 16-bit scale "
           "per (sample, channel) as AC-SGD (whose default is 4).")
    max_activation_cache_size: Optional[int] = flag(
        None, "delta*: samples each activation cache holds (least recently used evicted "
              "beyond). Default: every training sample the replica will see. Each rank holds "
              "one cache per link end; the size is printed at start-up and a cache that does "
              "not fit is refused.")
    activation_cache_location: str = flag(
        "ram", "delta*: 'ram' (host memory; pinned, with asynchronous copies, when training "
               "on GPUs), 'device' (GPU memory), or 'disk:DIR' for memory-mapped files in the "
               "existing directory DIR (one per cache, deleted at exit).")
    activation_cache_dtype: str = flag(
        "fp16", "delta: element type of the activation cache (AC-SGD's fp16 by default: half "
                "fp32's memory, same loss as fp32 measured, since each delta is taken against "
                "the rounded copy both ends hold; values saturate at +-65504). bf16: same "
                "memory, fp32's range; fp32: twice the memory. Both ends round alike, so their "
                "caches stay identical. (delta-lowbits stores --forward-bits-act bits instead.)",
        choices=["fp32", "fp16", "bf16"])
    tile_size: int = flag(64, "tah: tile width along the hidden dim (a power of two, 2..256).")
    high_precision_bits: int = flag(4, "tah: bits of the high-entropy tokens (1..8).")
    low_precision_bits: int = flag(3, "tah: bits of the other tokens (1..8).")
    high_precision_allocation_ratio: float = flag(
        0.8, "tah: share of tokens (highest entropy first) that get --high-precision-bits.")
    backward_compress_method: str = flag(
        "none", "Codec of the activation gradients sent back: fixpoint (b-bit, no error "
                "feedback) or lowrank (Optimus-CC CB, the same as --inter-grad-comp, with "
                "its --inter-grad-comp-* / --use-error-feedback modifiers).",
        choices=["none", "fixpoint", "lowrank"])
    backward_bits: int = flag(8, "Bits per value of fixpoint gradients (1..8).")
    backward_tile_size: Optional[int] = flag(
        None, "fixpoint gradients: one scale per tile of this many hidden values (a power of "
              "two; TAH-Quant runs 32); default one scale per hidden channel.")
    backward_rank: Optional[int] = flag(
        None, "lowrank gradients: rank r of the CB factors; default --inter-grad-comp-rank.")
    stochastic_rounding: bool = flag(
        False, "fixpoint / delta quantisers round stochastically (unbiased) instead of to "
               "nearest; the generators are in the checkpoint.")
    quant_scheme: str = flag(
        "fitted", "Grid and scale of every b-bit quantiser (fixpoint / delta activations and "
                  "gradients, CocktailSGD values, the dp modes' int8 / fixpoint-b): fitted "
                  "(every one of the 2^b codes, symmetric, each group's scale chosen to minimise "
                  "its squared error; 1 bit = sign x mean|x|), absmax (the same grid with the "
                  "scale = max|x|: nothing clipped, |error| <= step/2), or seed (the AC-SGD / "
                  "CocktailSGD grid: 2^b codes from -2^(b-1) to 2^(b-1)-1 times max|x|/2^(b-1); "
                  "1 bit = sign x RMS). Stochastic rounding always scales by max|x|.",
        choices=["fitted", "absmax", "seed"])
    warmup_epochs: float = flag(
        0.0, "Pipeline channels send uncompressed (activation caches fill) for this many "
             "epochs of the training split; converted to whole iterations.")
    compress_warmup_iters: int = flag(
        0, "The same warm-up counted in iterations (give this or --warmup-epochs).")

    # ---- bwd channel: Optimus-CC compressed backpropagation (CB) + lazy error propagation
    inter_grad_comp: bool = flag(
        False, "Compress the activation gradients sent back between pipeline stages with one "
               "PowerSGD step (low-rank P, Q; Q warm-started across messages).")
    inter_grad_comp_rank: int = flag(12, "Rank r of the CB factors (paper runs 16). Ratio in "
                                         "elements = n*m / (r*(n+m)); r >= min(n, m) is exact.")
    inter_grad_comp_power_iters: int = flag(
        1, "Power steps per CB message (ours; the paper does 1). Each extra step costs two "
           "local matmuls on the sender and no bytes, and brings P Q^T closer to the best "
           "rank-r approximation of the gradient.")
    inter_grad_comp_warm_up: float = flag(
        0.0, "Fraction of --train-iters (from the start) whose backward sends go uncompressed.")
    inter_grad_comp_epilogue_only: bool = flag(
        False, "Compress only the backward sends on 1F1B's critical path: the last send of the "
               "steady phase and every send of the cool-down. Both ends decide from (stage, "
               "micro-batch, pp, M) alone.")
    inter_grad_comp_dtype: Optional[str] = flag(
        None, "dtype of P and Q on the wire (float32|bfloat16|float16); default: the "
              "gradient's dtype, so the byte ratio equals the element ratio.",
        choices=["float32", "bfloat16", "float16"])
    inter_grad_comp_type: str = flag(
        "PowerSGD", "CB codec: PowerSGD (the 'lowrank' codec, Q warm-started across messages) "
                    "or RandomizedSVD (the 'rsvd' codec: a fresh Gaussian projection per "
                    "message, seeded by --comp-seed, iteration and micro-batch; "
                    "--inter-grad-comp-power-iters - 1 subspace iterations). Same bytes. "
                    "Optimus-CC accepts this flag and always runs PowerSGD.",
        choices=["PowerSGD", "RandomizedSVD"])
    use_error_feedback: bool = flag(
        False, "Lazy error propagation for CB: the sender keeps E = M - P Q^T and adds it to the "
               "next message (across micro-batches and iterations); E is never sent alone. "
               "With --grad-comp and no CB it is Optimus-CC's PowerSGD error feedback, which "
               "--grad-comp always applies here.")
    lep_flush_on_uncompressed: bool = flag(
        False, "LEP: when a backward send goes uncompressed (the steady phase under "
               "--inter-grad-comp-epilogue-only, or CB warm-up), add the pending error E to it "
               "and send it exactly (E <- 0) instead of holding E for the next compressed send.")
    check_orth_error_acti: bool = flag(
        False, "Optimus-CC Fig. 11 diagnostic: on the last stage, log the cosine between the "
               "LEP error and the change of the stage's input activation between consecutive "
               "micro-batches, and the mean magnitude of both.")

    # ---- dp channel: Optimus-CC selective stage compression (SC), PowerSGD
    grad_comp: bool = flag(
        False, "PowerSGD (with error feedback and warm-started Q) on data-parallel gradients. "
               "1-D tensors, small matrices and the embedding/output weights stay exact. "
               "No effect with data-parallel size 1 (nothing crosses the dp group).")
    grad_comp_rank: int = flag(128, "Rank r of the PowerSGD factors P (n x r) and Q (m x r) "
                                    "(Optimus-CC paper: 128).")
    grad_comp_warm_up: float = flag(
        0.1, "Fraction of --train-iters (from the start) that all-reduce gradients exactly "
             "before PowerSGD begins; in [0, 1).")
    grad_comp_type: str = flag(
        "PowerSGD", "Reducer of --grad-comp: PowerSGD (Q warm-started; one all-reduce of P and "
                    "one of Q per step) or RandomizedSVD (a randomized SVD of the replicas' "
                    "mean gradient from a fresh Gaussian projection seeded by --comp-seed and "
                    "the iteration; 1 + --grad-comp-niter all-reduces of each). Both keep "
                    "error feedback and leave the same tensors exact.",
        choices=["PowerSGD", "RandomizedSVD"])
    grad_comp_niter: Optional[int] = flag(
        None, "--grad-comp-type RandomizedSVD: subspace iterations after the first projection "
              "(torch.svd_lowrank's niter; Optimus-CC passes 1, the default here); each costs "
              "one more all-reduce of P and of Q. 0 sends PowerSGD's bytes.")
    selective_grad_comp: bool = flag(
        False, "Only pipeline stages 0..k-1 (k = --selective-grad-comp-way) compress their dp "
               "gradients (their all-reduce ends last, on the critical path); later stages "
               "all-reduce exactly. Needs --grad-comp.")
    selective_grad_comp_way: Optional[int] = flag(
        None, "k for --selective-grad-comp, k >= 1; default max(1, pp - 1) (paper: pp=4, "
              "k=3). k >= pipeline size compresses every stage, as in Optimus-CC.")
    # ---- emb channel: Optimus-CC fused embedding synchronisation (FE)
    emb_comm_opt: bool = flag(
        False, "Fused embedding sync: the tied embedding gradient takes one all-reduce over "
               "the first and last stage of every replica (one group per TP rank) instead of "
               "the dp all-reduce plus the first/last-stage sum; lossless. With "
               "pipeline size 1 there is no embedding channel and this changes nothing.")
    # ---- emb channel: Optimus-CC embedding gradient compression (lossy)
    emb_grad_comp: bool = flag(
        False, "PowerSGD on the tied embedding gradient's sum between the first and last "
               "stage: P and Q all-reduced over the embedding group (one replica, after the dp "
               "all-reduce), or with --emb-comm-opt over the fused group (every replica). Lossy; "
               "Q warm-started; exact during --emb-grad-comp-warm-up.")
    emb_grad_comp_type: str = flag(
        "PowerSGD", "Reducer of --emb-grad-comp (Optimus-CC implements PowerSGD only).",
        choices=["PowerSGD"])
    emb_grad_comp_rank: int = flag(
        4, "Rank r of the embedding PowerSGD (Optimus-CC default 4). Where r (V/tp + H) >= "
           "(V/tp) H the gradient is summed exactly instead.")
    emb_grad_comp_warm_up: float = flag(
        0.1, "Fraction of --train-iters (from the start) whose embedding sync is exact; in "
             "[0, 1).")
    emb_use_error_feedback: bool = flag(
        False, "--emb-grad-comp keeps each stage's share of the residual (E = M - M_hat / "
               "members; the shares sum to the whole residual) and adds it to its next "
               "gradient.")

    # ---- tp channel: Optimus-CC's tensor-parallel compression (megatron/cc/tp_reduce.py)
    mp_acti_comp: bool = flag(
        False, "PowerSGD (warm-started Q, no error feedback) on the forward all-reduce of the "
               "row-parallel layers (attention and MLP output projections); lossy. Needs "
               "--tensor-model-parallel-size > 1.")
    mp_acti_comp_rank: int = flag(16, "Rank r of --mp-acti-comp's P (tokens x r) and Q "
                                     "(hidden x r).")
    mp_acti_comp_warm_up: float = flag(
        0.0, "Fraction of --train-iters (from the start) whose forward tp sums are exact; "
             "in [0, 1).")
    mp_acti_comp_type: str = flag("PowerSGD", "Reducer of --mp-acti-comp.",
                                  choices=["PowerSGD"])
    mp_grad_comp: bool = flag(
        False, "PowerSGD (warm-started Q, no error feedback) on the backward all-reduce of the "
               "column-parallel layers' input gradients (QKV, MLP input, output layer); lossy. "
               "Needs --tensor-model-parallel-size > 1.")
    mp_grad_comp_rank: int = flag(16, "Rank r of --mp-grad-comp's factors.")
    mp_grad_comp_warm_up: float = flag(
        0.0, "Fraction of --train-iters (from the start) whose backward tp sums are exact; "
             "in [0, 1).")
    mp_grad_comp_type: str = flag("PowerSGD", "Reducer of --mp-grad-comp.",
                                  choices=["PowerSGD"])

    # ---- dp channel: parameter-syncing modes (CocktailSGD, SD-PIPE preduce, AD-PSGD, DiLoCo)
    dp_mode: str = flag(
        "allreduce", "How data-parallel replicas of a stage synchronise. allreduce: gradients "
                     "(exact, or PowerSGD with --grad-comp). cocktail_sgd (alias cocktail): "
                     "compressed parameter deltas in a sharded exchange (CocktailSGD). preduce: "
                     "weight averaging with whoever is ready (SD-PIPE). adpsgd: random pairwise "
                     "weight averaging. diloco: H local steps, then an outer Nesterov step on "
                     "the averaged pseudo-gradient. sparseloco: DiLoCo's H local steps (the "
                     "--diloco-inner-steps / -fragments / -sync-delay flags), the pseudo-"
                     "gradient plus a decayed error buffer sent as top-k per chunk with "
                     "2-bit values, outer SGD (SparseLoCo).",
        choices=["allreduce", "cocktail_sgd", "cocktail", "preduce", "adpsgd", "diloco",
                 "sparseloco"])
    dp_backend: Optional[str] = flag(
        None, "Transport of the data-parallel channel: its own process group on this backend "
              "(allreduce/PowerSGD, cocktail_sgd, diloco, sparseloco): gloo (e.g. across a "
              "WAN; CUDA tensors staged through pinned host buffers) or nccl; default "
              "--distributed-backend.",
        choices=["gloo", "nccl"])
    cocktail_random_ratio: float = flag(
        0.1, "cocktail_sgd: share of entries in the random rolling subset, in (0, 1].")
    cocktail_topk_ratio: float = flag(
        0.2, "cocktail_sgd: share of the subset kept by magnitude (top-k), in (0, 1].")
    cocktail_bits: int = flag(4, "cocktail_sgd (and --diloco-compression cocktail): bits per "
                                 "kept value, 1..8.")
    cocktail_bucket_size: int = flag(
        128, "cocktail_sgd: kept values per 16-bit scale (also the bucket of int8/fixpoint-b).")
    cocktail_warmup_steps: int = flag(
        0, "cocktail_sgd: iterations that all-reduce gradients exactly before the compressed "
           "exchange starts.")
    cocktail_no_overlap: bool = flag(
        False, "cocktail_sgd: run the exchange inline after the optimizer step instead of on a "
               "background thread overlapping the next forward/backward (one step stale).")
    diloco_inner_steps: int = flag(100, "diloco, sparseloco: H, local optimizer steps between "
                                        "outer steps (SparseLoCo's paper runs 15).")
    diloco_outer_lr: float = flag(0.7, "diloco: learning rate of the outer SGD.")
    diloco_outer_momentum: float = flag(
        0.9, "diloco: Nesterov momentum of the outer SGD, in [0, 1) (0: plain SGD).")
    diloco_compression: str = flag(
        "none", "diloco: codec of the pseudo-gradient exchange: none (exact fp32 all-reduce), "
                "fp16, int8, fixpoint-<bits> (e.g. fixpoint-4), cocktail (--cocktail-* "
                "settings). Lossy codecs keep each replica's residual (error feedback).")
    diloco_fragments: int = flag(
        1, "diloco, sparseloco: Streaming DiLoCo, the stage's layers cut into F fragments "
           "synchronised in turn every H/F steps (--diloco-inner-steps must be divisible by "
           "F); under sparseloco every fragment goes through its codec with its own error "
           "buffer.")
    diloco_sync_delay: int = flag(
        0, "diloco, sparseloco: overlap a fragment's outer exchange with this many following "
           "inner steps (background thread); the update is applied then, keeping the local "
           "progress of those steps. Must be < H/F.")
    sparseloco_outer_lr: float = flag(
        1.0, "sparseloco: learning rate alpha of the outer SGD (no momentum: the decayed error "
             "buffer takes its place), > 0.")
    sparseloco_outer_momentum: float = flag(
        0.0, "sparseloco: Nesterov momentum of the outer SGD over the decoded sparse mean, in "
             "[0, 1) (0, the paper's: the decayed error buffer takes its place).")
    sparseloco_error_decay: float = flag(
        0.95, "sparseloco: beta in e <- beta e + pseudo-gradient before the top-k, in [0, 1].")
    sparseloco_density: float = flag(
        1 / 64, "sparseloco: share k / C of every chunk sent, in (0, 1] (k = round(density C), "
                "at least 1; 1 sends every value, without indices).")
    sparseloco_chunk_size: int = flag(
        4096, "sparseloco: C, values per top-k chunk of the flat pseudo-gradient; a kept "
              "position costs ceil(log2 C) bits (12 at 4096). Must divide the tied "
              "embedding's size.")
    sparseloco_bits: int = flag(
        2, "sparseloco: bits per kept value, 1..8 (--quant-scheme), one 16-bit scale per "
           "chunk.")
    dp_adam_correction: bool = flag(
        False, "Parameter-syncing modes with Adam: each replica's Adam divides by an estimate "
               "of the second moment of the all-reduced gradient instead of its own (from its "
               "own moments, no bytes), so the replicas' averaged steps follow Adam on the "
               "mean gradient instead of a ~sqrt(dp) smaller step (megatron/cc/grad_sync/"
               "replica_adam.py).")
    ssp_bound: int = flag(
        10, "preduce: every ssp-bound-th round of a replica (dp x ssp-bound updates of the "
            "stage), and the last, averages all replicas of the stage (1: every round, i.e. "
            "all-reduce).")
    preduce_scope: str = flag(
        "stage", "preduce: stage (SD-PIPE): the replicas of each pipeline stage form groups on "
                 "a scheduler of their own, independently of the other stages (the first "
                 "stage follows the last one when the word embedding is tied, so its two "
                 "copies stay equal); replica: stage 0 decides for its whole pipeline replica.",
        choices=["stage", "replica"])
    preduce_groups: str = flag(
        "auto", "preduce: what a window of ready replicas averages as. window: all of them "
                "together; pairwise: pairs in dp-rank order (an odd last one stays alone); "
                "auto: pairwise above 8 replicas per stage, as SD-PIPE.",
        choices=["auto", "window", "pairwise"])
    hetero: float = flag(
        0.0, "preduce/adpsgd/any mode: each replica sleeps a random share (up to this fraction, "
             "in [0, 1)) of its compute time per iteration, to emulate a heterogeneous cluster.")

    @property
    def dp_mode_name(self) -> str:
        return "cocktail_sgd" if self.dp_mode == "cocktail" else self.dp_mode

    @property
    def syncs_parameters(self) -> bool:
        return self.dp_mode_name != "allreduce"

    def validate_dp_mode(self, dp: int) -> None:
        mode = self.dp_mode_name
        if mode != "allreduce" and self.grad_comp:
            raise ConfigError(f"--dp-mode {self.dp_mode} replaces the gradient all-reduce that "
                              f"--grad-comp compresses; drop one of them")
        if mode != "allreduce" and dp < 2:
            raise ConfigError(f"--dp-mode {self.dp_mode} synchronises data-parallel replicas, "
                              f"but the data-parallel size is {dp}; launch more ranks or use "
                              f"--dp-mode allreduce")
        for name in ("cocktail_random_ratio", "cocktail_topk_ratio"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ConfigError(f"--{name.replace('_', '-')} must be in (0, 1], got "
                                  f"{getattr(self, name)}")
        if not 1 <= self.cocktail_bits <= 8:
            raise ConfigError(f"--cocktail-bits must be in 1..8, got {self.cocktail_bits}")
        if self.cocktail_bucket_size < 1 or self.cocktail_warmup_steps < 0:
            raise ConfigError("--cocktail-bucket-size must be >= 1 and --cocktail-warmup-steps "
                              ">= 0")
        if self.diloco_inner_steps < 1:
            raise ConfigError(f"--diloco-inner-steps must be >= 1, got {self.diloco_inner_steps}")
        if self.diloco_outer_lr <= 0 or not 0.0 <= self.diloco_outer_momentum < 1.0:
            raise ConfigError(f"--diloco-outer-lr must be > 0 and --diloco-outer-momentum in "
                              f"[0, 1), got {self.diloco_outer_lr}, {self.diloco_outer_momentum}")
        if self.diloco_fragments < 1 or self.diloco_inner_steps % self.diloco_fragments:
            raise ConfigError(f"--diloco-fragments {self.diloco_fragments} must be >= 1 and "
                              f"divide --diloco-inner-steps {self.diloco_inner_steps}")
        if not 0 <= self.diloco_sync_delay < self.diloco_inner_steps // self.diloco_fragments:
            raise ConfigError(f"--diloco-sync-delay {self.diloco_sync_delay} must be >= 0 and "
                              f"smaller than --diloco-inner-steps / --diloco-fragments "
                              f"({self.diloco_inner_steps // self.diloco_fragments})")
        from megatron.cc.grad_sync.flat_codecs import parse_fixpoint_bits
        c = self.diloco_compression
        bits = parse_fixpoint_bits(c)
        if c not in ("none", "fp16", "cocktail") and (bits is None or not 1 <= bits <= 8):
            raise ConfigError(f"--diloco-compression {c!r}: expected none, fp16, int8, "
                              f"fixpoint-<bits 1..8> or cocktail")
        self._validate_sparseloco()
        if self.dp_adam_correction and mode == "allreduce":
            raise ConfigError("--dp-adam-correction corrects the local Adam steps of a "
                              "parameter-syncing --dp-mode (cocktail_sgd, diloco, sparseloco, "
                              "preduce, adpsgd); --dp-mode allreduce already steps on the "
                              "mean gradient")
        if self.ssp_bound < 1:
            raise ConfigError(f"--ssp-bound must be >= 1, got {self.ssp_bound}")
        if not 0.0 <= self.hetero < 1.0:
            raise ConfigError(f"--hetero must be in [0, 1), got {self.hetero}")
        if self.dp_backend == "nccl":
            import torch
            if not torch.cuda.is_available():
                raise ConfigError("--dp-backend nccl needs GPUs; use gloo on CPU")
        self._validate_mode_flags(mode)

    def _validate_sparseloco(self) -> None:
        if not 0.0 < self.sparseloco_density <= 1.0:
            raise ConfigError(f"--sparseloco-density must be in (0, 1], got "
                              f"{self.sparseloco_density}")
        if self.sparseloco_chunk_size < 1:
            raise ConfigError(f"--sparseloco-chunk-size must be >= 1, got "
                              f"{self.sparseloco_chunk_size}")
        if not 1 <= self.sparseloco_bits <= 8:
            raise ConfigError(f"--sparseloco-bits must be in 1..8, got {self.sparseloco_bits}")
        if not 0.0 <= self.sparseloco_error_decay <= 1.0:
            raise ConfigError(f"--sparseloco-error-decay must be in [0, 1], got "
                              f"{self.sparseloco_error_decay}")
        if self.sparseloco_outer_lr <= 0:
            raise ConfigError(f"--sparseloco-outer-lr must be > 0, got "
                              f"{self.sparseloco_outer_lr}")
        if not 0.0 <= self.sparseloco_outer_momentum < 1.0:
            raise ConfigError(f"--sparseloco-outer-momentum must be in [0, 1), got "
                              f"{self.sparseloco_outer_momentum}")

    def _validate_mode_flags(self, mode: str) -> None:
        """A flag of one mode given with another is a mistake worth stopping for."""
        loop = ("diloco_inner_steps", "diloco_fragments", "diloco_sync_delay")  # DiLoCo's loop
        owners = {"cocktail_sgd": ("cocktail_random_ratio", "cocktail_topk_ratio",
                                   "cocktail_warmup_steps", "cocktail_no_overlap"),
                  "diloco": loop + ("diloco_outer_lr", "diloco_outer_momentum",
                                    "diloco_compression"),
                  "sparseloco": loop + ("sparseloco_outer_lr", "sparseloco_outer_momentum",
                                        "sparseloco_error_decay",
                                        "sparseloco_density", "sparseloco_chunk_size",
                                        "sparseloco_bits"),
                  "preduce": ("ssp_bound", "preduce_scope", "preduce_groups")}
        import dataclasses
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        if mode == "diloco" and self.diloco_compression == "cocktail":
            owners["cocktail_sgd"] = ("cocktail_warmup_steps", "cocktail_no_overlap")
        modes_of = {}
        for owner, names in owners.items():
            for name in names:
                modes_of.setdefault(name, []).append(owner)
        for name, modes in modes_of.items():
            if mode not in modes and getattr(self, name) != defaults[name]:
                raise ConfigError(f"--{name.replace('_', '-')} configures --dp-mode "
                                  f"{' or '.join(modes)}, but --dp-mode is {self.dp_mode}")
        if self.dp_backend is not None and mode not in ("allreduce", "cocktail_sgd", "diloco",
                                                        "sparseloco"):
            raise ConfigError(f"--dp-backend sets the dp channel's process group for allreduce, "
                              f"cocktail_sgd, diloco and sparseloco, but --dp-mode is "
                              f"{self.dp_mode}")

    def compressed_stages(self, pp: int) -> int:
        """How many leading pipeline stages run PowerSGD on their dp gradients."""
        if not self.grad_comp:
            return 0
        if not self.selective_grad_comp:
            return pp
        # way > pp compresses every stage, as Optimus-CC's `stage < way` test does
        return min(self.selective_grad_comp_way or max(1, pp - 1), pp)

    def validate_grad_comp(self, pp: int) -> None:
        if self.selective_grad_comp and not self.grad_comp:
            raise ConfigError("--selective-grad-comp chooses which stages run --grad-comp; "
                              "add --grad-comp (or drop --selective-grad-comp)")
        k = self.selective_grad_comp_way
        if k is not None and k < 1:
            raise ConfigError(f"--selective-grad-comp-way {k} must be >= 1 (values above the "
                              f"pipeline size {pp} compress every stage)")
        if self.grad_comp_rank < 1:
            raise ConfigError(f"--grad-comp-rank must be >= 1, got {self.grad_comp_rank}")
        if not 0.0 <= self.grad_comp_warm_up < 1.0:
            raise ConfigError(f"--grad-comp-warm-up is a fraction of --train-iters in [0, 1), "
                              f"got {self.grad_comp_warm_up}")

    def validate_inter_grad_comp(self, pp: int) -> None:
        if self.inter_grad_comp_rank < 1:
            raise ConfigError(f"--inter-grad-comp-rank must be >= 1, got "
                              f"{self.inter_grad_comp_rank}")
        if self.inter_grad_comp_power_iters < 1:
            raise ConfigError(f"--inter-grad-comp-power-iters must be >= 1, got "
                              f"{self.inter_grad_comp_power_iters}")
        if not 0.0 <= self.inter_grad_comp_warm_up < 1.0:
            raise ConfigError(f"--inter-grad-comp-warm-up is a fraction of --train-iters in "
                              f"[0, 1), got {self.inter_grad_comp_warm_up}")
        if self.use_error_feedback and not (self.compressed_backprop or self.grad_comp):
            raise ConfigError("--use-error-feedback switches on error feedback of compressed "
                              "backpropagation (LEP) or of --grad-comp's PowerSGD; add "
                              "--inter-grad-comp or --grad-comp")
        for name in ("inter_grad_comp_epilogue_only",
                     "lep_flush_on_uncompressed", "check_orth_error_acti"):
            if getattr(self, name) and not self.compressed_backprop:
                raise ConfigError(f"--{name.replace('_', '-')} modifies compressed "
                                  f"backpropagation; add --inter-grad-comp")
        if self.lep_flush_on_uncompressed and not self.use_error_feedback:
            raise ConfigError("--lep-flush-on-uncompressed delivers the LEP error; add "
                              "--use-error-feedback")
        if self.check_orth_error_acti and not self.use_error_feedback:
            raise ConfigError("--check-orth-error-acti measures the LEP error; add "
                              "--use-error-feedback")

    # ---- fwd channel helpers and checks (AC-SGD / TAH-Quant)
    @property
    def compressed_backprop(self) -> bool:
        """CB on the bwd channel, asked for in either spelling."""
        return self.inter_grad_comp or self.backward_compress_method == "lowrank"

    @property
    def cb_rank(self) -> int:
        return self.backward_rank if self.backward_rank is not None else self.inter_grad_comp_rank

    @property
    def activation_cache(self) -> bool:
        """The fwd codec keeps a per-sample cache (keyed by dataset index across epochs)."""
        return self.forward_compress_method in ("delta", "delta-lowbits")

    @property
    def uses_epochs(self) -> bool:
        """Training revisits a fixed set of samples epoch after epoch (see the Trainer)."""
        return self.activation_cache or self.warmup_epochs > 0

    def validate_pipeline_codecs(self, pp: int) -> None:
        fwd, bwd = self.forward_compress_method, self.backward_compress_method
        if pp == 1 and (fwd != "none" or bwd != "none"):
            raise ConfigError(f"--forward-compress-method {fwd} / --backward-compress-method "
                              f"{bwd} compress what crosses pipeline stages; with "
                              f"--pipeline-model-parallel-size 1 nothing does")
        for name in ("forward_bits", "forward_bits_act", "backward_bits", "high_precision_bits",
                     "low_precision_bits"):
            if not 1 <= getattr(self, name) <= 8:
                raise ConfigError(f"--{name.replace('_', '-')} must be in 1..8, got "
                                  f"{getattr(self, name)}")
        t = self.tile_size
        if not 2 <= t <= 256 or t & (t - 1):
            raise ConfigError(f"--tile-size must be a power of two in 2..256, got {t}")
        if not 0.0 <= self.high_precision_allocation_ratio <= 1.0:
            raise ConfigError(f"--high-precision-allocation-ratio must be in [0, 1], got "
                              f"{self.high_precision_allocation_ratio}")
        self._validate_cache()
        self._validate_backward()
        if self.warmup_epochs < 0 or self.compress_warmup_iters < 0:
            raise ConfigError("--warmup-epochs and --compress-warmup-iters must be >= 0")
        if self.warmup_epochs and self.compress_warmup_iters:
            raise ConfigError(f"--warmup-epochs {self.warmup_epochs} and --compress-warmup-iters "
                              f"{self.compress_warmup_iters} both set the warm-up; give one")
        if self.stochastic_rounding and fwd not in ("fixpoint", "delta", "delta-lowbits") \
                and bwd != "fixpoint" and self.dp_mode_name not in ("cocktail_sgd", "diloco",
                                                                    "sparseloco"):
            raise ConfigError("--stochastic-rounding changes the fixpoint / delta quantisers, "
                              f"but --forward-compress-method is {fwd} and "
                              f"--backward-compress-method is {bwd}")
        if self.quant_scheme != "fitted" and fwd not in ("fixpoint", "delta", "delta-lowbits") \
                and bwd != "fixpoint" and self.dp_mode_name not in ("cocktail_sgd", "diloco",
                                                                    "sparseloco"):
            raise ConfigError(f"--quant-scheme {self.quant_scheme} changes the fixpoint / delta / "
                              f"cocktail quantisers, but none is on: --forward-compress-method "
                              f"is {fwd}, --backward-compress-method {bwd}")

    def _validate_cache(self) -> None:
        if not self.activation_cache:
            for name, default in (("max_activation_cache_size", None),
                                  ("activation_cache_location", "ram"),
                                  ("activation_cache_dtype", "fp16")):
                if getattr(self, name) != default:
                    raise ConfigError(f"--{name.replace('_', '-')} configures the delta "
                                      f"codecs' activation cache, but --forward-compress-method "
                                      f"is {self.forward_compress_method}")
        if self.forward_compress_method == "delta-lowbits" and \
                self.activation_cache_dtype != "fp16":
            raise ConfigError(f"--activation-cache-dtype {self.activation_cache_dtype} sets the "
                              f"dense cache of --forward-compress-method delta; delta-lowbits "
                              f"stores its cache at --forward-bits-act bits")
        n = self.max_activation_cache_size
        if n is not None and n < 1:
            raise ConfigError(f"--max-activation-cache-size must be >= 1, got {n}")
        loc = self.activation_cache_location
        if loc not in ("ram", "device"):
            if not loc.startswith("disk:") or not os.path.isdir(loc[5:]):
                raise ConfigError(f"--activation-cache-location must be 'ram', 'device' or "
                                  f"'disk:DIR' with an existing directory DIR, got {loc!r}")

    def _validate_backward(self) -> None:
        bwd = self.backward_compress_method
        if self.inter_grad_comp and bwd == "fixpoint":
            raise ConfigError("--inter-grad-comp (low-rank CB) and --backward-compress-method "
                              "fixpoint both claim the backward channel; pick one")
        if self.backward_tile_size is not None:
            t = self.backward_tile_size
            if bwd != "fixpoint":
                raise ConfigError(f"--backward-tile-size sets fixpoint gradient tiles, but "
                                  f"--backward-compress-method is {bwd}")
            if t < 1 or t & (t - 1):
                raise ConfigError(f"--backward-tile-size must be a power of two, got {t}")
        if self.backward_rank is not None:
            if bwd != "lowrank":
                raise ConfigError(f"--backward-rank is the rank of --backward-compress-method "
                                  f"lowrank, but the method is {bwd}")
            if self.backward_rank < 1:
                raise ConfigError(f"--backward-rank must be >= 1, got {self.backward_rank}")
            if self.inter_grad_comp and self.backward_rank != self.inter_grad_comp_rank:
                raise ConfigError(f"--backward-rank {self.backward_rank} and "
                                  f"--inter-grad-comp-rank {self.inter_grad_comp_rank} give the "
                                  f"same CB codec two ranks; drop --inter-grad-comp or make "
                                  f"them equal")

    def validate(self, pp: int, dp: int, tp: int) -> None:
        self.validate_auto()
        self.validate_pipeline_codecs(pp)
        self.validate_inter_grad_comp(pp)
        self.validate_grad_comp(pp)
        self.validate_dp_mode(dp)
        self.validate_seed_options(pp)
        self.validate_tp_comp(tp)

    def validate_tp_comp(self, tp: int) -> None:
        """--mp-acti-comp / --mp-grad-comp (their options without them: validate_seed_options)."""
        for what in ("acti", "grad"):
            on = getattr(self, f"mp_{what}_comp")
            if on and tp == 1:
                raise ConfigError(f"--mp-{what}-comp compresses the tensor-parallel "
                                  f"all-reduces; with --tensor-model-parallel-size 1 there are "
                                  f"none (raise it, or drop --mp-{what}-comp)")
            if getattr(self, f"mp_{what}_comp_rank") < 1:
                raise ConfigError(f"--mp-{what}-comp-rank must be >= 1")
            if not 0.0 <= getattr(self, f"mp_{what}_comp_warm_up") < 1.0:
                raise ConfigError(f"--mp-{what}-comp-warm-up is a fraction of --train-iters in "
                                  f"[0, 1)")

    # fields --compression auto leaves to the user: logging, seeds, transports, emulation
    AUTO_KEEPS = ("compression", "quality_budget", "check_comp_ratio", "check_comp_speed",
                  "comp_seed", "dp_backend", "hetero")

    def validate_auto(self) -> None:
        """--compression auto owns every codec field: one given by hand would be overridden
        or would change what the planner predicted, so it is refused by name."""
        import dataclasses
        if self.quality_budget < 0:
            raise ConfigError(f"--quality-budget is a loss gap in percent, >= 0; got "
                              f"{self.quality_budget}")
        if self.compression == "manual":
            if self.quality_budget != type(self).quality_budget:   # the field's default
                raise ConfigError("--quality-budget is the budget of --compression auto; add "
                                  "--compression auto or drop it")
            return
        for f in dataclasses.fields(self):
            if f.name not in self.AUTO_KEEPS and getattr(self, f.name) != f.default:
                raise ConfigError(f"--{f.name.replace('_', '-')} is chosen by --compression "
                                  f"auto; drop it, or use --compression manual")

    def validate_seed_options(self, pp: int) -> None:
        """Optimus-CC's emb compression, dp reducer type, CB codec type, seed, and the options of
        its tensor-parallel compression given without it."""
        import dataclasses
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, needs, flag_ in (("grad_comp_type", self.grad_comp, "--grad-comp"),
                                   ("grad_comp_niter", self.grad_comp_type == "RandomizedSVD",
                                    "--grad-comp-type RandomizedSVD"),
                                   ("inter_grad_comp_type", self.compressed_backprop,
                                    "--inter-grad-comp"),
                                   ("emb_grad_comp_type", self.emb_grad_comp, "--emb-grad-comp"),
                                   ("emb_grad_comp_rank", self.emb_grad_comp, "--emb-grad-comp"),
                                   ("emb_grad_comp_warm_up", self.emb_grad_comp,
                                    "--emb-grad-comp"),
                                   ("emb_use_error_feedback", self.emb_grad_comp,
                                    "--emb-grad-comp"),
                                   *((f"mp_{what}_comp_{part}", getattr(self, f"mp_{what}_comp"),
                                      f"--mp-{what}-comp") for what in ("acti", "grad")
                                     for part in ("rank", "warm_up", "type"))):
            if getattr(self, name) != defaults[name] and not needs:
                raise ConfigError(f"--{name.replace('_', '-')} configures {flag_}; add "
                                  f"{flag_} (or drop --{name.replace('_', '-')})")
        if self.grad_comp_niter is not None and self.grad_comp_niter < 0:
            raise ConfigError(f"--grad-comp-niter must be >= 0, got {self.grad_comp_niter}")
        if self.emb_grad_comp:
            if pp < 2:
                raise ConfigError("--emb-grad-comp compresses the tied embedding gradient "
                                  "between the first and last pipeline stage; with "
                                  "--pipeline-model-parallel-size 1 there is none: drop it")
            if self.emb_grad_comp_rank < 1:
                raise ConfigError(f"--emb-grad-comp-rank must be >= 1, got "
                                  f"{self.emb_grad_comp_rank}")
            if not 0.0 <= self.emb_grad_comp_warm_up < 1.0:
                raise ConfigError(f"--emb-grad-comp-warm-up is a fraction of --train-iters in "
                                  f"[0, 1), got {self.emb_grad_comp_warm_up}")
