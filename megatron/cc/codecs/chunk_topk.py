"""SparseLoCo's codec (Sarfi et al. 2025): top-k per chunk, compact indices, b-bit values.

A flat vector of n values is cut into m = ceil(n / C) chunks of C (the last zero-padded; a pad
never wins). Each chunk keeps its k = min(C, max(1, round(density * C))) largest-magnitude
entries: their positions in ascending order, i = ceil(log2 C) bits each, and their values as
`bits`-bit codes with one 16-bit scale per chunk (quant.py), all bit-packed.

Payload, fixed by n: [indices uint8 (ceil(m*k*i/8),), codes uint8 (ceil(m*k*bits/8),),
scales fp16 (m,)]; at k = C no indices are sent. Decompression gives the dense flat tensor;
the sender decodes its own payload to learn what it sent (error feedback). No host syncs.
On CUDA the magnitudes, the gather with the position stream, and the decode run as kernels
(megatron/cc/kernels/chunk_topk.py).
"""
from __future__ import annotations

import math

import torch

from . import fused
from .base import StepCodec, parse_dtype
from megatron.cc.kernels import dispatch
from megatron.cc.numerics.quant import pack_bits, packed_nbytes, quantize
from megatron.cc.numerics.rng import DeviceGenerator


def index_bits(chunk_size: int) -> int:
    """Bits of a position inside a chunk of `chunk_size` values: ceil(log2 C) (0 for C = 1)."""
    return max(chunk_size - 1, 0).bit_length()


def pack_uints(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Non-negative ints < 2**bits (any bits >= 1) as one little-endian bit stream of
    ceil(numel * bits / 8) bytes (value j in stream bits [j*bits, (j+1)*bits))."""
    shifts = torch.arange(bits, dtype=torch.int64, device=values.device)
    stream = (values.reshape(-1, 1).long() >> shifts) & 1            # (numel, bits)
    return fused.pack_bits(stream.to(torch.uint8), 1)


def unpack_uints(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of `pack_uints`: (numel,) int64."""
    shifts = torch.arange(bits, dtype=torch.int64, device=packed.device)
    stream = fused.unpack_bits(packed, 1, numel * bits).view(numel, bits).long()
    return (stream << shifts).sum(dim=1)


class ChunkTopKCodec(StepCodec):
    """Chunked top-k + compact indices + b-bit values; flat contract compress / decompress
    (data_parallel/flat_codecs.py). Not in the codec registry: it serves the dp exchange only.

    Args:
        density: share of each chunk kept, in (0, 1] (1/64: k = 64 of 4096).
        chunk_size: C, values per chunk (4096); positions cost ceil(log2 C) bits.
        bits: bits per kept value, 1..8 (2).
        stochastic / seed: stochastic rounding of the values (generator in state_dict).
        scheme: value quantiser of quant.py ("fitted" default, "absmax", "seed").
        scale_dtype: "float16" or "bfloat16", one scale per chunk.
    """

    name = "chunk_topk"

    def __init__(self, density: float = 1 / 64, chunk_size: int = 4096, bits: int = 2,
                 stochastic: bool = False, seed: int = 0, scheme: str = "fitted",
                 scale_dtype="float16"):
        if not 0 < density <= 1:
            raise ValueError(f"density must be in (0, 1], got {density}")
        if chunk_size < 1 or not 1 <= bits <= 8:
            raise ValueError(f"chunk_size must be >= 1 and bits in 1..8, got {chunk_size}, {bits}")
        self.C, self.bits, self.scheme = chunk_size, bits, scheme
        self.k = min(chunk_size, max(1, math.floor(density * chunk_size + 0.5)))
        self.ibits = index_bits(chunk_size)
        self.scale_dtype = parse_dtype(scale_dtype)
        self.rng = DeviceGenerator(seed) if stochastic else None

    # ------------------------------------------------------------------------- layout
    def chunks(self, numel: int) -> int:
        return -(-numel // self.C)

    def dense(self) -> bool:
        """Every entry kept (k = C): values in order, no indices."""
        return self.k == self.C

    def flat_spec(self, numel: int):
        m, k = self.chunks(numel), self.k
        idx = 0 if self.dense() else packed_nbytes(m * k * self.ibits, 1)
        return [((idx,), torch.uint8), ((packed_nbytes(m * k, self.bits),), torch.uint8),
                ((m,), self.scale_dtype)]

    def nbytes(self, numel: int) -> int:
        """Payload bytes for a vector of `numel` values (the module docstring's formula)."""
        return sum(math.prod(s) * dt.itemsize for s, dt in self.flat_spec(numel))

    def payload_spec(self, shape, dtype):
        return self.flat_spec(math.prod(shape))

    # -------------------------------------------------------------------------- codec
    def compress(self, x: torch.Tensor, step: int = 0) -> list[torch.Tensor]:
        flat = x.reshape(-1)
        n, m, k = flat.numel(), self.chunks(flat.numel()), self.k
        gen = None if self.rng is None else self.rng.get(flat.device)
        if self.dense():
            vals = torch.nn.functional.pad(flat.float(), (0, m * self.C - n))
            idx = torch.empty(0, dtype=torch.uint8, device=flat.device)
        elif n and fused.enabled(flat):
            from megatron.cc.kernels import chunk_topk
            idx, vals = chunk_topk.compress(self, flat)
        else:
            flat = flat.float()
            # |x| written straight into the padded buffer; pads (-1) lose to every real entry
            mag = torch.full((m * self.C,), -1.0, device=flat.device)
            torch.abs(flat, out=mag[:n])
            keep = mag.view(m, self.C).topk(k, dim=1, sorted=False).indices.sort(dim=1).values
            # the kept values read from x itself; a pad is kept only when the last chunk has
            # fewer than k real entries (known from sizes), and then reads as 0
            at = keep + torch.arange(0, m * self.C, self.C, device=flat.device)[:, None]
            if n - (m - 1) * self.C >= k:
                vals = flat[at]
            else:
                vals = torch.where(at < n, flat[at.clamp(max=n - 1)], 0.0)
            idx = pack_uints(keep, self.ibits)
        if gen is None:   # round to nearest: the fused kernels on CUDA
            return [idx, *fused.encode(vals.reshape(-1), self.bits, "bucket", k,
                                       self.scale_dtype, self.scheme)]
        codes, scales = quantize(vals.reshape(-1), self.bits, "bucket", k, self.scale_dtype,
                                 gen, self.scheme)
        return [idx, pack_bits(codes, self.bits), scales]

    def decompress(self, payload: list[torch.Tensor], numel: int, step: int = 0,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if fused.enabled(payload[1]) and dtype in dispatch.OUT_KIND:
            from megatron.cc.kernels import chunk_topk
            return chunk_topk.decompress(self, payload, numel, dtype)
        m, k = self.chunks(numel), self.k
        device = payload[1].device
        vals = fused.decode(payload[1], payload[2], self.bits, (m * k,), "bucket", k,
                            torch.float32, self.scheme).view(m, k)
        if self.dense():
            out = vals.reshape(-1)
        else:
            keep = unpack_uints(payload[0], self.ibits, m * k).view(m, k)
            out = torch.zeros(m, self.C, dtype=torch.float32, device=device)
            out.scatter_(1, keep, vals)
            out = out.reshape(-1)
        return out[:numel].to(dtype)   # pads (positions >= numel) are cut off
