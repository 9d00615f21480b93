"""Wiring: build this rank's communication channels from the parsed arguments.

The only place where flags meet megatron.cc: it picks codecs and modes from the
CompressionConfig, takes process groups and peers from the rank's Topology, and hands both
to the library's constructors.
"""
from megatron.cc.data_parallel.registry import DpRun, build_dp_channel
from megatron.cc.embedding.registry import build_emb_channel
from megatron.cc.grad_sync.sync import GradSync
from megatron.cc.pipeline.diagnostics import OrthogonalityProbe
from megatron.cc.pipeline.p2p import InterleavedChannels, PipelineChannels, ScatterGather
from megatron.cc.common.speed import CompSpeed
from megatron.training.runtime.initialize import group_timeout
from megatron.training.runtime.nodes import spans_nodes
from megatron.training.model import subspace
from megatron.training.compression.pipeline_codecs import StageLinks
from megatron.training.runtime.transports import pipeline_transport


def activation_shape(args):
    """(S, B, H): what a stage outputs and the next takes, in Megatron's seq-first layout;
    with --sequence-parallel the rank's (S/tp, B, H) shard, sent as it is (no scatter-gather)."""
    seq = args.pipeline_seq_length if args.sequence_parallel else args.model.seq_length
    # H, or k subspace coefficients (--forward-compress-method subspace)
    return (seq, args.training.micro_batch_size, subspace.pipeline_width(args))


def scatter_gather(args, topo):
    """This rank's slice of every pipeline message at tp > 1 (None: whole messages).

    The library takes the tensor-parallel group, rank and size from here; see
    megatron.cc.pipeline.p2p.ScatterGather for why the slices are along the sequence. With sequence
    parallelism (args.scatter_gather is False then) the message already is the shard."""
    if not args.scatter_gather:
        return None
    return ScatterGather(topo.tp_group, topo.tp_rank, topo.tp_size)


def comp_seed(args) -> int:
    """The low-rank compressors' seed: --comp-seed, else --seed."""
    c = args.compression
    return c.comp_seed if c.comp_seed is not None else args.training.seed


def speed_meter(args, stats):
    """--check-comp-speed: the rank's codec timer (None when off)."""
    return CompSpeed(stats) if args.compression.check_comp_speed else None


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
    links = {}
    if args.pp > 1:
        link = StageLinks(args, topo, comp_seed(args), epoch_samples, nodes,
                          num_caches=(not first) + (not last), speed=speed_meter(args, stats))
        if not first:
            links.update(prev_fwd=link("prev_fwd", topo.prev_rank, stage - 1),
                         prev_bwd=link("prev_bwd", topo.prev_rank, stage))
        if not last:
            links.update(next_fwd=link("next_fwd", topo.next_rank, stage),
                         next_bwd=link("next_bwd", topo.next_rank, stage + 1))
    channels = _channels(args, config, stats, topo, links)
    if args.compression.check_orth_error_acti and last and not first:
        channels.probe = OrthogonalityProbe(stats)
    return channels


def _channels(args, config, stats, topo, links, transport=None) -> PipelineChannels:
    return PipelineChannels(activation_shape(args), config.pipeline_dtype, stats,
                            transport=transport or pipeline_transport(args, topo),
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
    vp, pp, rank = args.vp, args.pp, topo.pp_rank
    # at pp = 2 prev == next: both kinds cross each pair both ways, gloo tells them by tag
    tag = 1 if pp == 2 else 0
    n_fwd = sum(x is not None for ch in range(vp) for x in chunk_neighbours(rank, pp, ch, vp))
    transport = pipeline_transport(args, topo)   # one for all chunks (collective: --pp-backend)
    chunks = []
    for ch in range(vp):
        from_prev, from_next = chunk_neighbours(rank, pp, ch, vp)
        link = StageLinks(args, topo, comp_seed(args), epoch_samples, nodes, num_caches=n_fwd,
                          speed=speed_meter(args, stats))
        links = {}
        if from_prev is not None:
            links.update(prev_fwd=link("prev_fwd", topo.prev_rank, (rank - 1) % pp, from_prev),
                         prev_bwd=link("prev_bwd", topo.prev_rank, rank, ch, tag=tag))
        if from_next is not None:
            links.update(next_fwd=link("next_fwd", topo.next_rank, rank, ch),
                         next_bwd=link("next_bwd", topo.next_rank, (rank + 1) % pp, from_next,
                                       tag=tag))
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
    fused = c.fused_embedding(args.pp)
    mark_inter_node(stats, nodes, fused, topo)
    run = DpRun(seed=args.training.seed, comp_seed=comp_seed(args),
                train_iters=args.training.train_iters,
                tied_embedding=not args.model.untie_embeddings_and_output_weights,
                exclude_embedding=fused, overlap_grad_reduce=args.parallel.overlap_grad_reduce,
                bucket_size=args.parallel.ddp_bucket_size,
                num_microbatches=args.num_microbatches, speed=speed_meter(args, stats),
                group_timeout=group_timeout(args))
    dp = build_dp_channel(c, topo, stats, run)
    emb = build_emb_channel(c, topo, stats, run, args.pp)
    # subspace: also the embedding copies every stage keeps for x0, summed over the stages
    return GradSync(dp, subspace.wrap_emb_channel(args, emb, model, topo, stats))


def mark_inter_node(stats, nodes, fused: bool, topo) -> None:
    """Which of this rank's collective channels span nodes: the dp group; the embedding's
    first and last stage (fused: of every replica)."""
    stats.leaves_node["dp"] = spans_nodes(nodes, topo.dp_ranks)
    stats.leaves_node["emb"] = spans_nodes(nodes, (topo.pp_ranks[0], topo.pp_ranks[-1])) or \
        (fused and stats.leaves_node["dp"])
