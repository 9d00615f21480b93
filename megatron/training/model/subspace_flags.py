"""The flags of the subspace-constrained model (megatron/training/model/subspace.py): what they
ask for and the combinations that cannot work. Apart from the model so that parse_args checks
them without importing megatron-core."""
from typing import Optional

from megatron.cc.pipeline.subspace import Subspace, default_write_scale
from megatron.training.config.config_flags import ConfigError


def sends_coefficients(args) -> bool:
    """--forward-compress-method subspace: stage boundaries carry coefficients."""
    return args.compression.forward_compress_method == "subspace"


def rank(args) -> Optional[int]:
    """k of the constrained model, or None (the ordinary model)."""
    return Subspace.rank(args.compression, args.model.hidden_size)


def bits(args) -> int:
    return Subspace.bits(args.compression)


def write_scale(args) -> float:
    """a of W_eff = a U U^T W for a fresh model (a checkpoint brings its own)."""
    return Subspace.write_scale(args.compression, args.model.hidden_size)


def constrain_kind(args) -> str:
    """writes, boundary or learned: --subspace-constrain as given or its default."""
    return Subspace.constrain(args.compression)


def constrains_writes(args) -> bool:
    """Every block's write is projected (else only the stage boundary is)."""
    return constrain_kind(args) == "writes"


def pipeline_width(args) -> int:
    """Last dim of a pipeline message: k coefficients, or H."""
    return rank(args) if sends_coefficients(args) else args.model.hidden_size


def validate(args) -> None:
    """The combinations that cannot work, each named with its fix (no side effects)."""
    c, k = args.compression, rank(args)
    method = "--forward-compress-method subspace"
    if not sends_coefficients(args) and c.subspace_bits is not None:
        raise ConfigError(f"--subspace-bits sets the coefficients' bits of {method}, but "
                          f"--forward-compress-method is {c.forward_compress_method}")
    mode = f"--subspace-constrain {constrain_kind(args)}"
    if not constrains_writes(args) and not sends_coefficients(args):
        raise ConfigError(f"{mode} projects what crosses a stage boundary; give {method} too")
    if k is None:
        if c.subspace_write_scale is not None:
            raise ConfigError("--subspace-write-scale scales the subspace model's writes; give "
                              "--subspace-rank K or --forward-compress-method subspace too")
        return
    h = args.model.hidden_size
    who = f"--subspace-rank {k}"
    if not 1 <= k <= h:   # first: the default write scale is computed from k
        raise ConfigError(f"{who}: the subspace rank must be in 1..--hidden-size ({h})")
    if not write_scale(args) > 0:
        raise ConfigError(f"--subspace-write-scale {c.subspace_write_scale}: must be > 0 "
                          f"(default sqrt(k / --hidden-size) = {default_write_scale(k, h):.4g})")
    if not 0 <= bits(args) <= 8:
        raise ConfigError(f"--subspace-bits {bits(args)}: 0 (unquantised) or 1..8")
    if args.model.hidden_dropout:
        raise ConfigError(f"{who} needs --hidden-dropout 0 (got {args.model.hidden_dropout}): "
                          f"dropout on a block's output or on the embedding moves the residual "
                          f"stream off the subspace, and the next stage could not rebuild it")
    if args.sequence_parallel:
        raise ConfigError(f"{who} with --sequence-parallel: the constrained model's stage "
                          f"boundary is not built for sequence shards yet; drop "
                          f"--sequence-parallel")
    if args.vp > 1:
        raise ConfigError(f"{who} with --virtual-pipeline-model-parallel-size {args.vp}: "
                          f"interleaved chunks are not built for it yet; drop the flag")
    if not constrains_writes(args) and c.subspace_write_scale is not None:
        raise ConfigError(f"--subspace-write-scale scales the projected writes; with {mode} "
                          f"no write is projected: drop it, or give --subspace-constrain writes")
    if not sends_coefficients(args):
        return
    if args.pp == 1:
        raise ConfigError(f"{method} sends coefficients between pipeline stages; at "
                          f"--pipeline-model-parallel-size 1 there are none: give "
                          f"--subspace-rank {k} alone for the constrained model")
    if c.compress_warmup.amount:
        raise ConfigError(f"{method} has no uncompressed warm-up: the stage boundary carries "
                          f"coefficients from the first step (the model is built that way); "
                          f"drop --compress-warmup-iters / --warmup-epochs (--subspace-bits 0 "
                          f"sends them unquantised)")
    if c.check_orth_error_acti:
        raise ConfigError(f"--check-orth-error-acti watches CB's error buffer; {method} has "
                          f"none: drop it")
