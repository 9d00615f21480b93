"""CocktailSGD compression of a flat tensor: random rolling mask -> top-k -> b-bit values.

For a tensor of `numel` values at step `step` (stride = round(1 / random_ratio)):
1. Random rolling subset: positions offset + stride * i, i = 0 .. n_rand - 1, with
   n_rand = ceil(numel / stride) and offset = (seed + step) % stride. Every replica computes
   it from (numel, step) alone. With offset > 0 the last slot may fall past the end; it is
   then a pad that is never selected unless k exceeds the real entries (and is dropped then).
2. Top-k by magnitude inside the subset, k = min(n_rand, max(1, round(topk_ratio * n_rand))),
   sent as an n_rand-bit mask over the subset.
3. The k kept values, in subset order, quantised symmetric fixpoint to `bits` bits with one
   16-bit scale per bucket of `bucket_size` (128) values, optional stochastic rounding.

Payload (fixed by numel alone):
    [mask uint8 (ceil(n_rand/8),), codes uint8 (ceil(k*bits/8),), scales fp16 (ceil(k/bucket),)]
    bytes = ceil(n_rand/8) + ceil(k*bits/8) + 2*ceil(k/bucket_size)

Decompression gives the dense flat tensor: kept values at their positions, zeros elsewhere.
The sender can call `decompress` on its own payload to learn exactly what it sent
(CocktailSGD keeps the rest in its parameters as implicit error feedback).
"""
from __future__ import annotations

import math

import torch

from .base import Codec, parse_dtype, register
from .quant import dequantize, pack_bits, packed_nbytes, quantize, unpack_bits


@register("cocktail")
class CocktailCodec(Codec):
    """CocktailSGD sparsify + quantise; pure: compress(x, step) / decompress(payload, numel, step).

    Args:
        random_ratio: share p of entries in the random rolling subset (0.1).
        topk_ratio: share of the subset kept by magnitude (0.2).
        bits: bits per kept value (4).
        bucket_size: values per scale (128).
        stochastic: stochastic rounding of the values (generator state in state_dict).
        seed: offsets the rolling mask (must be equal on all replicas) and seeds the rounding.
        scale_dtype: "float16" or "bfloat16".
    As a Codec, encode/decode use ctx.iteration as the step.
    """

    name = "cocktail"

    def __init__(self, random_ratio: float = 0.1, topk_ratio: float = 0.2, bits: int = 4,
                 bucket_size: int = 128, stochastic: bool = False, seed: int = 0,
                 scale_dtype="float16"):
        if not 0 < random_ratio <= 1 or not 0 < topk_ratio <= 1:
            raise ValueError(f"random_ratio and topk_ratio must be in (0, 1], got "
                             f"{random_ratio}, {topk_ratio}")
        if not 1 <= bits <= 8 or bucket_size < 1:
            raise ValueError(f"bits must be in 1..8 and bucket_size >= 1, got {bits}, {bucket_size}")
        self.stride = max(1, round(1.0 / random_ratio))
        self.topk_ratio, self.bits, self.bucket_size, self.seed = topk_ratio, bits, bucket_size, seed
        self.scale_dtype = parse_dtype(scale_dtype)
        self.generator = torch.Generator().manual_seed(seed) if stochastic else None

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
        return [((packed_nbytes(n_rand, 1),), torch.uint8),
                ((packed_nbytes(k, self.bits),), torch.uint8),
                ((-(-k // self.bucket_size),), self.scale_dtype)]

    def payload_spec(self, shape, dtype):
        return self.flat_spec(math.prod(shape))

    # -------------------------------------------------------------------------- codec
    def compress(self, x: torch.Tensor, step: int) -> list[torch.Tensor]:
        flat = x.reshape(-1)
        numel = flat.numel()
        n_rand, k = self.sizes(numel)
        idx = self.random_indices(numel, step, flat.device)
        valid = idx < numel
        vals = flat.new_zeros(n_rand, dtype=torch.float32)
        vals[valid] = flat[idx[valid]].float()
        mag = vals.abs()
        mag[~valid] = -1.0  # pads lose against every real entry
        keep = mag.topk(k, sorted=False).indices.sort().values
        mask = flat.new_zeros(n_rand, dtype=torch.uint8)
        mask[keep] = 1
        codes, scales = quantize(vals[keep], self.bits, "bucket", self.bucket_size,
                                 self.scale_dtype, self.generator)
        return [pack_bits(mask, 1), pack_bits(codes, self.bits), scales]

    def decompress(self, payload: list[torch.Tensor], numel: int, step: int,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n_rand, k = self.sizes(numel)
        mask = unpack_bits(payload[0], 1, n_rand).bool()
        codes = unpack_bits(payload[1], self.bits, k)
        vals = dequantize(codes, payload[2], self.bits, (k,), "bucket", self.bucket_size)
        idx = self.random_indices(numel, step, mask.device)[mask]
        if idx.numel() != k:
            raise ValueError(f"cocktail mask has {idx.numel()} set bits, expected {k}")
        real = idx < numel
        out = vals.new_zeros(numel)
        out[idx[real]] = vals[real]
        return out.to(dtype)

    def encode(self, x, ctx):
        return self.compress(x, ctx.iteration)

    def decode(self, payload, shape, dtype, ctx):
        return self.decompress(payload, math.prod(shape), ctx.iteration, dtype).reshape(shape)

    def state_dict(self):
        return {} if self.generator is None else {"generator": self.generator.get_state()}

    def load_state_dict(self, sd):
        if self.generator is not None and "generator" in sd:
            self.generator.set_state(sd["generator"])
