"""Point-to-point transfers on a channel's own process group, on NCCL or gloo.

gloo's send/recv move host memory only (given a CUDA tensor it crashes with `writev ... Bad
address`), so on a gloo group CUDA tensors are staged through pinned host buffers: sends are
copied down asynchronously and the stream is synchronised once before gloo reads them (gloo
is a host library: that wait is the transport's, not the codec's), receives land in pinned
buffers and are copied up asynchronously. NCCL groups and CPU tensors go through untouched.
With gloo on every group several ranks can share one GPU, which NCCL refuses.
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.distributed as dist

Transfer = Tuple[torch.Tensor, int]   # (tensor, peer's global rank[, tag])


class P2PTransport:
    """batch_isend_irecv over `group` (None = the default group), staging when it is gloo."""

    def __init__(self, group=None):
        self.group = group
        self.gloo = dist.get_backend(group) == "gloo"

    def _staged(self, t: torch.Tensor) -> bool:
        return self.gloo and t.is_cuda

    def exchange(self, sends: Sequence[Transfer], recvs: Sequence[Transfer]) -> None:
        """Post every send and receive together, then wait for all (no 1F1B deadlock)."""
        send_reqs, recv_reqs = self.post(sends, recvs)
        for req in send_reqs + recv_reqs:
            req.wait()

    def post(self, sends: Sequence[Transfer], recvs: Sequence[Transfer]) -> tuple:
        """Post every send and receive together without waiting: (send handles, receive
        handles), each with `wait()`. A staged receive's handle copies the pinned buffer up
        to its destination when waited for."""
        sends = [(t[0], t[1], t[2] if len(t) > 2 else 0) for t in sends]
        recvs = [(t[0], t[1], t[2] if len(t) > 2 else 0) for t in recvs]
        host_sends = [(self._to_host(t), p, g) if self._staged(t) else (t, p, g)
                      for t, p, g in sends]
        host_recvs = [(_pinned_like(t), p, g) if self._staged(t) else (t, p, g)
                      for t, p, g in recvs]
        if any(self._staged(t) for t, _, _ in sends):
            torch.cuda.current_stream().synchronize()  # the pinned copies must be complete
        # receives first: on gloo, two ranks whose batches post their sends first make the
        # two sends take turns; receives first, they cross (docs/planning.md, "The link
        # alone"). NCCL runs a batch as one group anyway
        ops = [dist.P2POp(dist.irecv, t, p, group=self.group, tag=g) for t, p, g in host_recvs]
        ops += [dist.P2POp(dist.isend, t, p, group=self.group, tag=g) for t, p, g in host_sends]
        reqs = dist.batch_isend_irecv(ops) if ops else []
        n = len(recvs)
        # the staged send buffers live as long as their handles
        send_reqs = [_Staged(r, host) for r, (host, _, _) in zip(reqs[n:], host_sends)]
        recv_reqs = [_Staged(r, src, dst) for r, (dst, _, _), (src, _, _)
                     in zip(reqs[:n], recvs, host_recvs)]
        return send_reqs, recv_reqs

    @staticmethod
    def _to_host(t: torch.Tensor) -> torch.Tensor:
        host = _pinned_like(t)
        host.copy_(t, non_blocking=True)
        return host


class _Staged:
    """A request handle that keeps its host buffer alive and, for a staged receive, copies it
    to the device tensor once the transfer is complete."""

    def __init__(self, req, src: torch.Tensor, dst: Optional[torch.Tensor] = None):
        self.req, self.src, self.dst = req, src, dst

    def wait(self) -> None:
        self.req.wait()
        if self.dst is not None and self.dst is not self.src:
            self.dst.copy_(self.src, non_blocking=True)
            self.dst = None


def _pinned_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
