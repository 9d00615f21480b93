"""Wiring: build this rank's communication channels from the parsed arguments.

The only place where flags meet megatron.cc: it picks codecs and modes from the
CompressionConfig, looks up process groups and peers in megatron-core's parallel_state,
and hands both to the library's constructors.
"""
from megatron.core import parallel_state as ps

from megatron.cc.grad_sync import (EmbeddingSync, ExactDataParallelSync, FusedEmbeddingSync,
                                   GradSync, PowerSGDDataParallelSync,
                                   create_fused_embedding_group)
from megatron.cc.p2p import Link, PipelineChannels


def activation_shape(args):
    """(S, B, H): what crosses a stage boundary in Megatron's seq-first layout."""
    return (args.model.seq_length, args.training.micro_batch_size, args.model.hidden_size)


def build_pipeline_channels(args, config, stats) -> PipelineChannels:
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    links = {}
    if args.pp > 1:
        prev = ps.get_pipeline_model_parallel_prev_rank()
        nxt = ps.get_pipeline_model_parallel_next_rank()
        if not first:
            links["prev_fwd"] = Link("pp-fwd", prev)
            links["prev_bwd"] = Link("pp-bwd", prev)
        if not last:
            links["next_fwd"] = Link("pp-fwd", nxt)
            links["next_bwd"] = Link("pp-bwd", nxt)
    return PipelineChannels(activation_shape(args), config.pipeline_dtype, stats, **links)


def build_grad_sync(args, model, stats) -> GradSync:
    """dp channel (exact, or PowerSGD on the first k stages) + emb channel (plain or fused).

    Collective when --emb-comm-opt and pp > 1 (creates the fused groups): call on every rank.
    """
    c = args.compression
    dp_group = ps.get_data_parallel_group()
    stage = ps.get_pipeline_model_parallel_rank()
    fused = c.emb_comm_opt and args.pp > 1   # pp == 1: the embedding goes with the dp sync
    if args.dp > 1 and stage < c.compressed_stages(args.pp):
        dp = PowerSGDDataParallelSync(
            dp_group, stats, rank=c.grad_comp_rank,
            warm_up_iters=int(c.grad_comp_warm_up * args.training.train_iters),
            exclude_embedding=fused, seed=args.training.seed)
    else:
        dp = ExactDataParallelSync(dp_group, stats, exclude_embedding=fused)
    member = ps.is_rank_in_embedding_group(ignore_virtual=True)
    if fused:
        group = create_fused_embedding_group(ps.get_tensor_model_parallel_rank(), member)
        return GradSync(dp, FusedEmbeddingSync(group, stats, args.dp))
    emb_group = ps.get_embedding_group(check_initialized=False) if member else None
    return GradSync(dp, EmbeddingSync(emb_group, stats))
