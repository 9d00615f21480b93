"""Which node each rank runs on, so every channel's traffic can be split into what stays on
the node and what leaves it (the log line's `<channel> inter-node bytes` / `wait ms`).

A node is what the launcher calls one: torchrun's GROUP_RANK (its --node-rank), else Slurm's
SLURM_NODEID, else the host name. Two torchrun agents on one machine with --nnodes 2 are two
nodes, which is how the tests and the slow-link bench emulate a cluster on one box.
"""
import os
import socket
from typing import Iterable, List, Optional

import torch.distributed as dist


def node_of_ranks() -> List[str]:
    """Every global rank's node (one all_gather_object at start-up; call on every rank)."""
    me = os.environ.get("GROUP_RANK") or os.environ.get("SLURM_NODEID") or socket.gethostname()
    nodes: List[Optional[str]] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, str(me))
    return nodes


def spans_nodes(nodes: Optional[List[str]], ranks: Iterable[int]) -> bool:
    """Do these global ranks sit on more than one node? (False without a node map.)"""
    return nodes is not None and len({nodes[r] for r in ranks}) > 1
