"""--dp-mode preduce: SD-PIPE's partial reduce, weights averaged with whichever replicas are
ready, every --ssp-bound-th round with all (megatron/cc/data_parallel/preduce_sync.py)."""
import uuid
from dataclasses import dataclass

import torch.distributed as dist

from megatron.cc.common.config_fields import flag
from megatron.cc.data_parallel.base import DpMode
from megatron.cc.data_parallel.preduce_sync import PartialReduceSync
from megatron.cc.data_parallel.preduce_sched import schedule_of


def job_store():
    """The default store under a prefix unique to this Trainer (collective: rank 0 picks it).

    Several trainers may run one after the other in one process group (tests): each gets
    fresh scheduler keys.
    """
    tag = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(tag, src=0)
    return dist.PrefixStore(f"dp_preduce/{tag[0]}/", dist.distributed_c10d._get_default_store())


@dataclass
class PReduce(DpMode):
    name = "preduce"
    ssp_bound: int = flag(
        10, "preduce: every ssp-bound-th round of a replica (dp x ssp-bound updates of the "
            "stage), and the last, averages all replicas of the stage (1: every round, i.e. "
            "all-reduce).", low=1)
    preduce_scope: str = flag(
        "stage", "preduce: stage (SD-PIPE): the replicas of each pipeline stage form groups on "
                 "a scheduler of their own, independently of the other stages (the first "
                 "stage follows the last one when the word embedding is tied, so its two "
                 "copies stay equal); replica: stage 0 decides for its whole pipeline replica.",
        choices=["stage", "replica"])
    preduce_groups: str = flag(
        "auto", "preduce: what a window of ready replicas averages as. window: all of them "
                "together; pairwise: pairs in dp-rank order (an odd last one stays alone); "
                "auto: pairwise above 8 replicas per stage, as SD-PIPE.",
        choices=["auto", "window", "pairwise"])

    @staticmethod
    def build(c, topo, stats, run):
        schedule = schedule_of(topo.pp_rank, topo.pp_size, c.preduce_scope, run.tied_embedding)
        pairwise = {"auto": None, "window": False, "pairwise": True}[c.preduce_groups]
        return PartialReduceSync(topo.dp_group, stats, job_store(),
                                 topo.pp_rank == schedule and topo.tp_rank == 0, c.ssp_bound,
                                 run.train_iters, schedule=schedule, pairwise=pairwise)
