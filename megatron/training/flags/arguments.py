"""Training configuration: Megatron-LM's flag names, grouped into dataclasses that validate themselves.

`parse_args()` builds every flag from the dataclasses below (and from the compression config
in megatron.cc.config), then `validate_args()` checks each group and the cross-group rules
against the world size. Validation has no side effects and runs on every rank before any
process group is created, so a bad flag stops all ranks with the same one-line message.
"""
import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import List, Optional

from megatron.cc.common.config_fields import check_bounds
from megatron.cc.plan.shapes import default_ffn_hidden_size, padded_vocab_size
from megatron.training.flags.auto_flags import validate_auto_args
from megatron.training.config.config_flags import (ConfigError, FlagParser, add_dataclass_flags, flag,
                                            from_namespace)
from megatron.training.flags.seed_flags import (CompatArgs, RecomputeArgs, resolve_sample_based,
                                          validate_seed_flags)
from megatron.training.flags.device_args import GpuArgs, validate_gpu_args


@dataclass
class ParallelArgs:
    tensor_model_parallel_size: int = flag(1, "Tensor model parallel size (TP).")
    pipeline_model_parallel_size: int = flag(1, "Pipeline model parallel size (PP).")
    distributed_backend: Optional[str] = flag(
        None, "torch.distributed backend; default nccl when CUDA is present, else gloo.",
        choices=["nccl", "gloo"])
    distributed_timeout_minutes: float = flag(
        10, "Timeout (minutes) of every collective, process-group creation and start-up "
            "handshake; a rank stuck longer fails with the name of the collective.")
    # ---- communication overlap; off = the synchronous reference path
    # ---- interleaved 1F1B (Megatron's virtual pipeline); resolved to the one field below
    virtual_pipeline_model_parallel_size: Optional[int] = flag(
        None, "Model chunks per pipeline rank (interleaved 1F1B): chunk c of rank r holds "
              "virtual stage c x pp + r; the pipeline bubble shrinks by this factor. Needs "
              "pp >= 2, --num-layers divisible by pp x this, and micro-batches per step a "
              "multiple of pp.")
    num_layers_per_virtual_pipeline_stage: Optional[int] = flag(
        None, "Megatron-LM v2.5 spelling: layers per model chunk; "
              "--virtual-pipeline-model-parallel-size = --num-layers / pp / this.")
    overlap_p2p_comm: bool = flag(
        False, "Pipeline sends are posted and waited for only at the end of the step, and "
               "(gloo) each receive is posted one micro-batch before it is needed, so transfers "
               "run during compute. Same messages, codecs and losses as without.")
    scatter_gather_tensors_in_pipeline: bool = flag(
        True, "At tp > 1 each tensor-parallel rank sends only its 1/tp slice (along the "
              "sequence) of every pipeline message and the receiving stage all-gathers the "
              "slices (Megatron v2.5's default); codecs compress the slice. "
              "--no-scatter-gather-tensors-in-pipeline sends the whole message from every rank.")
    sequence_parallel: bool = flag(
        False, "megatron-core's sequence parallelism: between the tensor-parallel regions "
               "(LayerNorm, dropout, residual) each tp rank holds a 1/tp block of the sequence, "
               "and the tp all-reduces become all-gathers and reduce-scatters; every pipeline "
               "message is then the rank's (S/tp, B, H) shard. Off at "
               "--tensor-model-parallel-size 1, as in Megatron-LM.")
    overlap_grad_reduce: bool = flag(
        False, "Data-parallel gradients (exact and --grad-comp PowerSGD) are synchronised "
               "bucket by bucket as soon as the last micro-batch's backward has produced them, "
               "instead of after the whole backward. Same results as without.")
    ddp_bucket_size: Optional[int] = flag(
        None, "Elements per gradient bucket of --overlap-grad-reduce; default "
              "max(40M, 1M x dp), megatron-core's.")

    def validate(self, world_size: int) -> None:
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        if tp < 1 or pp < 1:
            raise ConfigError("--tensor-model-parallel-size and --pipeline-model-parallel-size "
                              "must be >= 1")
        if world_size % (tp * pp):
            raise ConfigError(
                f"world size ({world_size}) is not divisible by --tensor-model-parallel-size "
                f"({tp}) x --pipeline-model-parallel-size ({pp}) = {tp * pp}; launch a multiple "
                f"of {tp * pp} processes or change the parallel sizes")

        if not self.distributed_timeout_minutes > 0:
            raise ConfigError(f"--distributed-timeout-minutes must be > 0, got "
                              f"{self.distributed_timeout_minutes}")
        if self.ddp_bucket_size is not None and self.ddp_bucket_size < 1:
            raise ConfigError(f"--ddp-bucket-size must be >= 1 element, got {self.ddp_bucket_size}")
        if self.ddp_bucket_size is not None and not self.overlap_grad_reduce:
            raise ConfigError("--ddp-bucket-size cuts the gradients for --overlap-grad-reduce; "
                              "add --overlap-grad-reduce or drop it")

    def resolve_virtual(self, num_layers: int) -> None:
        """Fold --num-layers-per-virtual-pipeline-stage into the vp size (Megatron's rule)."""
        per = self.num_layers_per_virtual_pipeline_stage
        if per is None:
            return
        pp = self.pipeline_model_parallel_size
        if self.virtual_pipeline_model_parallel_size is not None:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage and "
                              "--virtual-pipeline-model-parallel-size both set the model chunks "
                              "per rank; give one")
        if per < 1 or num_layers % pp or (num_layers // pp) % per:
            raise ConfigError(f"--num-layers-per-virtual-pipeline-stage ({per}) must divide the "
                              f"layers per pipeline stage (--num-layers {num_layers} / "
                              f"--pipeline-model-parallel-size {pp})")
        self.virtual_pipeline_model_parallel_size = num_layers // pp // per

    @property
    def vp(self) -> int:
        """Model chunks per rank (1: plain 1F1B; a size of 1 is the same schedule)."""
        return self.virtual_pipeline_model_parallel_size or 1

    def validate_virtual(self, num_layers: int, num_microbatches: int) -> None:
        """Megatron's refusals for interleaving (megatron-core 0.16.1 schedules.py: the
        micro-batch group, pp by default, must fit M and leave no remainder)."""
        vp, pp = self.virtual_pipeline_model_parallel_size, self.pipeline_model_parallel_size
        if vp is None:
            return
        flag_name = "--virtual-pipeline-model-parallel-size"
        if vp < 1:
            raise ConfigError(f"{flag_name} must be >= 1 (got {vp})")
        if vp > 1 and pp < 2:
            raise ConfigError(f"{flag_name} {vp} interleaves pipeline stages: it needs "
                              f"--pipeline-model-parallel-size >= 2 (got {pp}); drop it or add "
                              f"pipeline stages")
        if num_layers % (pp * vp):
            raise ConfigError(f"--num-layers ({num_layers}) is not divisible by "
                              f"--pipeline-model-parallel-size ({pp}) x {flag_name} ({vp}) = "
                              f"{pp * vp}; change the layers or the chunks per rank")
        if vp > 1 and num_microbatches % pp:
            raise ConfigError(f"interleaved 1F1B ({flag_name} {vp}) runs micro-batches in groups "
                              f"of --pipeline-model-parallel-size ({pp}): the micro-batches per "
                              f"step (global batch / (micro batch x dp) = {num_microbatches}) "
                              f"must be a multiple of {pp}; change --global-batch-size or "
                              f"--micro-batch-size")

    def data_parallel_size(self, world_size: int) -> int:
        return world_size // (self.tensor_model_parallel_size * self.pipeline_model_parallel_size)


@dataclass
class ModelArgs:
    num_layers: int = flag(4, "Number of transformer layers.", low=1)
    hidden_size: int = flag(64, "Transformer hidden size.", low=1)
    num_attention_heads: int = flag(4, "Number of attention heads.", low=1)
    ffn_hidden_size: Optional[int] = flag(None, "MLP hidden size; default 4 x --hidden-size.",
                                          low=1)
    seq_length: int = flag(128, "Sequence length of each training sample.", low=1)
    max_position_embeddings: Optional[int] = flag(
        None, "Number of learned position embeddings; default --seq-length.", low=1)
    attention_dropout: float = flag(0.1, "Dropout probability in attention.")
    hidden_dropout: float = flag(0.1, "Dropout probability on hidden states.")
    untie_embeddings_and_output_weights: bool = flag(
        False, "Separate output layer instead of reusing the word embedding (not GPT-2 shaped).")
    make_vocab_size_divisible_by: int = flag(
        128, "Pad the vocabulary to a multiple of this times TP (Megatron's rule).", low=1)
    openai_gelu: bool = flag(False, "tanh-approximated GeLU, as OpenAI's GPT-2 (HF 'gelu_new').")
    init_method_std: float = flag(0.02, "Std of the normal weight initialisation.", low=0)
    layernorm_epsilon: float = flag(1e-5, "LayerNorm / RMSNorm epsilon.",
                                    aliases=["--norm-epsilon"])
    bf16: bool = flag(False, "bfloat16 mixed precision (GPU).")
    fp16: bool = flag(False, "float16 mixed precision with loss scaling (GPU).")
    # --- architecture of the seeds' model families (megatron/training/model/architecture.py)
    position_embedding_type: str = flag(
        "learned_absolute", "Position embedding: learned table (GPT-2, OPT) or rotary (Llama, "
        "Qwen, GPT-NeoX, GPT-J).", choices=["learned_absolute", "rope"])
    rotary_percent: float = flag(1.0, "Share of each head's channels that rotary embeddings "
                                      "rotate (GPT-NeoX rotary_pct).")
    rotary_base: float = flag(10000.0, "Rotary base (Hugging Face rope_theta).")
    rotary_interleaved: bool = flag(False, "Rotate interleaved channel pairs (GPT-J) instead of "
                                           "the two halves (Llama, GPT-NeoX).")
    normalization: str = flag("LayerNorm", "Normalisation layers.",
                              choices=["LayerNorm", "RMSNorm"])
    swiglu: bool = flag(False, "SwiGLU MLP: linear_fc1 holds [gate; up], silu(gate) * up "
                               "(Llama, Qwen). Default --ffn-hidden-size becomes Megatron-LM's "
                               "int(8h/3 / 64) * 64.")
    relu: bool = flag(False, "ReLU MLP (OPT).")
    group_query_attention: bool = flag(False, "Grouped-query attention (needs "
                                              "--num-query-groups).")
    num_query_groups: Optional[int] = flag(None, "Key/value heads with "
                                                 "--group-query-attention.")
    disable_bias_linear: bool = flag(False, "No biases in any linear layer (Llama).")
    add_qkv_bias: bool = flag(False, "Keep the query/key/value bias with "
                                     "--disable-bias-linear (Qwen2).")
    disable_bias_attention: bool = flag(False, "No bias in the attention's linear_qkv and "
                                               "linear_proj, MLP biases kept (GPT-J).")
    parallel_residual: bool = flag(False, "Attention and MLP both read the layer input and "
                                          "their outputs are summed (GPT-NeoX "
                                          "use_parallel_residual, GPT-J).")
    parallel_residual_shared_norm: bool = flag(False, "With --parallel-residual, one norm "
                                                      "feeds attention and MLP (GPT-J).")
    output_layer_bias: bool = flag(False, "A bias on the untied output layer (GPT-J lm_head).")

    def __post_init__(self):
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = default_ffn_hidden_size(self.hidden_size, self.swiglu)
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length

    def validate(self, tp: int, pp: int) -> None:
        if self.num_layers % pp:
            raise ConfigError(f"--num-layers ({self.num_layers}) is not divisible by "
                              f"--pipeline-model-parallel-size ({pp})")
        if self.num_attention_heads % tp:
            raise ConfigError(f"--num-attention-heads ({self.num_attention_heads}) is not "
                              f"divisible by --tensor-model-parallel-size ({tp})")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"--hidden-size ({self.hidden_size}) is not divisible by "
                              f"--num-attention-heads ({self.num_attention_heads})")
        if self.hidden_size % tp or self.ffn_hidden_size % tp:
            raise ConfigError(f"--hidden-size ({self.hidden_size}) and --ffn-hidden-size "
                              f"({self.ffn_hidden_size}) must be divisible by "
                              f"--tensor-model-parallel-size ({tp})")
        if self.seq_length > self.max_position_embeddings:
            raise ConfigError(f"--seq-length ({self.seq_length}) exceeds "
                              f"--max-position-embeddings ({self.max_position_embeddings})")
        if self.bf16 and self.fp16:
            raise ConfigError("--bf16 and --fp16 are mutually exclusive; pick one")
        for name in ("attention_dropout", "hidden_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1)")
        self.validate_architecture(tp)

    def validate_architecture(self, tp: int) -> None:
        if sum((self.swiglu, self.relu, self.openai_gelu)) > 1:
            raise ConfigError("--swiglu, --relu and --openai-gelu pick the MLP activation; "
                              "give one")
        if self.group_query_attention != (self.num_query_groups is not None):
            raise ConfigError("--group-query-attention and --num-query-groups go together "
                              "(give both, or neither for one key/value head per query head)")
        groups = self.num_query_groups
        if groups is not None and (groups < 1 or self.num_attention_heads % groups
                                   or groups % tp):
            raise ConfigError(f"--num-query-groups ({groups}) must divide "
                              f"--num-attention-heads ({self.num_attention_heads}) and be "
                              f"divisible by --tensor-model-parallel-size ({tp})")
        head_dim = self.hidden_size // self.num_attention_heads
        if not 0.0 < self.rotary_percent <= 1.0 or int(head_dim * self.rotary_percent) % 2:
            raise ConfigError(f"--rotary-percent ({self.rotary_percent}) must be in (0, 1] and "
                              f"rotate an even number of the {head_dim} channels per head")
        if self.add_qkv_bias and self.disable_bias_attention:
            raise ConfigError("--add-qkv-bias contradicts --disable-bias-attention")
        if self.parallel_residual_shared_norm and not self.parallel_residual:
            raise ConfigError("--parallel-residual-shared-norm needs --parallel-residual")
        if self.output_layer_bias and not self.untie_embeddings_and_output_weights:
            raise ConfigError("--output-layer-bias needs --untie-embeddings-and-output-weights "
                              "(a tied output layer is the embedding, which has no bias)")

    def padded_vocab_size(self, vocab_size: int, tp: int) -> int:
        return padded_vocab_size(vocab_size, self.make_vocab_size_divisible_by, tp)


@dataclass
class TrainingArgs:
    micro_batch_size: int = flag(4, "Samples per micro-batch per data-parallel replica.")
    global_batch_size: int = flag(
        16, "Samples per iteration over all replicas; micro-batches per step = "
            "global / (micro x dp).")
    train_iters: int = flag(100, "Number of training iterations.")
    lr: float = flag(3e-4, "Peak learning rate.")
    min_lr: float = flag(0.0, "Minimum learning rate at the end of decay.")
    lr_decay_style: str = flag("cosine", "Learning rate decay.",
                               choices=["constant", "linear", "cosine", "inverse-square-root"])
    lr_decay_iters: Optional[int] = flag(None, "Iterations to decay over; default --train-iters.")
    lr_warmup_fraction: Optional[float] = flag(
        None, "Fraction of decay iterations used for linear warm-up.")
    lr_warmup_iters: int = flag(0, "Iterations of linear warm-up (use this or the fraction).")
    weight_decay: float = flag(0.01, "Weight decay (AdamW, decoupled).")
    clip_grad: float = flag(1.0, "Gradient clipping by global norm (0 disables).")
    adam_beta1: float = flag(0.9, "Adam beta1.")
    adam_beta2: float = flag(0.999, "Adam beta2.")
    adam_eps: float = flag(1e-8, "Adam epsilon.")
    seed: int = flag(1234, "Random seed. Initial weights depend on it alone, not on the split.",
                     low=0, high=2**32 - 1)
    optimizer: str = flag("adam", "Optimizer: AdamW, SGD with --sgd-momentum, or Muon on the "
                          "hidden weight matrices with AdamW on the rest.",
                          choices=["adam", "sgd", "muon"])
    sgd_momentum: float = flag(0.9, "Momentum of --optimizer sgd.")
    muon_momentum: float = flag(0.95, "Momentum of --optimizer muon's matrices.", low=0.0,
                                high=1.0)
    muon_num_ns_steps: int = flag(5, "Newton-Schulz iterations per --optimizer muon step.",
                                  low=1)
    muon_scale_mode: str = flag(
        "match_rms_adamw", "How --optimizer muon scales an orthogonalised update: "
        "match_rms_adamw (0.2 sqrt(max(rows, cols)), so --lr is AdamW's) or spectral "
        "(max(1, rows/cols)^0.5, Muon's own lr scale).", choices=["match_rms_adamw", "spectral"])

    def validate(self, dp: int) -> None:
        if self.micro_batch_size < 1 or self.global_batch_size < 1 or self.train_iters < 1:
            raise ConfigError("--micro-batch-size, --global-batch-size and --train-iters "
                              "must be >= 1")
        if self.global_batch_size % (self.micro_batch_size * dp):
            raise ConfigError(
                f"--global-batch-size ({self.global_batch_size}) is not divisible by "
                f"--micro-batch-size ({self.micro_batch_size}) x data-parallel size ({dp}) = "
                f"{self.micro_batch_size * dp}")
        if self.lr_warmup_fraction is not None and self.lr_warmup_iters:
            raise ConfigError("--lr-warmup-fraction and --lr-warmup-iters are mutually "
                              "exclusive; give one")
        if self.min_lr > self.lr:
            raise ConfigError(f"--min-lr ({self.min_lr}) exceeds --lr ({self.lr})")
        decay = self.lr_decay_iters or self.train_iters
        warmup = (int(self.lr_warmup_fraction * decay) if self.lr_warmup_fraction is not None
                  else self.lr_warmup_iters)
        if warmup >= decay:
            raise ConfigError(f"learning-rate warm-up ({warmup} iterations from "
                              f"--lr-warmup-iters/--lr-warmup-fraction) must be shorter than the "
                              f"decay (--lr-decay-iters, default --train-iters: {decay})")

    def num_microbatches(self, dp: int) -> int:
        return self.global_batch_size // (self.micro_batch_size * dp)


@dataclass
class DataArgs:
    data_path: Optional[List[str]] = flag(
        None, "Data prefixes of .bin/.idx files, optionally with weights: "
              "'0.7 a_text_document 0.3 b_text_document'. Default: the embedded corpus.")
    split: str = flag("969,30,1", "Train,valid,test split proportions.")
    tokenizer_type: str = flag("GPT2BPETokenizer", "Tokenizer.",
                               choices=["GPT2BPETokenizer", "HuggingFaceTokenizer"])
    vocab_file: Optional[str] = flag(None, "GPT-2 vocab.json (GPT2BPETokenizer).")
    merge_file: Optional[str] = flag(None, "GPT-2 merges.txt (GPT2BPETokenizer).")
    tokenizer_model: Optional[str] = flag(None, "Local tokenizer directory (HuggingFaceTokenizer).")
    data_cache_path: Optional[str] = flag(None, "Where GPTDataset caches its index files.")
    task_name: Optional[str] = flag(
        None, "Fine-tuning data (CocktailSGD / AC-SGD spelling of a weighted --data-path): "
              "comma-separated jsonl files or .bin/.idx prefixes with optional sampling weights, "
              "'a.jsonl:0.5,b.jsonl:1.0' (normalised). A jsonl is tokenised on the fly into "
              "--data-cache-path (or next to it) when no up-to-date .bin/.idx exists.")
    repeat_epoch: bool = flag(
        False, "Build the training split as one pass over its documents and repeat that pass "
               "every epoch (fine-tuning style: a sample keeps its dataset index across "
               "epochs). Default: megatron-core's index of train-iters x global-batch samples, "
               "whose windows shift from epoch to epoch. On by itself with a delta forward "
               "codec or --warmup-epochs.")

    def validate(self) -> None:
        if self.task_name is not None:
            if self.data_path:
                raise ConfigError("--task-name and --data-path both name the training data; "
                                  "give one")
            from megatron.training.data.tasks import parse_task_name
            parse_task_name(self.task_name)
        if self.data_path:
            _check_blend(self.data_path)
            from megatron.training.data.datasets import check_index_file
            for prefix in self.data_path[1::2] if len(self.data_path) > 1 else self.data_path:
                for ext in (".bin", ".idx"):
                    if not os.path.isfile(prefix + ext):
                        raise ConfigError(f"--data-path: {prefix + ext} does not exist; give the "
                                          f"prefix written by tools/preprocess_data.py")
                check_index_file(prefix)
        try:
            parts = [float(x) for x in self.split.replace("/", ",").split(",")]
            assert len(parts) <= 3 and sum(parts) > 0 and min(parts) >= 0
        except (ValueError, AssertionError):
            raise ConfigError(f"--split '{self.split}' must be up to three non-negative "
                              f"numbers like 969,30,1") from None
        if self.data_path is not None or self.vocab_file is not None or self.task_name:
            from megatron.training.data.tokenizer import validate_tokenizer_args
            try:
                validate_tokenizer_args(self.tokenizer_type, self.vocab_file, self.merge_file,
                                        self.tokenizer_model)
            except ValueError as e:
                raise ConfigError(str(e)) from None


def _check_blend(paths: List[str]) -> None:
    if len(paths) == 1:
        return
    if len(paths) % 2:
        raise ConfigError("--data-path with several datasets takes weight-prefix pairs: "
                          "'0.5 a_text_document 0.5 b_text_document'")
    for w in paths[0::2]:
        try:
            float(w)
        except ValueError:
            raise ConfigError(f"--data-path: '{w}' should be a blend weight (a number) "
                              f"followed by a prefix") from None


@dataclass
class CheckpointArgs:
    save: Optional[str] = flag(None, "Directory to save checkpoints to.")
    load: Optional[str] = flag(None, "Directory to load the latest checkpoint from.")
    save_interval: Optional[int] = flag(None, "Iterations between checkpoints.")
    no_load_optim: bool = flag(False, "Do not load optimizer state.")
    no_load_rng: bool = flag(False, "Do not load RNG state.")
    finetune: bool = flag(False, "Load weights only and restart iteration count at 0.")
    exit_interval: Optional[int] = flag(None, "Exit (after saving) at this iteration.")
    # surviving the cluster
    async_save: bool = flag(
        False, "Write checkpoints in the background: snapshot to host memory, write on a "
               "thread, commit once every rank is done; at most one save in flight.")
    keep_last: Optional[int] = flag(
        None, "Keep only the newest N checkpoints in --save (older ones are deleted after a "
              "newer one is committed). Default: keep all.")
    ckpt_fallback: bool = flag(
        False, "If the latest checkpoint in --load is corrupt or incomplete, resume from the "
               "newest earlier one that verifies (with a warning) instead of stopping.")
    trust_checkpoint: bool = flag(
        False, "Load checkpoints with full unpickling (weights_only=False). Only for files you "
               "made: a crafted checkpoint can run code.")
    exit_signal_handler: bool = flag(
        False, "On SIGTERM (Slurm/LSF pre-emption) save a checkpoint of the current iteration "
               "and exit with code 0.")

    def validate(self) -> None:
        if self.keep_last is not None and self.keep_last < 1:
            raise ConfigError(f"--keep-last must be >= 1 (got {self.keep_last})")
        for name in ("async_save", "keep_last", "exit_signal_handler"):
            if getattr(self, name) not in (None, False) and not self.save:
                raise ConfigError(f"--{name.replace('_', '-')} needs --save DIR")


@dataclass
class LoggingArgs:
    log_interval: int = flag(10, "Iterations between log lines.", low=1)
    eval_interval: int = flag(1000, "Iterations between validation runs.")
    eval_iters: int = flag(10, "Validation iterations per evaluation (0: none).", low=0)
    tensorboard_dir: Optional[str] = flag(None, "Write TensorBoard scalars here.")
    experiment_name: Optional[str] = flag(
        None, "Names the run: its log lines go to <--tensorboard-dir or runs>/NAME/log.txt and "
              "its TensorBoard scalars to the same directory (last rank writes).")


GROUPS = [("parallel", ParallelArgs, "distributed"), ("model", ModelArgs, "model"),
          ("training", TrainingArgs, "training"), ("data", DataArgs, "data"),
          ("checkpoint", CheckpointArgs, "checkpointing"), ("logging", LoggingArgs, "logging"),
          # Megatron-LM v2.5 / Optimus-CC script flags (seed_flags.py)
          ("recompute", RecomputeArgs, "activation recomputation"),
          ("compat", CompatArgs, "Megatron-LM v2.5 compatibility"),
          ("gpu", GpuArgs, "GPU, mixed precision and transports")]


@dataclass
class Args:
    """Everything the driver needs, one dataclass per concern."""
    parallel: ParallelArgs
    model: ModelArgs
    training: TrainingArgs
    data: DataArgs
    checkpoint: CheckpointArgs
    logging: LoggingArgs
    compression: "object"  # megatron.cc.config.CompressionConfig
    world_size: int = 1
    recompute: RecomputeArgs = dataclasses.field(default_factory=RecomputeArgs)
    compat: CompatArgs = dataclasses.field(default_factory=CompatArgs)
    gpu: GpuArgs = dataclasses.field(default_factory=GpuArgs)

    @property
    def tp(self) -> int:
        return self.parallel.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.parallel.pipeline_model_parallel_size

    @property
    def dp(self) -> int:
        return self.parallel.data_parallel_size(self.world_size)

    @property
    def num_microbatches(self) -> int:
        return self.training.num_microbatches(self.dp)

    @property
    def sequence_parallel(self) -> bool:
        """--sequence-parallel in effect: at tp 1 there is no group to shard over and Megatron-LM
        turns it off (seed_notes says so at start-up)."""
        return self.parallel.sequence_parallel and self.tp > 1

    @property
    def vp(self) -> int:
        """Model chunks per pipeline rank (interleaved 1F1B when > 1)."""
        return self.parallel.vp

    @property
    def scatter_gather(self) -> bool:
        """Pipeline messages go scattered over the tp ranks (megatron.cc.pipeline.p2p.ScatterGather).
        Not with sequence parallelism: the stage output already is the rank's shard."""
        return self.parallel.scatter_gather_tensors_in_pipeline and self.tp > 1 and \
            self.pp > 1 and not self.sequence_parallel

    @property
    def pipeline_seq_length(self) -> int:
        """Sequence rows of one pipeline message on one tp rank: S/tp with scatter-gather or
        sequence parallelism, else S (the activation caches hold this many rows per sample)."""
        split = self.scatter_gather or self.sequence_parallel
        return self.model.seq_length // (self.tp if split else 1)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(dataclasses.replace(self, compression=None)),
                "compression": self.compression.to_dict()}


def build_parser() -> argparse.ArgumentParser:
    from megatron.cc.config import CompressionConfig
    parser = FlagParser(description="Megatron-style GPT pretraining with communication "
                                    "compression", allow_abbrev=False)
    for _, cls, title in GROUPS:
        add_dataclass_flags(parser, cls, title)
    add_dataclass_flags(parser, CompressionConfig, "communication compression")
    return parser


def parse_args(argv=None, world_size: Optional[int] = None) -> Args:
    """Parse and validate; raises ConfigError naming the offending flag."""
    from megatron.cc.config import CompressionConfig
    ns = build_parser().parse_args(argv)
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args = Args(**{name: from_namespace(cls, ns) for name, cls, _ in GROUPS},
                compression=from_namespace(CompressionConfig, ns), world_size=world_size)
    resolve_sample_based(args, list(argv) if argv is not None else sys.argv[1:])
    validate_args(args)
    return args


def validate_args(args: Args) -> None:
    """Every check that the flags and the world size decide. All of it is cheap (no
    megatron-core import, no process group), so every rank refuses a bad flag in parse_args."""
    for group in [getattr(args, name) for name, _, _ in GROUPS] + [args.compression]:
        check_bounds(group)   # each field's declared low / high first: later checks divide
    args.parallel.validate(args.world_size)
    args.parallel.resolve_virtual(args.model.num_layers)
    validate_seed_flags(args)
    args.model.validate(args.tp, args.pp)
    if args.scatter_gather and args.model.seq_length % args.tp:
        raise ConfigError(f"scatter-gather pipeline sends split the sequence into "
                          f"--tensor-model-parallel-size slices: --seq-length "
                          f"{args.model.seq_length} is not divisible by {args.tp}; change it or "
                          f"add --no-scatter-gather-tensors-in-pipeline")
    validate_sequence_parallel(args)
    args.training.validate(args.dp)
    args.parallel.validate_virtual(args.model.num_layers, args.num_microbatches)
    validate_interleaving(args)
    validate_activation_cache(args)
    args.data.validate()
    from megatron.training.model import subspace_flags
    subspace_flags.validate(args)   # before the generic pipeline checks: names its own fixes
    resolve_sync_rule(args)
    args.compression.validate(pp=args.pp, dp=args.dp, tp=args.tp)
    validate_final_sync(args)
    validate_auto_args(args)
    blend = (args.data.data_path and len(args.data.data_path) > 1) or \
        (args.data.task_name and len([t for t in args.data.task_name.split(",") if t]) > 1)
    if (args.data.repeat_epoch or args.compression.uses_epochs) and blend:
        raise ConfigError("--repeat-epoch, --forward-compress-method delta* and --warmup-epochs "
                          "train in epochs over one dataset (samples keyed by index); a weighted "
                          "--data-path blend has no epochs: give one prefix")
    args.checkpoint.validate()
    if args.checkpoint.save_interval is not None and args.checkpoint.save_interval < 1:
        raise ConfigError("--save-interval must be >= 1")
    if args.checkpoint.save_interval and not args.checkpoint.save:
        raise ConfigError("--save-interval needs --save DIR")
    if args.pp > 1 and args.num_microbatches < 1:
        raise ConfigError("need at least one micro-batch per iteration")
    if (args.model.fp16 or args.model.bf16) and args.compression.syncs_parameters:
        raise ConfigError(f"--dp-mode {args.compression.dp_mode} exchanges fp32 parameters and "
                          f"does not support --fp16/--bf16 yet; train in fp32")
    if args.training.optimizer == "muon":
        validate_muon(args)
    if args.compression.dp_adam_correction and args.training.optimizer != "adam":
        raise ConfigError("--dp-adam-correction corrects Adam's denominator; it has no effect "
                          f"with --optimizer {args.training.optimizer}: drop it")
    if args.model.fp16 or args.model.bf16:
        from megatron.training.runtime.topology import cuda_available
        if not cuda_available():
            raise ConfigError("--fp16/--bf16 need GPUs; on CPU train in fp32 (drop the flag)")
    validate_gpu_args(args)


def validate_muon(args: Args) -> None:
    """Muon orthogonalises whole matrices: no rank may hold a slice of one."""
    if args.tp > 1:
        raise ConfigError("--optimizer muon orthogonalises whole weight matrices, and with "
                          f"--tensor-model-parallel-size {args.tp} each rank holds a slice of "
                          "one; train with --tensor-model-parallel-size 1 or --optimizer adam")
    if args.gpu.use_distributed_optimizer:
        raise ConfigError("--optimizer muon needs each rank to hold whole matrices: drop "
                          "--use-distributed-optimizer")
    if args.model.fp16:
        raise ConfigError("--optimizer muon does not support --fp16's loss scaling; use --bf16 "
                          "or fp32")


def resolve_sync_rule(args: Args) -> None:
    """--diloco-sync-steps lr<p>:<K> -> the K sync steps of equal sum of lr^p under this run's
    learning-rate schedule (megatron-core's scheduler, as training steps it)."""
    from megatron.cc.data_parallel.sync_schedule import equal_lr_windows, parse_rule
    c = args.compression
    rule = parse_rule(c.diloco_sync_steps)
    if rule is None:
        return
    from megatron.training.schedules.lr_schedule import lr_per_iteration   # megatron-core: seconds
    power, syncs = rule
    iters = args.training.train_iters
    if not power > 0 or not 1 <= syncs <= iters:
        raise ConfigError(f"--diloco-sync-steps {c.diloco_sync_steps}: give lr<p>:<K> with "
                          f"p > 0 and 1 <= K <= --train-iters ({iters})")
    lrs = lr_per_iteration(args, args.training.global_batch_size)
    c.diloco_sync_steps = ",".join(str(s) for s in equal_lr_windows(lrs, power, syncs))


def validate_final_sync(args: Args) -> None:
    """--diloco-final-compression (and --diloco-final-average) configure a sync after
    --train-iters: one must happen there (after the schedule is resolved and checked)."""
    from megatron.cc.data_parallel.diloco import DiLoCoLoop
    from megatron.cc.data_parallel.diloco_sync import DiLoCoSync
    c, iters = args.compression, args.training.train_iters
    if c.dp_mode != "diloco" or not (c.diloco_final_compression or c.diloco_final_average):
        return
    what = (f"--diloco-final-compression {c.diloco_final_compression} is the codec"
            if c.diloco_final_compression else "--diloco-final-average is the outer step")
    if not DiLoCoSync.due(DiLoCoLoop.schedule(c), iters):
        raise ConfigError(f"{what} of the sync after the last iteration, but none falls after "
                          f"--train-iters {iters}: make it a multiple of --diloco-inner-steps "
                          f"or the last of --diloco-sync-steps")


def validate_activation_cache(args: Args) -> None:
    """A --max-activation-cache-size given below one micro-batch (the default size depends on
    the data and is checked when the caches are built, pipeline_codecs.cache_capacity)."""
    c, mbs = args.compression, args.training.micro_batch_size
    n = c.max_activation_cache_size
    if c.activation_cache and n is not None and n < mbs:
        raise ConfigError(f"--max-activation-cache-size {n} is smaller than one micro-batch "
                          f"(--micro-batch-size {mbs})")


def validate_sequence_parallel(args: Args) -> None:
    """--sequence-parallel's combinations (at tp 1 it is off: nothing to check)."""
    if not args.sequence_parallel:
        return
    if args.model.seq_length % args.tp:
        raise ConfigError(f"--sequence-parallel shards the sequence over the "
                          f"--tensor-model-parallel-size ({args.tp}) ranks: --seq-length "
                          f"{args.model.seq_length} is not divisible by {args.tp}; change it or "
                          f"drop --sequence-parallel")
    if args.pp > 1 and not args.parallel.scatter_gather_tensors_in_pipeline:
        raise ConfigError("--no-scatter-gather-tensors-in-pipeline sends the whole (S, B, H) "
                          "message from every tp rank, but with --sequence-parallel a stage's "
                          "output is the rank's (S/tp, B, H) shard and the next stage takes "
                          "the shard: drop one of the two flags")
    if args.recompute.distribute_checkpointed_activations:
        raise ConfigError("--distribute-checkpointed-activations splits stored activations "
                          "over the tp ranks, which --sequence-parallel already does "
                          "(megatron-core allows only one): drop one of the two flags")
    if args.compression.mp_grad_comp:
        raise ConfigError(
            "--mp-grad-comp with --sequence-parallel: the column-parallel layers then "
            "reduce-scatter their input gradient inside megatron-core's linear backward, which "
            "re-gathers the sequence-sharded input for the weight gradient instead of keeping "
            "it; taking that reduce-scatter out to compress it would keep the gathered input "
            "(the memory sequence parallelism saves), and PowerSGD's factors of a "
            "reduce-scatter are all-reduced whole, which halves its gain. Drop --mp-grad-comp "
            "(--mp-acti-comp works with --sequence-parallel) or --sequence-parallel")


def validate_interleaving(args: Args) -> None:
    """What interleaved 1F1B does not compose with (each refused by name)."""
    if args.vp == 1:
        return
    vp = f"--virtual-pipeline-model-parallel-size {args.vp}"
    refused = [
        (args.compat.pp_mode == "gpipe", "--pp-mode gpipe",
         "GPipe runs every forward before any backward: there is nothing to interleave; use "
         "--pp-mode 1f1b"),
        (args.compat.rampup_batch_size is not None, "--rampup-batch-size",
         "the ramp changes the micro-batches per step, which interleaving needs to stay a "
         "multiple of pp"),
        (args.compression.compression == "auto", "--compression auto",
         "the planner models plain 1F1B only; give the compression flags by hand"),
        (args.compression.check_orth_error_acti, "--check-orth-error-acti",
         "the diagnostic watches one stage boundary; run it without interleaving"),
    ]
    for bad, name, why in refused:
        if bad:
            raise ConfigError(f"{name} with {vp}: {why}")
