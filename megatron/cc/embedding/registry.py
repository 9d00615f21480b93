"""The emb channel's registry: the tied embedding gradient's sum between the first and last
stage, the plain one over the embedding group, changed by each plug-in that is on, in EMB's
order (FE replaces the sum by a fused one, PowerSGD wraps it). A plug-in owns its flags as
dataclass fields, `check` and `build(c, topo, stats, run, exact)`; CompressionConfig holds an
instance of each. Adding one: a file here and a line in EMB.
"""
from megatron.cc.embedding.fused import FusedEmbedding
from megatron.cc.embedding.powersgd import EmbPowerSGD
from megatron.cc.grad_sync.sync import EmbeddingSync

EMB = (FusedEmbedding, EmbPowerSGD)


def emb_sections() -> tuple:
    """The emb channel's config dataclasses: its plug-ins, in EMB's order."""
    return EMB


class EmbRules:
    """The emb channel's rules over the whole CompressionConfig (its fields: EMB's)."""

    def fused_embedding(self, pp: int) -> bool:
        """The emb channel sums over every replica (FE), the dp channel leaves it out."""
        return FusedEmbedding.on(self, pp)

    def validate_emb(self, pp: int) -> None:
        for plugin in EMB:
            plugin.check(self, pp)


def build_emb_channel(c, topo, stats, run, pp: int):
    """This rank's finished emb channel (collective with --emb-comm-opt: call on every rank)."""
    emb = None if FusedEmbedding.on(c, pp) else EmbeddingSync(topo.emb_group, stats)
    for plugin in EMB:
        if plugin.on(c, pp):
            emb = plugin.build(c, topo, stats, run, emb)
    return emb
