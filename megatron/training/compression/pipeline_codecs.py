"""This stage's pipeline link ends, finished by the pp-fwd / pp-bwd registries
(megatron/cc/pipeline/): the driver only says which link it is (peer, sender, chunk) and
what the run contributes. Both ends of a link build the same codec from the same config and
sender, so their codecs (and activation caches) start identical.

What the data pipeline contributes is `epoch_samples`: samples in one pass over the training
split (whole global batches). It converts --warmup-epochs to iterations and sizes the default
activation cache: every distinct sample one data-parallel replica will see.
"""
import os
from typing import Optional

from megatron.cc.codecs import CacheTooLarge
from megatron.cc.codecs.delta import mem_available
from megatron.cc.pipeline.p2p import Link
from megatron.cc.pipeline.registry import LinkEnd, pp_codec, pp_link
from megatron.training.config.config_flags import ConfigError
from megatron.training.runtime.nodes import spans_nodes


def warmup_iters(args, epoch_samples: Optional[int]) -> int:
    """Iterations whose pipeline messages go uncompressed (--compress-warmup-iters / -epochs)."""
    per_epoch = None if epoch_samples is None else epoch_samples // args.training.global_batch_size
    return args.compression.compress_warmup.iters(per_epoch)


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


def _spec(args, channel: str, seed: int, **kw) -> LinkEnd:
    """Sequence rows of a message: S, or S / tp with scatter-gather or sequence parallelism
    (the activation caches hold this rank's slice or shard of each sample)."""
    return LinkEnd(channel, seed=seed, sample_shape=(args.pipeline_seq_length,
                                                      args.model.hidden_size), **kw)


def forward_codec(args, capacity: int, seed: int, ram_limit: Optional[int], device=None):
    """The activation codec of one fwd link end, or None; `device`: where activations arrive."""
    return pp_codec(args.compression, "pp-fwd",
                    _spec(args, "pp-fwd", seed, capacity=capacity, ram_limit=ram_limit,
                          device=device))


def _seed(args, sender_rank: int, channel: str, sender_chunk: int = 0) -> int:
    """Stochastic-rounding seed of one link: both ends know its sender's global rank (and,
    interleaved, the sender's model chunk: each chunk boundary draws its own stream)."""
    return (args.training.seed + 7919 * sender_rank + (1 if channel == "pp-bwd" else 0)
            + 1000003 * sender_chunk)


class StageLinks:
    """Makes this rank's pipeline link ends. `num_caches`: its fwd link ends over all model
    chunks (each activation cache may take an equal share of the node's free RAM)."""

    def __init__(self, args, topo, comp_seed: int, epoch_samples=None, nodes=None,
                 num_caches: int = 1, speed=None):
        self.args, self.topo, self.nodes = args, topo, nodes
        c = args.compression
        avail = mem_available() if c.activation_cache else None
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.common = dict(
            comp_seed=comp_seed, device=topo.device, warmup_iters=warmup_iters(args, epoch_samples),
            capacity=cache_capacity(args, epoch_samples) if c.activation_cache else 1,
            ram_limit=None if avail is None else avail // max(1, local * num_caches),
            pp=args.pp, vp=args.vp, num_microbatches=args.num_microbatches,
            train_iters=args.training.train_iters, speed=speed)

    def __call__(self, key: str, peer: int, sender_stage: int, sender_chunk: int = 0,
                 tag: int = 0) -> Link:
        """The end `key` (prev_fwd, prev_bwd, next_fwd, next_bwd) of the link to `peer`, whose
        sender is (stage, model chunk) (sender_stage, sender_chunk)."""
        args, me = self.args, self.topo.rank
        channel = "pp-fwd" if key.endswith("fwd") else "pp-bwd"
        sender = me if key in ("next_fwd", "prev_bwd") else peer
        role = "sender" if sender == me else "receiver"
        spec = _spec(args, channel, _seed(args, sender, channel, sender_chunk), peer=peer,
                     sender_stage=sender_stage, sender_chunk=sender_chunk, tag=tag,
                     leaves_node=spans_nodes(self.nodes, (me, peer)), **self.common)
        try:
            link = pp_link(args.compression, spec)
        except CacheTooLarge as e:
            raise ConfigError(f"[rank {me}] stage {self.topo.pp_rank} {channel} {role} end: "
                              f"{e}") from None
        codec = link.codec if channel == "pp-fwd" else None
        described = codec.describe() if codec is not None else None
        if described is not None:
            peer_ = f"{'to' if role == 'sender' else 'from'} rank {peer}"
            print(f"[rank {me}] pp-fwd {peer_} ({role}): {described}", flush=True)
        return link
