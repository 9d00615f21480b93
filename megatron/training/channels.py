"""Wiring: build this rank's communication channels from the parsed arguments.

The only place where flags meet megatron.cc: it picks codecs and modes from the
CompressionConfig, looks up process groups and peers in megatron-core's parallel_state,
and hands both to the library's constructors.
"""
from megatron.core import parallel_state as ps

from megatron.cc.grad_sync import EmbeddingSync, ExactDataParallelSync, GradSync
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
    dp = ExactDataParallelSync(ps.get_data_parallel_group(), stats)
    emb_group = ps.get_embedding_group(check_initialized=False) \
        if ps.is_rank_in_embedding_group(ignore_virtual=True) else None
    return GradSync(dp, EmbeddingSync(emb_group, stats))
