"""The codec contract every compressor in `megatron.cc.codecs` implements.

A codec turns one tensor into a list of payload tensors (what goes on the wire) and back.
One instance lives on ONE end of ONE channel; sender and receiver build it from the same
config, so stateful codecs (activation caches, error buffers) evolve identically where the
method requires it. Codecs are pure tensor code: no torch.distributed in here.

    codec = get_codec("fixpoint", bits=4)
    spec = codec.payload_spec(x.shape, x.dtype)        # both ends compute this from the shape
    payload = codec.encode(x, CodecContext(microbatch=i))
    x_hat = codec.decode(payload, x.shape, x.dtype, CodecContext(microbatch=i))
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

PayloadSpec = list[tuple[tuple[int, ...], torch.dtype]]


@dataclass
class CodecContext:
    """What a channel tells its codec about the message being sent."""

    microbatch: int = 0
    """Micro-batch index within the iteration."""
    iteration: int = 0
    """Training iteration (optimizer step) the message belongs to."""
    sample_ids: torch.Tensor | None = None
    """(B,) int64 dataset indices of the samples in this micro-batch (activation caches)."""


class Codec:
    """Base class: stateless by default; override the state methods when there is state.
    Every hook a channel calls is declared here with its no-op default."""

    name: str = "?"

    def payload_spec(self, shape: torch.Size, dtype: torch.dtype) -> PayloadSpec:
        """Shapes and dtypes of the payload for an input of `shape`; never depends on data."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor, ctx: CodecContext) -> list[torch.Tensor]:
        raise NotImplementedError

    def decode(self, payload: list[torch.Tensor], shape, dtype, ctx: CodecContext) -> torch.Tensor:
        raise NotImplementedError

    def pass_through(self, x: torch.Tensor, ctx: CodecContext) -> torch.Tensor:
        """Sender side of a message the channel sends uncompressed: what to send instead of x
        (default x itself). Error-feedback codecs may deliver their pending error here."""
        return x

    def observe(self, x: torch.Tensor, ctx: CodecContext) -> None:
        """An uncompressed training message crossed the channel: codecs with caches (delta)
        record it, on both ends."""

    def error(self, shape) -> torch.Tensor | None:
        """The error-feedback buffer for messages of `shape` (LEP), or None."""
        return None

    def describe(self) -> str | None:
        """One line about the codec's resources printed at start (caches), or None."""
        return None

    def close(self) -> None:
        """Release resources (disk-backed activation caches delete their files)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass

    def raw_nbytes(self, x: torch.Tensor) -> int:
        """Bytes of the uncompressed message `x` stands for (the log line's ratio is against
        them): x itself, except where the model sends a narrower tensor in its place (the
        subspace coefficients)."""
        return x.numel() * x.element_size()

    def payload_nbytes(self, shape, dtype) -> int:
        """Bytes on the wire for one message of this shape (from payload_spec)."""
        return sum(math.prod(map(int, s)) * torch.empty((), dtype=d).element_size()
                   for s, d in self.payload_spec(torch.Size(shape), dtype))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class StepCodec(Codec):
    """A flat codec driven by the training step (CocktailSGD's rolling mask, SparseLoCo's
    chunks): subclasses give compress(x, step) and decompress(payload, numel, step, dtype);
    as a Codec the step is ctx.iteration. Its state is the stochastic-rounding generator
    `self.rng` (None: rounding to nearest, no state)."""

    rng = None

    def encode(self, x, ctx):
        return self.compress(x, ctx.iteration)

    def decode(self, payload, shape, dtype, ctx):
        numel = math.prod(map(int, shape))
        return self.decompress(payload, numel, ctx.iteration, dtype).reshape(shape)

    def state_dict(self):
        return {} if self.rng is None else self.rng.state_dict()

    def load_state_dict(self, sd):
        if self.rng is not None:
            self.rng.load_state_dict(sd)


def payload_bytes(payload: list[torch.Tensor]) -> int:
    """Bytes a payload puts on the wire: sum of numel * element_size."""
    return sum(t.numel() * t.element_size() for t in payload)


def check_payload(payload: list[torch.Tensor], spec: PayloadSpec) -> None:
    """Raise if `payload` does not match `spec` exactly (shape and dtype of every tensor)."""
    if len(payload) != len(spec):
        raise ValueError(f"payload has {len(payload)} tensors, spec has {len(spec)}")
    for i, (t, (shape, dtype)) in enumerate(zip(payload, spec)):
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            raise ValueError(f"payload[{i}] is {tuple(t.shape)} {t.dtype}, "
                             f"spec says {tuple(shape)} {dtype}")


REGISTRY: dict[str, Callable[..., Codec]] = {}


def register(name: str):
    """Class decorator: make a codec constructible by `get_codec(name, **kwargs)`."""
    def deco(cls):
        if name in REGISTRY:
            raise ValueError(f"codec name {name!r} registered twice")
        REGISTRY[name] = cls
        return cls
    return deco


def get_codec(name: str, **kwargs) -> Codec:
    """Build the codec registered as `name` with its constructor's keyword arguments."""
    if name not in REGISTRY:
        raise KeyError(f"unknown codec {name!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[name](**kwargs)


def parse_dtype(dtype) -> torch.dtype | None:
    """'float16' / 'fp16' / 'bf16' / torch.dtype / None -> torch.dtype or None."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(names)}")
    return names[dtype]


@register("identity")
class IdentityCodec(Codec):
    """Baseline: the payload is the tensor itself, so decoding is exact."""

    name = "identity"

    def payload_spec(self, shape, dtype):
        return [(tuple(shape), dtype)]

    def encode(self, x, ctx):
        return [x.contiguous()]

    def decode(self, payload, shape, dtype, ctx):
        return payload[0].reshape(shape).to(dtype)
