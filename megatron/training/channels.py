"""Wiring: build this rank's communication channels from the parsed arguments.

The only place where flags meet megatron.cc: it picks codecs and modes from the
CompressionConfig, takes process groups and peers from the rank's Topology, and hands both
to the library's constructors.
"""
from megatron.cc.compress import get_codec
from megatron.cc.dp_modes import DpRun, build_dp_channel
from megatron.cc.grad_sync import (EmbeddingSync, FusedEmbeddingSync, GradSync,
                                   create_fused_embedding_group)
from megatron.cc.grad_sync.emb_powersgd import EmbPowerSGDSync
from megatron.cc.diagnostics import OrthogonalityProbe
from megatron.cc.p2p import InterleavedChannels, Link, PipelineChannels, ScatterGather
from megatron.cc.policy import BackwardCompressionPolicy
from megatron.cc.speed import CompSpeed, TimedCodec
from megatron.training.initialize import group_timeout
from megatron.training.nodes import spans_nodes
from megatron.training.pipeline_codecs import attach_codecs
from megatron.training import subspace
from megatron.training.transports import pipeline_transport


def activation_shape(args):
    """(S, B, H): what a stage outputs and the next takes, in Megatron's seq-first layout;
    with --sequence-parallel the rank's (S/tp, B, H) shard, sent as it is (no scatter-gather)."""
    seq = args.pipeline_seq_length if args.sequence_parallel else args.model.seq_length
    # H, or k subspace coefficients (--forward-compress-method subspace)
    return (seq, args.training.micro_batch_size, subspace.pipeline_width(args))


def scatter_gather(args, topo):
    """This rank's slice of every pipeline message at tp > 1 (None: whole messages).

    The library takes the tensor-parallel group, rank and size from here; see
    megatron.cc.p2p.ScatterGather for why the slices are along the sequence. With sequence
    parallelism (args.scatter_gather is False then) the message already is the shard."""
    if not args.scatter_gather:
        return None
    return ScatterGather(topo.tp_group, topo.tp_rank, topo.tp_size)


# --inter-grad-comp-type -> the registered codec that implements it (same keyword arguments)
CB_CODECS = {"PowerSGD": "lowrank", "RandomizedSVD": "rsvd"}


def comp_seed(args) -> int:
    """The low-rank compressors' seed: --comp-seed, else --seed."""
    c = args.compression
    return c.comp_seed if c.comp_seed is not None else args.training.seed


def speed_meter(args, stats):
    """--check-comp-speed: the rank's codec timer (None when off)."""
    return CompSpeed(stats) if args.compression.check_comp_speed else None


def backward_codec(c, seed: int):
    """CB codec for one end of a bwd link, or None (uncompressed)."""
    if not c.compressed_backprop:
        return None
    return get_codec(CB_CODECS[c.inter_grad_comp_type], rank=c.cb_rank,
                     error_feedback=c.use_error_feedback,
                     payload_dtype=c.inter_grad_comp_dtype, seed=seed,
                     flush_on_uncompressed=c.lep_flush_on_uncompressed,
                     power_iters=c.inter_grad_comp_power_iters)


def backward_policy(args, sender_stage: int, sender_chunk: int = 0) -> BackwardCompressionPolicy:
    c = args.compression
    return BackwardCompressionPolicy(
        sender_stage=sender_stage, pp=args.pp, num_microbatches=args.num_microbatches,
        warmup_iters=int(c.inter_grad_comp_warm_up * args.training.train_iters),
        epilogue_only=c.inter_grad_comp_epilogue_only, sender_chunk=sender_chunk, vp=args.vp)


def build_pipeline_channels(args, config, stats, topo, epoch_samples=None, nodes=None):
    """This stage's ends of the fwd/bwd links; both ends of a link build identical codecs.

    `epoch_samples`: samples in one pass over the training split (--warmup-epochs and the
    default activation-cache size need it). `nodes`: every rank's node (nodes.node_of_ranks),
    for counting what leaves the node apart; None: one node. Interleaved (vp > 1): one
    PipelineChannels per model chunk, in an InterleavedChannels.
    """
    if args.vp > 1:
        return build_interleaved_channels(args, config, stats, topo, epoch_samples, nodes)
    stage, first, last = topo.pp_rank, topo.is_first, topo.is_last
    c, seed = args.compression, comp_seed(args)
    links = {}
    if args.pp > 1:
        prev, nxt, me = topo.prev_rank, topo.next_rank, topo.rank
        if not first:
            out = spans_nodes(nodes, (me, prev))
            links["prev_fwd"] = Link("pp-fwd", prev, leaves_node=out)
            links["prev_bwd"] = Link("pp-bwd", prev, backward_codec(c, seed),
                                     backward_policy(args, sender_stage=stage), leaves_node=out)
        if not last:
            out = spans_nodes(nodes, (me, nxt))
            links["next_fwd"] = Link("pp-fwd", nxt, leaves_node=out)
            links["next_bwd"] = Link("pp-bwd", nxt, backward_codec(c, seed),
                                     backward_policy(args, sender_stage=stage + 1),
                                     leaves_node=out)
    attach_codecs(args, links, topo, epoch_samples)   # AC-SGD / TAH-Quant codecs and warm-up
    channels = _channels(args, config, stats, topo, links)
    if c.check_orth_error_acti and last and not first:
        channels.probe = OrthogonalityProbe(stats)
    return channels


def _channels(args, config, stats, topo, links, transport=None) -> PipelineChannels:
    speed = speed_meter(args, stats)
    for link in links.values():
        if speed is not None and link.codec is not None:
            link.codec = TimedCodec(link.codec, speed, link.channel)
    return PipelineChannels(activation_shape(args), config.pipeline_dtype, stats,
                            transport=transport or pipeline_transport(args),
                            scatter_gather=scatter_gather(args, topo),
                            device=topo.device, **links)


def chunk_neighbours(pp_rank: int, pp: int, chunk: int, vp: int):
    """(sender chunk of the activation chunk `chunk` of rank `pp_rank` receives, sender chunk of
    the gradient it receives); None where there is no such link. Virtual stage v = chunk pp +
    rank takes activations from v - 1 and gradients from v + 1: on rank 0 the previous one is
    the last rank's chunk - 1 (the wrap-around link), on the last rank the next one is rank
    0's chunk + 1."""
    v, last = chunk * pp + pp_rank, pp * vp - 1
    prev = None if v == 0 else (v - 1) // pp
    nxt = None if v == last else (v + 1) // pp
    return prev, nxt


def build_interleaved_channels(args, config, stats, topo, epoch_samples=None,
                               nodes=None) -> InterleavedChannels:
    """Interleaved 1F1B: for every model chunk its own four link ends (virtual stage c pp + r
    to its neighbours, the wrap-around ones included), with their own codecs, caches, error
    buffers and policies, i.e. codec state per (chunk, direction). Both ends of each
    boundary build the same codec from the same (sender rank, sender chunk)."""
    c, seed, vp = args.compression, comp_seed(args), args.vp
    prev, nxt, me = topo.prev_rank, topo.next_rank, topo.rank
    # at pp = 2 prev == next: both kinds cross each pair both ways, gloo tells them by tag
    bwd_tag = 1 if args.pp == 2 else 0
    n_fwd = sum(x is not None for ch in range(vp)
                for x in chunk_neighbours(topo.pp_rank, args.pp, ch, vp))
    transport = pipeline_transport(args)   # one for every chunk (collective with --pp-backend)
    chunks = []
    for ch in range(vp):
        from_prev, from_next = chunk_neighbours(topo.pp_rank, args.pp, ch, vp)
        links, senders = {}, {}
        if from_prev is not None:
            out = spans_nodes(nodes, (me, prev))
            links["prev_fwd"] = Link("pp-fwd", prev, leaves_node=out)
            links["prev_bwd"] = Link("pp-bwd", prev, backward_codec(c, seed),
                                     backward_policy(args, topo.pp_rank, ch),
                                     leaves_node=out, tag=bwd_tag)
            senders.update(prev_fwd=from_prev, prev_bwd=ch)
        if from_next is not None:
            out = spans_nodes(nodes, (me, nxt))
            links["next_fwd"] = Link("pp-fwd", nxt, leaves_node=out)
            links["next_bwd"] = Link("pp-bwd", nxt, backward_codec(c, seed),
                                     backward_policy(args, (topo.pp_rank + 1) % args.pp,
                                                     from_next),
                                     leaves_node=out, tag=bwd_tag)
            senders.update(next_fwd=ch, next_bwd=from_next)
        attach_codecs(args, links, topo, epoch_samples, sender_chunks=senders,
                      num_caches=n_fwd)
        chunks.append(_channels(args, config, stats, topo, links, transport))
    return InterleavedChannels(chunks)


def build_grad_sync(args, model, stats, topo, nodes=None) -> GradSync:
    """dp channel (exact, PowerSGD on the first k stages, or a parameter-syncing --dp-mode)
    + emb channel (plain or fused; a --dp-mode has no dp all-reduce to fuse with).
    `nodes`: as build_pipeline_channels (marks the dp and emb groups that span nodes).

    Collective when --emb-comm-opt and pp > 1 (creates the fused groups) or with a
    parameter-syncing --dp-mode (creates the exchange groups): call on every rank.
    """
    c = args.compression
    # pp == 1: the embedding goes with the dp sync; a --dp-mode has no all-reduce to fuse with
    fused = c.emb_comm_opt and args.pp > 1 and not c.syncs_parameters
    mark_inter_node(stats, nodes, fused, topo)
    run = DpRun(seed=args.training.seed, comp_seed=comp_seed(args),
                train_iters=args.training.train_iters,
                tied_embedding=not args.model.untie_embeddings_and_output_weights,
                exclude_embedding=fused, overlap_grad_reduce=args.parallel.overlap_grad_reduce,
                bucket_size=args.parallel.ddp_bucket_size,
                num_microbatches=args.num_microbatches, speed=speed_meter(args, stats))
    dp = build_dp_channel(c, topo, stats, run)
    member = topo.is_first or topo.is_last   # holds a copy of the tied embedding
    if fused:
        group = create_fused_embedding_group(topo.tp_rank, member, timeout=group_timeout(args))
        emb = emb_channel(args, FusedEmbeddingSync(group, stats, args.dp), stats)
    else:
        emb = emb_channel(args, EmbeddingSync(topo.emb_group, stats), stats)
    # subspace: then the embedding copies every stage keeps for x0, summed over the stages
    return GradSync(dp, subspace.wrap_emb_channel(args, emb, model, topo, stats))


def mark_inter_node(stats, nodes, fused: bool, topo) -> None:
    """Which of this rank's collective channels span nodes: the dp group; the embedding's
    first and last stage (fused: of every replica)."""
    stats.leaves_node["dp"] = spans_nodes(nodes, topo.dp_ranks)
    stats.leaves_node["emb"] = spans_nodes(nodes, (topo.pp_ranks[0], topo.pp_ranks[-1])) or \
        (fused and stats.leaves_node["dp"])


def emb_channel(args, exact, stats):
    """The emb channel: `exact` (plain or fused sum), or PowerSGD over its group
    (--emb-grad-comp; exact during its warm-up)."""
    c = args.compression
    if not c.emb_grad_comp:
        return exact
    return EmbPowerSGDSync(exact, stats, rank=c.emb_grad_comp_rank,
                           warm_up_iters=int(c.emb_grad_comp_warm_up * args.training.train_iters),
                           error_feedback=c.emb_use_error_feedback, seed=comp_seed(args),
                           speed=speed_meter(args, stats))
