"""--dp-mode adpsgd: AD-PSGD, weights averaged in random pairs after every step."""
from dataclasses import dataclass

from megatron.cc.data_parallel.base import DpMode
from megatron.cc.data_parallel.preduce_sync import ADPSGDSync


@dataclass
class ADPSGD(DpMode):
    name = "adpsgd"

    @staticmethod
    def build(c, topo, stats, run):
        return ADPSGDSync(topo.dp_group, stats, run.seed)
