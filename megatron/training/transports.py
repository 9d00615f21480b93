"""Process groups per channel (--pp-backend; --dp-backend's: megatron/cc/dp_modes/allreduce.py).

A channel whose backend is the job's default uses megatron-core's groups as they are; another
backend gets its own groups over the same ranks (created collectively, on every rank).
"""
import torch.distributed as dist

from megatron.cc.transport import P2PTransport, group_with_backend


def _differs(backend) -> bool:
    return backend is not None and backend != dist.get_backend()


def pipeline_transport(args) -> P2PTransport:
    """Pipeline p2p on the default group, or on a world group of --pp-backend (collective)."""
    if _differs(args.gpu.pp_backend):
        return P2PTransport(group_with_backend(list(range(dist.get_world_size())),
                                               args.gpu.pp_backend))
    return P2PTransport()
