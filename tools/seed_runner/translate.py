"""The seeds' runner flags -> pretrain_gpt.py's argv (plus notes on what was mapped how).

Each mapping is one line here; what has no counterpart raises RunnerError naming the flag and
what to use instead. The data-dependent conversions (epochs -> iterations) need the prepared
task files, so `translate` runs after prepare.task_prefixes.
"""
import functools
import os
from typing import List, Tuple

from tools.seed_runner.prepare import RunnerError, train_samples_per_epoch

FORWARD_METHODS = {"tha": "tah"}   # TAH-Quant README's spelling


@functools.lru_cache(maxsize=1)
def _trainer_actions() -> dict:
    from megatron.training.flags.arguments import build_parser
    return dict(build_parser()._option_string_actions)


def trainer_flags() -> set:
    """Every option string pretrain_gpt.py accepts."""
    return set(_trainer_actions())


def topology(a) -> Tuple[int, int]:
    """(pp, dp) from the seeds' group sizes; the seeds have no tensor parallelism."""
    dp = a.data_group_size
    pp = a.pipeline_group_size or a.world_size // max(dp, 1)
    if pp * dp != a.world_size:
        raise RunnerError(f"--world-size {a.world_size} != --pipeline-group-size {pp} x "
                          f"--data-group-size {dp}; launch pp x dp processes")
    return pp, dp


def model_argv(a, model_args: dict, pp: int) -> List[str]:
    """Model flags from the imported checkpoint, checked against the seeds' own flags."""
    m = model_args["model"]
    checks = (("--num-layers (per stage) x --pipeline-group-size", a.num_layers and
               a.num_layers * pp, m["num_layers"]),
              ("--num-heads", a.num_heads, m["num_attention_heads"]),
              ("--embedding-dim", a.embedding_dim, m["hidden_size"]))
    for flag, given, have in checks:
        if given and given != have:
            raise RunnerError(f"{flag} = {given}, but --model-name {a.model_name} has {have}; "
                              f"give the model's own sizes")
    if m["num_layers"] % pp:
        raise RunnerError(f"--model-name has {m['num_layers']} layers, not divisible by "
                          f"--pipeline-group-size {pp}")
    # every architecture flag the checkpoint needs (OPT's --relu, Llama's rope/RMSNorm/swiglu,
    # ...), as import_hf.py prints them; the sequence length is the runner's
    from tools.checkpoint.import_hf import model_flags
    flags = model_flags(model_args).split()
    argv: List[str] = []
    i = 0
    while i < len(flags):
        name = flags[i]
        value = [] if i + 1 == len(flags) or flags[i + 1].startswith("--") else [flags[i + 1]]
        i += 1 + len(value)
        if name == "--seq-length":
            continue
        if name == "--max-position-embeddings":
            value = [str(max(int(value[0]), a.seq_length))]
        argv += [name] + value
    return argv


def schedule_argv(a, data_path: List[str], global_batch: int, notes: List[str]) -> List[str]:
    """Epochs, steps and warm-ups -> iterations."""
    samples = train_samples_per_epoch(data_path, a.split, a.seq_length)
    per_epoch = samples // global_batch
    if per_epoch < 1:
        raise RunnerError(f"--task-name {a.task_name}: one epoch of the training split holds "
                          f"{samples} samples of {a.seq_length} tokens, fewer than one batch "
                          f"({global_batch}); use more data or a smaller --batch-size")
    iters = a.total_steps if a.total_steps is not None else a.n_epochs * per_epoch
    if a.num_iters is not None and a.num_iters < iters:
        iters = a.num_iters
    warm = a.warmup_steps if a.warmup_steps is not None else per_epoch
    if warm >= iters:
        notes.append(f"learning-rate warm-up {warm} iterations >= training ({iters}); "
                     f"shortened to {iters - 1}")
        warm = iters - 1
    notes.append(f"{per_epoch} iterations per epoch ({samples} samples / global batch "
                 f"{global_batch}); --train-iters {iters}")
    argv = ["--train-iters", iters, "--lr-warmup-iters", warm, "--lr-decay-style", "linear",
            "--min-lr", 0.0]
    if a.do_evaluation:
        argv += ["--eval-interval", per_epoch, "--eval-iters", 2]
    else:
        argv += ["--eval-interval", 0, "--eval-iters", 0]
    argv += ["--log-interval", max(1, min(10, per_epoch))]
    return [str(x) for x in argv]


def compression_argv(a, notes: List[str]) -> List[str]:
    fwd = FORWARD_METHODS.get(a.forward_compress_method, a.forward_compress_method)
    bwd = a.backward_compress_method
    for flag, value, only in (("--forward-scale-method", a.forward_scale_method, "max"),
                              ("--backward-scale-method", a.backward_scale_method, "max")):
        if value != only:
            raise RunnerError(f"{flag} {value}: quantisers here scale by the max of each hidden "
                              f"channel; use {flag} {only}")
    for flag, value in (("--forward-scale-dims", a.forward_scale_dims),
                        ("--backward-scale-dims", a.backward_scale_dims)):
        if value.replace(" ", "") != "(0,1)":
            raise RunnerError(f"{flag} {value}: only (0,1) (one scale per hidden channel over "
                              f"sequence and batch) exists; use {flag} '(0,1)'")
    argv = ["--forward-compress-method", fwd, "--backward-compress-method", bwd]
    compressing = fwd != "none" or bwd != "none"
    warm = a.warmup_epochs
    if warm is None:
        warm = 1.0 if compressing else 0.0    # AC-SGD's default of 1 epoch, where it matters
    if warm and not compressing:
        notes.append(f"--warmup-epochs {warm} dropped: no compression method to warm up")
    elif warm:
        argv += ["--warmup-epochs", warm]
    if a.dp_bits is not None:
        raise RunnerError("--dp-bits quantises AC-SGD's sharded parameter-server dp exchange, "
                          "which has no counterpart; drop it (dp gradients: --grad-comp; "
                          "compressed dp exchange: --dp-mode cocktail_sgd)")
    return [str(x) for x in argv]


def dp_argv(a, notes: List[str]) -> List[str]:
    argv = []
    if a.dp_mode != "allreduce":
        modes = _choices("--dp-mode")
        if a.dp_mode not in modes:
            raise RunnerError(f"--dp-mode {a.dp_mode}: pretrain_gpt.py's data-parallel modes are "
                              f"{', '.join(modes)}")
        argv += ["--dp-mode", a.dp_mode]
    argv += cocktail_env_argv(a, notes)
    if a.dp_backend is not None:
        backend = {"cupy_nccl": "nccl"}.get(a.dp_backend, a.dp_backend)
        if backend not in _choices("--dp-backend"):
            raise RunnerError(f"--dp-backend {a.dp_backend}: expected "
                              f"{' or '.join(_choices('--dp-backend'))}")
        argv += ["--dp-backend", backend]
    if a.train_warmup_steps:
        raise RunnerError(f"--train-warmup-steps {a.train_warmup_steps} has no counterpart; "
                          f"drop it (pipeline codecs: --warmup-epochs; CocktailSGD's "
                          f"uncompressed start: --cocktail-warmup-steps)")
    return argv


def _choices(flag: str) -> List[str]:
    return list(_trainer_actions()[flag].choices)


COCKTAIL_ENV = (("QUANT_BITS", "--cocktail-bits"), ("TOPK_RATIO", "--cocktail-topk-ratio"),
                ("RANDOMP_RATIO", "--cocktail-random-ratio"))


def cocktail_env_argv(a, notes: List[str]) -> List[str]:
    """CocktailSGD's scripts set its ratios in the environment (QUANT_BITS, TOPK_RATIO,
    RANDOMP_RATIO); they become the --cocktail-* flags (an explicit flag on the command line
    comes later and wins)."""
    argv = []
    cocktail = a.dp_mode in ("cocktail_sgd", "cocktail")
    for env, flag in COCKTAIL_ENV:
        if env not in os.environ:
            continue
        if cocktail:
            argv += [flag, os.environ[env]]
        else:
            notes.append(f"{env}={os.environ[env]} ignored: only --dp-mode cocktail_sgd reads it")
    return argv


def precision_argv(a, known: set, notes: List[str]) -> List[str]:
    argv = ["--fp16"] if a.fp16 else []
    for flag in ("--loss-scale", "--initial-loss-scale", "--min-loss-scale",
                 "--loss-scale-window", "--hysteresis"):
        value = getattr(a, flag[2:].replace("-", "_"))
        if value is None:
            continue
        if not a.fp16:
            notes.append(f"{flag} ignored: no --fp16")
        elif flag in known:
            argv += [flag, repr(value) if flag != "--hysteresis" else str(int(value))]
        else:
            raise RunnerError(f"{flag}: this pretrain_gpt.py has no loss-scaling flags; drop "
                              f"it (megatron-core's dynamic loss scaler runs with --fp16)")
    return argv


def misc_checks(a, notes: List[str]) -> None:
    if a.task_type != "language_model":
        raise RunnerError(f"--task-type {a.task_type}: only language_model exists here")
    if a.optimizer.lower() not in ("adam", "adamw", "sgd"):
        raise RunnerError(f"--optimizer {a.optimizer}: only adam (AdamW) and sgd exist here")
    if a.project_name:
        notes.append(f"--project-name {a.project_name}: no Weights & Biases logging; the log "
                     f"lines and --tensorboard-dir carry the metrics")


def global_batch(a, dp: int) -> int:
    if a.batch_size % a.micro_batch_size:
        raise RunnerError(f"--batch-size {a.batch_size} is not a multiple of "
                          f"--micro-batch-size {a.micro_batch_size}")
    return a.batch_size * dp * a.gradient_accumulate_step


def learning_argv(a, dp: int) -> List[str]:
    argv = ["--micro-batch-size", a.micro_batch_size,
            "--global-batch-size", global_batch(a, dp), "--lr", a.lr, "--seed", a.seed,
            "--seq-length", a.seq_length, "--pp-mode", a.pp_mode,
            "--tensor-model-parallel-size", 1, "--split", a.split,
            "--optimizer", "sgd" if a.optimizer.lower() == "sgd" else "adam"]
    if a.checkpoint_path:
        argv += ["--save", a.checkpoint_path]
        if a.checkpoint_steps:
            argv += ["--save-interval", a.checkpoint_steps]
    return [str(x) for x in argv]
