"""--emb-comm-opt: Optimus-CC's fused embedding synchronisation (FE), lossless."""
from dataclasses import dataclass

from megatron.cc.common.config_fields import flag
from megatron.cc.embedding.fused_sync import FusedEmbeddingSync, create_fused_embedding_group


@dataclass
class FusedEmbedding:
    emb_comm_opt: bool = flag(
        False, "Fused embedding sync: the tied embedding gradient takes one all-reduce over "
               "the first and last stage of every replica (one group per TP rank) instead of "
               "the dp all-reduce plus the first/last-stage sum; lossless. With "
               "pipeline size 1 there is no embedding channel and this changes nothing.")

    @staticmethod
    def on(c, pp: int) -> bool:
        """pp == 1: the embedding goes with the dp sync; a parameter-syncing --dp-mode has no
        dp all-reduce to fuse with."""
        return c.emb_comm_opt and pp > 1 and not c.syncs_parameters

    @staticmethod
    def check(c, pp: int) -> None:
        pass

    @staticmethod
    def build(c, topo, stats, run, exact):
        """Replaces the plain sum (collective: creates the fused groups on every rank)."""
        group = create_fused_embedding_group(topo.tp_rank, topo.is_first or topo.is_last,
                                             timeout=run.group_timeout)
        return FusedEmbeddingSync(group, stats, topo.dp_size)
