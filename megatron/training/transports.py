"""Process groups per channel (--dp-backend, --pp-backend): the flags meet megatron.cc here.

A channel whose backend is the job's default uses megatron-core's groups as they are; another
backend gets its own groups over the same ranks (created collectively, on every rank).
"""
import torch.distributed as dist

from megatron.cc.transport import P2PTransport, group_with_backend


def _differs(backend) -> bool:
    return backend is not None and backend != dist.get_backend()


def data_parallel_group(args, topo):
    """The dp channel's group. Collective when --dp-backend differs from the default."""
    if _differs(args.compression.dp_backend):
        return group_with_backend(list(topo.dp_ranks), args.compression.dp_backend)
    return topo.dp_group


def pipeline_transport(args) -> P2PTransport:
    """Pipeline p2p on the default group, or on a world group of --pp-backend (collective)."""
    if _differs(args.gpu.pp_backend):
        return P2PTransport(group_with_backend(list(range(dist.get_world_size())),
                                               args.gpu.pp_backend))
    return P2PTransport()
