"""Wiring of the parameter-syncing dp modes (--dp-mode cocktail_sgd | diloco | sparseloco |
preduce | adpsgd).

They exchange parameters after the optimizer step (GradSync.after_optimizer_step); before it
the dp channel sends nothing, and the emb channel sums the tied embedding gradient between the
first and last stage of each replica (--emb-comm-opt has no dp all-reduce to fuse with here,
so the plain embedding sync is used).
"""
from megatron.cc.grad_sync.cocktail import CocktailSGDSync
from megatron.cc.grad_sync.diloco import DiLoCoSync
from megatron.cc.grad_sync.flat_codecs import make_flat_codec
from megatron.cc.grad_sync.groups import clone_groups
from megatron.cc.grad_sync.preduce import ADPSGDSync, PartialReduceSync
from megatron.cc.grad_sync.preduce_sched import schedule_of
from megatron.cc.grad_sync.sharded_exchange import ShardedExchange
from megatron.cc.grad_sync.sparseloco import SparseLoCoSync


def job_store():
    """The default store under a prefix unique to this Trainer (collective: rank 0 picks it).

    Several trainers may run one after the other in one process group (tests): each gets
    fresh scheduler keys.
    """
    import uuid
    import torch.distributed as dist
    tag = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(tag, src=0)
    return dist.PrefixStore(f"dp_preduce/{tag[0]}/", dist.distributed_c10d._get_default_store())


def build_exchange(args, group, name: str) -> ShardedExchange:
    c, seed = args.compression, args.training.seed

    def codec(s):
        return make_flat_codec(name, seed=s, stochastic=c.stochastic_rounding, bits=c.cocktail_bits,
                               random_ratio=c.cocktail_random_ratio,
                               topk_ratio=c.cocktail_topk_ratio, bucket_size=c.cocktail_bucket_size,
                               scheme=c.quant_scheme)
    # the rolling mask depends on the seed: equal on every replica, for both phases
    return ShardedExchange(group, codec(seed), codec(seed))


def build_sparseloco(args, dp_group, stats, dp_rank: int) -> SparseLoCoSync:
    """SparseLoCo on DiLoCo's loop flags; its codec's rounding seed differs per replica."""
    from megatron.cc.compress.chunk_topk import ChunkTopKCodec
    c = args.compression
    group = clone_groups(dp_group, c.dp_backend) if c.dp_backend or c.diloco_sync_delay \
        else dp_group
    codec = ChunkTopKCodec(c.sparseloco_density, c.sparseloco_chunk_size, c.sparseloco_bits,
                           c.stochastic_rounding, args.training.seed + dp_rank,
                           c.quant_scheme)
    return SparseLoCoSync(dp_group, stats, codec, c.diloco_inner_steps, c.sparseloco_outer_lr,
                          c.sparseloco_error_decay, c.diloco_fragments, c.diloco_sync_delay,
                          reduce_group=group, outer_momentum=c.sparseloco_outer_momentum)


def build_dp_mode_sync(args, stats, topo):
    """The dp channel of --dp-mode (channels.build_grad_sync adds --hetero and the emb channel)."""
    c = args.compression
    mode = c.dp_mode_name
    dp_group = topo.dp_group
    if mode == "cocktail_sgd":
        overlap = not c.cocktail_no_overlap
        group = clone_groups(dp_group, c.dp_backend) if overlap or c.dp_backend else dp_group
        dp = CocktailSGDSync(dp_group, stats, build_exchange(args, group, "cocktail"),
                             warmup_steps=c.cocktail_warmup_steps, overlap=overlap)
    elif mode == "diloco":
        exchange = None
        # a background reduce (sync delay) or another backend needs a group of its own
        group = clone_groups(dp_group, c.dp_backend) if c.dp_backend or c.diloco_sync_delay \
            else dp_group
        if c.diloco_compression != "none":
            exchange = build_exchange(args, group, c.diloco_compression)
        dp = DiLoCoSync(dp_group, stats, c.diloco_inner_steps, c.diloco_outer_lr,
                        c.diloco_outer_momentum, exchange, c.diloco_fragments,
                        c.diloco_sync_delay, reduce_group=group)
    elif mode == "sparseloco":
        dp = build_sparseloco(args, dp_group, stats, topo.dp_rank)
    elif mode == "preduce":
        stage = topo.pp_rank
        schedule = schedule_of(stage, topo.pp_size, c.preduce_scope,
                               not args.model.untie_embeddings_and_output_weights)
        decider = stage == schedule and topo.tp_rank == 0
        pairwise = {"auto": None, "window": False, "pairwise": True}[c.preduce_groups]
        dp = PartialReduceSync(dp_group, stats, job_store(), decider, c.ssp_bound,
                               args.training.train_iters, schedule=schedule, pairwise=pairwise)
    else:
        dp = ADPSGDSync(dp_group, stats, args.training.seed)
    return dp


class ReplicaState:
    """Checkpoint component: this rank's own weights and optimizer state.

    In the parameter-syncing modes the replicas differ between syncs (CocktailSGD's worker
    error lives in the weights, DiLoCo's inner steps, gossip averaging), while the model file
    holds dp rank 0's copy only; without this a resumed replica would restart from another
    replica's weights. fp32 only (the modes reject --fp16/--bf16).
    """

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        from megatron.training.checkpointing import named_optimizer_state
        return {"params": {n: p.detach().clone() for n, p in self.model.named_parameters()},
                "optimizer": named_optimizer_state(self.optimizer, self.model)}

    def load_state_dict(self, sd: dict) -> None:
        import torch
        from megatron.training.checkpointing import load_named_optimizer_state
        if not sd:
            return
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(sd["params"][n])
        load_named_optimizer_state(self.optimizer, self.model, sd["optimizer"])
