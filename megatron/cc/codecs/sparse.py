"""CocktailSGD compression of a flat tensor: random rolling mask -> top-k -> b-bit values.

At step `step` (stride = round(1 / random_ratio)) the subset is positions offset + stride i,
n_rand = ceil(numel / stride) of them, offset = (seed + step) % stride: every replica computes
it from (numel, step). Top-k by magnitude inside it, k = min(n_rand, max(1, round(topk_ratio
n_rand))), goes as an n_rand-bit mask (empty when k = n_rand), and the kept values as `bits`-bit
codes with one 16-bit scale per bucket (quant.py).

Payload, fixed by numel: [mask uint8 (ceil(n_rand/8),), codes uint8 (ceil(k*bits/8),),
scales (ceil(k/bucket_size),)].
`decompress` gives the dense flat tensor; the sender can call it on its own payload to learn
exactly what it sent (CocktailSGD's implicit error feedback).
"""
from __future__ import annotations

import math

import torch

from .base import StepCodec, parse_dtype, register
from . import fused
from megatron.cc.kernels import dispatch
from megatron.cc.numerics.quant import pack_bits, packed_nbytes, quantize
from megatron.cc.numerics.rng import DeviceGenerator


@register("cocktail")
class CocktailCodec(StepCodec):
    """CocktailSGD sparsify + quantise; pure: compress(x, step) / decompress(payload, numel, step).

    Args:
        random_ratio: share p of entries in the random rolling subset (0.1).
        topk_ratio: share of the subset kept by magnitude (0.2).
        bits: bits per kept value (4).
        bucket_size: values per scale (128).
        stochastic: stochastic rounding of the values (generator state in state_dict).
        seed: offsets the rolling mask (must be equal on all replicas) and seeds the rounding.
        scale_dtype: "float16" or "bfloat16".
        scheme: value quantiser, "fitted" (default), "absmax" or "seed" (quant.py).
    As a Codec, encode/decode use ctx.iteration as the step.
    """

    name = "cocktail"

    def __init__(self, random_ratio: float = 0.1, topk_ratio: float = 0.2, bits: int = 4,
                 bucket_size: int = 128, stochastic: bool = False, seed: int = 0,
                 scale_dtype="float16", scheme: str = "fitted"):
        if not 0 < random_ratio <= 1 or not 0 < topk_ratio <= 1:
            raise ValueError(f"random_ratio and topk_ratio must be in (0, 1], got "
                             f"{random_ratio}, {topk_ratio}")
        if not 1 <= bits <= 8 or bucket_size < 1:
            raise ValueError(f"bits must be in 1..8 and bucket_size >= 1, got {bits}, {bucket_size}")
        self.stride = max(1, round(1.0 / random_ratio))
        self.topk_ratio, self.bits, self.bucket_size, self.seed = topk_ratio, bits, bucket_size, seed
        self.scheme = scheme
        self.scale_dtype = parse_dtype(scale_dtype)
        self.rng = DeviceGenerator(seed) if stochastic else None

    # ------------------------------------------------------------------------- layout
    def sizes(self, numel: int) -> tuple[int, int]:
        """(n_rand, k) for a tensor of numel values."""
        n_rand = -(-numel // self.stride)
        k = min(n_rand, max(1, math.floor(self.topk_ratio * n_rand + 0.5))) if n_rand else 0
        return n_rand, k

    def random_indices(self, numel: int, step: int, device=None) -> torch.Tensor:
        """(n_rand,) int64 positions of the rolling subset at this step (may end past numel)."""
        offset = (self.seed + step) % self.stride
        return offset + self.stride * torch.arange(self.sizes(numel)[0], dtype=torch.long,
                                                   device=device)

    def flat_spec(self, numel: int):
        n_rand, k = self.sizes(numel)
        return [((0 if k == n_rand else packed_nbytes(n_rand, 1),), torch.uint8),
                ((packed_nbytes(k, self.bits),), torch.uint8),
                ((-(-k // self.bucket_size),), self.scale_dtype)]

    def payload_spec(self, shape, dtype):
        return self.flat_spec(math.prod(shape))

    # -------------------------------------------------------------------------- codec
    def compress(self, x: torch.Tensor, step: int) -> list[torch.Tensor]:
        # Fixed-size gathers and selects only: boolean indexing would sync the host.
        flat = x.reshape(-1)
        numel = flat.numel()
        n_rand, k = self.sizes(numel)
        gen = None if self.rng is None else self.rng.get(flat.device)
        sparse = None
        if fused.enabled(flat):
            from megatron.cc.kernels import sparse
            vals, mag = sparse.sample(self, flat, step, need_mag=k < n_rand)
        else:
            idx = self.random_indices(numel, step, flat.device)
            valid = idx < numel
            vals = torch.where(valid, flat[idx.clamp(max=max(numel - 1, 0))].float(), 0.0)
            # pads lose against every real entry
            mag = torch.where(valid, vals.abs(), -1.0) if k < n_rand else None
        if k == n_rand:   # everything sampled is kept (a pad, if any, carries 0): no mask
            packed, scales = self._values(vals, gen)
            return [torch.empty(0, dtype=torch.uint8, device=flat.device), packed, scales]
        keep = mag.topk(k, sorted=False).indices.sort().values
        if sparse is not None:
            mask, kept = sparse.keep(vals, keep)
        else:
            # index_fill_: `mask[keep] = 1` would copy a host scalar up (a sync on CUDA)
            mask = pack_bits(torch.zeros(n_rand, dtype=torch.uint8, device=flat.device)
                             .index_fill_(0, keep, 1), 1)
            kept = vals[keep]
        packed, scales = self._values(kept, gen)
        return [mask, packed, scales]

    def _values(self, vals: torch.Tensor, gen) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed codes, scales) of the kept values: one Triton pass each way on CUDA when
        rounding to nearest (fused.py), quant.py's eager functions otherwise."""
        if gen is None:
            return fused.encode(vals, self.bits, "bucket", self.bucket_size, self.scale_dtype,
                                self.scheme)
        codes, scales = quantize(vals, self.bits, "bucket", self.bucket_size, self.scale_dtype,
                                 gen, self.scheme)
        return pack_bits(codes, self.bits), scales

    def decompress(self, payload: list[torch.Tensor], numel: int, step: int,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dense values; a mask with other than k set bits is not detected here (checking it
        would sync the host): `mask_ok` tells."""
        if fused.enabled(payload[1]) and dtype in dispatch.OUT_KIND:
            from megatron.cc.kernels import sparse
            return sparse.decompress(self, payload, numel, step, dtype)
        n_rand, k = self.sizes(numel)
        device = payload[0].device
        # in `dtype` at once: each value rounds once, as a dense fp32 copy cast would
        vals = fused.decode(payload[1], payload[2], self.bits, (k,), "bucket", self.bucket_size,
                            dtype, self.scheme)
        idx = self.random_indices(numel, step, device)
        if k < n_rand:
            mask = fused.unpack_bits(payload[0], 1, n_rand).bool()
            # the j-th set bit of the mask holds value j: its rank is the running count
            rank = torch.cumsum(mask, 0).sub_(1).clamp_(0, max(k - 1, 0))
            vals = torch.where(mask, vals[rank], 0) if k else vals.new_zeros(n_rand)
        # Pads (positions >= numel) land in a tail that is cut off.
        out = torch.zeros(numel + self.stride, dtype=dtype, device=device)
        out[idx] = vals
        return out[:numel]

    def mask_ok(self, payload: list[torch.Tensor], numel: int) -> bool:
        """True when the payload's mask selects exactly k entries (a host sync)."""
        n_rand, k = self.sizes(numel)
        if k == n_rand:
            return payload[0].numel() == 0
        return int(fused.unpack_bits(payload[0], 1, n_rand).sum()) == k
