"""Pipeline channels: the fwd (activations, s -> s+1) and bwd (gradients, s+1 -> s) links.

Both ends of a link build the same codec from the same config, so stateful codecs evolve
identically, and decide compression from (sender stage, micro-batch, iteration, pp, M)
(`CompressionPolicy`): nothing is inferred from call order and nothing extra crosses the wire.
Payload shapes come from `codec.payload_spec`, so receive buffers need no size handshake.
Transfers go through megatron.cc.common.transport; a send+receive batch posts both before
waiting, so 1F1B cannot deadlock.
"""
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from megatron.cc.common.compat import all_gather_single
from megatron.cc.common.stats import ChannelStats, nbytes
from megatron.cc.common.transport import P2PTransport


@dataclass
class Message:
    """What both ends know about one message without communicating."""
    microbatch: int
    iteration: int
    sample_ids: Optional[torch.Tensor] = None
    train: bool = True
    """False in evaluation (forward-only) passes: sent uncompressed, codec state untouched,
    so validation measures the model and validation ids never reach training-sample caches."""


class Link:
    """One direction across one stage boundary, seen from one end."""

    def __init__(self, channel: str, peer: int, codec=None,
                 policy: Optional[Callable[[Message], bool]] = None, leaves_node: bool = False,
                 tag: int = 0):
        self.channel = channel
        self.peer = peer            # global rank of the other end
        # p2p tag: interleaved at pp = 2 both kinds cross each pair in each direction, and
        # gloo then matches activations and gradients apart (NCCL ignores tags; there the
        # schedule posts both kinds in the same order on both ends)
        self.tag = tag
        self.tagged = (tag,) if tag else ()   # the transport's default tag (0) goes unsaid
        self.leaves_node = leaves_node   # the peer is on another node (counted apart)
        self.codec = codec          # None = always uncompressed
        self.policy = policy        # None = compress every message when a codec is set

    def compressed(self, msg: Message) -> bool:
        return (msg.train and self.codec is not None
                and (self.policy is None or self.policy(msg)))

    def _observe(self, x: torch.Tensor, msg: Message) -> None:
        """Uncompressed message: codecs with caches (delta) still record it, on both ends."""
        if msg.train and self.codec is not None:
            self.codec.observe(x.detach(), self._ctx(msg))

    def _ctx(self, msg: Message):
        from megatron.cc.codecs.base import CodecContext
        return CodecContext(microbatch=msg.microbatch, iteration=msg.iteration,
                            sample_ids=msg.sample_ids)

    # sender side
    def encode(self, x: torch.Tensor, msg: Message) -> List[torch.Tensor]:
        if not self.compressed(msg):
            if msg.train and self.codec is not None:
                x = self.codec.pass_through(x.detach(), self._ctx(msg))
            self._observe(x, msg)
            return [x.detach().contiguous()]
        return [p.contiguous() for p in self.codec.encode(x.detach(), self._ctx(msg))]

    # receiver side
    def buffers(self, shape, dtype, msg: Message, device=None) -> List[torch.Tensor]:
        if not self.compressed(msg):
            return [torch.empty(shape, dtype=dtype, device=device)]
        return [torch.empty(s, dtype=d, device=device)
                for s, d in self.codec.payload_spec(torch.Size(shape), dtype)]

    def decode(self, payload: List[torch.Tensor], shape, dtype, msg: Message) -> torch.Tensor:
        if not self.compressed(msg):
            self._observe(payload[0], msg)
            return payload[0]
        return self.codec.decode(payload, torch.Size(shape), dtype, self._ctx(msg))


@dataclass
class ScatterGather:
    """Megatron v2.5's scatter-gather pipeline sends, sliced along the sequence (dim 0).

    Tensor-parallel rank `rank` of `size` sends rows [rank S/size, (rank+1) S/size) of the
    (S, B, H) message; the receiver all-gathers the decoded slices over `group` (the stage's
    tensor-parallel group, passed in by the driver). The slice is a view, the gather lands in
    the full tensor, and every codec sees an ordinary (S/tp, B, H) message (why the sequence
    dimension: docs/pipeline_compression.md). Needs S % tp == 0 (the driver checks).
    """
    group: Any
    rank: int
    size: int

    def wire_shape(self, shape) -> tuple:
        s = tuple(shape)
        if s[0] % self.size:
            raise ValueError(f"scatter-gather splits the sequence ({s[0]}) into {self.size} "
                             f"tensor-parallel slices: not divisible")
        return (s[0] // self.size,) + s[1:]

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0] // self.size
        return x[self.rank * n:(self.rank + 1) * n]   # a contiguous view of a contiguous x

    def gather(self, part: torch.Tensor, shape) -> torch.Tensor:
        out = torch.empty(tuple(shape), dtype=part.dtype, device=part.device)
        if part.is_cuda and dist.get_backend(self.group) == "gloo":
            # gloo gathers CUDA tensors into a list only; the chunks are views of `out`
            dist.all_gather(list(out.chunk(self.size)), part.contiguous(), group=self.group)
        else:
            all_gather_single(out, part.contiguous(), group=self.group)
        return out


class PendingExchange:
    """The handles of one posted batch: wait for the send and the receive separately; the time
    spent waiting is added to the channel's stats (host clock, no device sync).
    """

    def __init__(self, channels, send_reqs, payload, send_link, recv_reqs, recv_spec):
        self.channels = channels
        self.send_reqs, self.payload, self.send_link = send_reqs, payload, send_link
        self.recv_reqs, self.recv_spec = recv_reqs, recv_spec
        self._out = None

    def wait_send(self) -> None:
        """The payload may be freed or reused after this."""
        if self.send_reqs:
            _timed_wait(self.send_reqs, self.channels.stats, self.send_link)
        self.send_reqs, self.payload = [], None

    def result(self) -> Optional[torch.Tensor]:
        """The decoded received tensor (waits for it the first time)."""
        if self.recv_spec is not None and self._out is None:
            link, msg, bufs = self.recv_spec
            _timed_wait(self.recv_reqs, self.channels.stats, link if msg.train else None)
            self._out = self.channels._decode(link, msg, bufs)
        return self._out


def _timed_wait(reqs, stats: ChannelStats, link: Optional[Link]) -> None:
    t0 = time.perf_counter()
    for r in reqs:
        r.wait()
    if link is not None:
        stats.add_wait(link.channel, time.perf_counter() - t0, link.leaves_node)


class PipelineChannels:
    """Send/receive of activations and their gradients for one pipeline stage.

    `prev_fwd`/`prev_bwd` are this stage's ends of the links to stage s-1 (receive
    activations, send gradients); `next_fwd`/`next_bwd` those to stage s+1.
    """

    def __init__(self, tensor_shape: Sequence[int], dtype: torch.dtype, stats: ChannelStats,
                 prev_fwd: Optional[Link] = None, prev_bwd: Optional[Link] = None,
                 next_fwd: Optional[Link] = None, next_bwd: Optional[Link] = None,
                 transport: Optional[P2PTransport] = None,
                 scatter_gather: Optional[ScatterGather] = None,
                 device: Optional[torch.device] = None):
        self.device = device                # of the receive buffers: the stage's (None: CPU)
        self.shape = tuple(tensor_shape)    # what the schedule sends and receives
        self.sg = scatter_gather            # None: every rank sends the whole message
        self.wire_shape = self.shape if scatter_gather is None else \
            scatter_gather.wire_shape(self.shape)   # what one link carries (and its codec sees)
        self.dtype = dtype
        self.stats = stats
        self.prev_fwd, self.prev_bwd = prev_fwd, prev_bwd
        self.next_fwd, self.next_bwd = next_fwd, next_bwd
        self.probe = None   # optional OrthogonalityProbe (last stage, --check-orth-error-acti)
        self.transport = transport  # None: the default group (built on first use)

    # -- one call = one batch of isend/irecv posted together, then waited for --------------
    def _exchange(self, send: Optional[tuple], recv: Optional[tuple]) -> Optional[torch.Tensor]:
        pending = self.post(send, recv)
        pending.wait_send()
        return pending.result() if recv is not None else None

    def post(self, send: Optional[tuple], recv: Optional[tuple]) -> "PendingExchange":
        """Encode and post one batch (send=(link, x, msg), recv=(link, msg)); do not wait. The
        schedule waits when its mode says, in the same order per link in every mode.
        """
        sends, recvs, payload, recv_spec = [], [], None, None
        if send is not None:
            link, x, msg = send
            if self.sg is not None:
                x = self.sg.scatter(x)   # raw and the ratios: against the scattered baseline
            payload = link.encode(x, msg)
            raw = x.numel() * x.element_size() if link.codec is None else \
                link.codec.raw_nbytes(x)
            if msg.train:  # per-iteration training traffic; evaluation is not counted
                self.stats.add(link.channel, nbytes(payload), raw, link.leaves_node)
            sends = [(p, link.peer) + link.tagged for p in payload]
            if self.probe is not None and link.channel == "pp-bwd" and link.compressed(msg):
                self.probe.error(link.codec.error(x.shape))
        if recv is not None:
            link, msg = recv
            bufs = link.buffers(self.wire_shape, self.dtype, msg, self.device)
            recvs = [(b, link.peer) + link.tagged for b in bufs]
            recv_spec = (link, msg, bufs)
        if self.transport is None:
            self.transport = P2PTransport()
        send_reqs, recv_reqs = self.transport.post(sends, recvs)
        # evaluation passes are not training traffic: neither their bytes nor their waits count
        send_link = send[0] if send is not None and send[2].train else None
        return PendingExchange(self, send_reqs, payload, send_link, recv_reqs, recv_spec)

    def _decode(self, link: Link, msg: Message, bufs) -> torch.Tensor:
        out = link.decode(bufs, self.wire_shape, self.dtype, msg).to(self.dtype)
        if self.probe is not None and link.channel == "pp-fwd" and msg.train:
            self.probe.activation(out)   # the slice: the rows this rank's CB error belongs to
        if self.sg is not None:
            out = self.sg.gather(out, self.shape)
        return out.requires_grad_(link.channel == "pp-fwd")

    def chunk(self, c: int) -> "PipelineChannels":
        """The links of model chunk `c` (one chunk: these)."""
        assert c == 0, "one model chunk"
        return self

    def recv_forward(self, msg: Message) -> Optional[torch.Tensor]:
        return None if self.prev_fwd is None else self._exchange(None, (self.prev_fwd, msg))

    def send_forward(self, y: torch.Tensor, msg: Message) -> None:
        if self.next_fwd is not None:
            self._exchange((self.next_fwd, y, msg), None)

    def recv_backward(self, msg: Message) -> Optional[torch.Tensor]:
        return None if self.next_bwd is None else self._exchange(None, (self.next_bwd, msg))

    def send_backward(self, g: Optional[torch.Tensor], msg: Message) -> None:
        if self.prev_bwd is not None:
            self._exchange((self.prev_bwd, g, msg), None)

    # -- checkpointable codec state ---------------------------------------------------------
    def close(self) -> None:
        """Release codec resources (disk-backed activation caches delete their files)."""
        for l in self.links():
            if l.codec is not None:
                l.codec.close()

    def links(self) -> List[Link]:
        return [l for l in (self.prev_fwd, self.prev_bwd, self.next_fwd, self.next_bwd) if l]

    def _ends(self) -> dict:
        """Each link end under its own key: with interleaving at pp = 2 a chunk's previous and
        next stage are the same rank, so channel and peer alone would name two ends."""
        ends = {"prev_fwd": self.prev_fwd, "prev_bwd": self.prev_bwd,
                "next_fwd": self.next_fwd, "next_bwd": self.next_bwd}
        return {f"{end} {l.channel}->{l.peer}": l for end, l in ends.items()
                if l is not None and l.codec is not None}

    def state_dict(self) -> dict:
        return {key: l.codec.state_dict() for key, l in self._ends().items()}

    def load_state_dict(self, sd: dict) -> None:
        for key, l in self._ends().items():
            old = f"{l.channel}->{l.peer}"   # checkpoints before the end was named
            if key in sd or old in sd:
                l.codec.load_state_dict(sd[key] if key in sd else sd[old])


class InterleavedChannels:
    """The pipeline channels of a rank holding several model chunks (interleaved 1F1B).

    `chunks[c]` holds chunk c's own links, codecs and codec state; virtual stage c pp + r
    receives from c pp + r - 1 (on rank 0 over the wrap-around link) and sends to c pp + r + 1.
    Every batch is posted through chunk 0's object, so byte counts sum per channel over the
    chunk boundaries. Checkpoint state is kept per chunk.
    """

    def __init__(self, chunks: List[PipelineChannels]):
        self.chunks = chunks

    def chunk(self, c: int) -> PipelineChannels:
        return self.chunks[c]

    def post(self, send, recv) -> PendingExchange:
        return self.chunks[0].post(send, recv)

    @property
    def transport(self):
        return self.chunks[0].transport

    @property
    def stats(self):
        return self.chunks[0].stats

    def links(self) -> List[Link]:
        return [l for ch in self.chunks for l in ch.links()]

    def close(self) -> None:
        for ch in self.chunks:
            ch.close()

    def state_dict(self) -> dict:
        return {f"chunk{c}": ch.state_dict() for c, ch in enumerate(self.chunks)}

    def load_state_dict(self, sd: dict) -> None:
        for c, ch in enumerate(self.chunks):
            if f"chunk{c}" not in sd:
                raise ValueError(f"no pipeline codec state for model chunk {c}: the checkpoint "
                                 f"was saved with another --virtual-pipeline-model-parallel-size")
            ch.load_state_dict(sd[f"chunk{c}"])
