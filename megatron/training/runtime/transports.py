"""Process groups per channel (--pp-backend, --dp-backend): made by Topology.channel_group.

A channel whose backend is the job's default uses megatron-core's groups as they are; another
backend gets its own groups over the same ranks (created collectively, on every rank).
"""
import torch.distributed as dist

from megatron.cc.common.transport import P2PTransport


def _differs(backend) -> bool:
    return backend is not None and backend != dist.get_backend()


def pipeline_transport(args, topo) -> P2PTransport:
    """Pipeline p2p on the default group, or on a world group of --pp-backend (collective)."""
    return P2PTransport(topo.channel_group(None, args.gpu.pp_backend))
