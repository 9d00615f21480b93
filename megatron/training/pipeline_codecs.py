"""Wiring of the AC-SGD / TAH-Quant codecs onto this stage's pipeline links.

`build_pipeline_channels` (channels.py) makes the four links of a stage; `attach_codecs` then
gives every fwd link end its activation codec (fixpoint | delta | delta-lowbits | tah) and
every bwd link end its gradient codec when that is fixpoint (CB's lowrank codec is built by
channels.py), with the AC-SGD warm-up on both directions. Both ends of a link run this same
code with the same config, so their codecs (and activation caches) start identical.

What the data pipeline contributes is `epoch_samples`: samples in one pass over the training
split (whole global batches). It converts --warmup-epochs to iterations and sizes the default
activation cache: every distinct sample one data-parallel replica will see.
"""
import math
import os
from typing import Dict, Optional

from megatron.cc.compress import CacheTooLarge, get_codec
from megatron.cc.compress.delta import mem_available
from megatron.cc.p2p import Link
from megatron.cc.policy import WarmupPolicy
from megatron.training.config_flags import ConfigError


def warmup_iters(args, epoch_samples: Optional[int]) -> int:
    """Iterations whose pipeline messages go uncompressed (--compress-warmup-iters / -epochs)."""
    c = args.compression
    if not c.warmup_epochs:
        return c.compress_warmup_iters
    if epoch_samples is None:
        raise ConfigError("--warmup-epochs needs the size of the training split; give "
                          "--compress-warmup-iters instead")
    iters_per_epoch = epoch_samples // (args.training.global_batch_size)
    return math.ceil(c.warmup_epochs * iters_per_epoch)


def cache_capacity(args, epoch_samples: Optional[int]) -> int:
    """Samples per activation cache: the flag, else all samples one replica will see."""
    c, t = args.compression, args.training
    if c.max_activation_cache_size is not None:
        n = c.max_activation_cache_size
    else:
        seen = t.train_iters * t.global_batch_size
        if epoch_samples is not None:
            seen = min(seen, epoch_samples)
        n = max(1, seen // args.dp)
    if n < t.micro_batch_size:
        raise ConfigError(f"--max-activation-cache-size {n} is smaller than one micro-batch "
                          f"(--micro-batch-size {t.micro_batch_size})")
    return n


def slice_seq_length(args) -> int:
    """Sequence rows of one link's message: S, or S / tp with scatter-gather or sequence
    parallelism (the activation caches hold this rank's slice or shard of each sample)."""
    return args.pipeline_seq_length


def forward_codec(args, capacity: int, seed: int, ram_limit: Optional[int], device=None):
    """The activation codec of one fwd link end, or None; `device`: where activations arrive."""
    c = args.compression
    method = c.forward_compress_method
    if method == "none":
        return None
    if method == "fixpoint":
        return get_codec("fixpoint", bits=c.forward_bits, granularity="channel",
                         stochastic=c.stochastic_rounding, seed=seed, scheme=c.quant_scheme)
    if method == "tah":
        return get_codec("tah", tile_size=c.tile_size, high_bits=c.high_precision_bits,
                         low_bits=c.low_precision_bits,
                         high_ratio=c.high_precision_allocation_ratio)
    kw = dict(bits=c.forward_bits, capacity=capacity,
              sample_shape=(slice_seq_length(args), args.model.hidden_size),
              storage=c.activation_cache_location, ram_limit_bytes=ram_limit,
              stochastic=c.stochastic_rounding, seed=seed, device=device,
              scheme=c.quant_scheme)
    if method == "delta-lowbits":
        kw["bits_act"] = c.forward_bits_act
    else:
        kw["cache_dtype"] = c.activation_cache_dtype
    return get_codec(method, **kw)


def fixpoint_backward_codec(args, seed: int):
    """Direct b-bit quantisation of activation gradients (AC-SGD / TAH-Quant backward)."""
    c = args.compression
    tiled = c.backward_tile_size is not None
    return get_codec("fixpoint", bits=c.backward_bits, granularity="tile" if tiled else "channel",
                     group_size=c.backward_tile_size or 128, stochastic=c.stochastic_rounding,
                     seed=seed, scheme=c.quant_scheme)


def _seed(args, sender_rank: int, channel: str, sender_chunk: int = 0) -> int:
    """Stochastic-rounding seed of one link: both ends know its sender's global rank (and,
    interleaved, the sender's model chunk: each chunk boundary draws its own stream)."""
    return (args.training.seed + 7919 * sender_rank + (1 if channel == "pp-bwd" else 0)
            + 1000003 * sender_chunk)


def _ram_limit(n_caches: int) -> Optional[int]:
    """Each cache may take an equal share of this node's free RAM (local ranks x caches)."""
    avail = mem_available()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return None if avail is None else avail // max(1, local * n_caches)


def attach_codecs(args, links: Dict[str, Link], topo, epoch_samples: Optional[int] = None,
                  sender_chunks: Optional[Dict[str, int]] = None,
                  num_caches: Optional[int] = None) -> None:
    """Give this stage's link ends their AC-SGD / TAH codecs and warm-up policies (in place).

    Interleaved, this runs once per model chunk: `sender_chunks` maps each link to the model
    chunk of its sender (seeds), `num_caches` is the rank's fwd link ends over all chunks
    (the RAM share of each activation cache). Raises ConfigError naming the link when an
    activation cache does not fit.
    """
    if args.compression.forward_compress_method == "subspace":
        from megatron.training import subspace
        return subspace.attach_codecs(args, links)   # both directions, no warm-up
    chunk_of = sender_chunks or {}
    c = args.compression
    rank, me = topo.pp_rank, topo.rank
    warm = warmup_iters(args, epoch_samples)
    fwd_links = [k for k in ("prev_fwd", "next_fwd") if k in links]
    capacity = cache_capacity(args, epoch_samples) if c.activation_cache else 0
    ram_limit = _ram_limit(num_caches or len(fwd_links)) if c.activation_cache else None
    for key in fwd_links:
        link = links[key]
        sender = me if key == "next_fwd" else link.peer
        role = "sender" if key == "next_fwd" else "receiver"
        try:
            link.codec = forward_codec(args, capacity,
                                       _seed(args, sender, "pp-fwd", chunk_of.get(key, 0)),
                                       ram_limit, topo.device)
        except CacheTooLarge as e:
            raise ConfigError(f"[rank {me}] stage {rank} pp-fwd {role} end: {e}") from None
        link.policy = WarmupPolicy(warm) if warm else None
        described = link.codec.describe() if link.codec is not None else None
        if described is not None:
            peer = f"{'to' if role == 'sender' else 'from'} rank {link.peer}"
            print(f"[rank {me}] pp-fwd {peer} ({role}): {described}", flush=True)
    for key in ("prev_bwd", "next_bwd"):
        link = links.get(key)
        if link is None:
            continue
        sender = me if key == "prev_bwd" else link.peer
        if c.backward_compress_method == "fixpoint":
            link.codec = fixpoint_backward_codec(
                args, _seed(args, sender, "pp-bwd", chunk_of.get(key, 0)))
            link.policy = WarmupPolicy(warm) if warm else None
        elif link.codec is not None and warm:  # CB: also uncompressed during the warm-up
            link.policy.warmup_iters = max(link.policy.warmup_iters, warm)

