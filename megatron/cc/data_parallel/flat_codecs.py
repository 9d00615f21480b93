"""Codecs for flat parameter-delta vectors on the dp channel (CocktailSGD, DiLoCo).

Contract: codecs/base.py's StepCodec, as CocktailCodec (codecs/sparse.py):
    compress(x, step) -> list of payload tensors, sizes fixed by x.numel() alone
    decompress(payload, numel, step) -> fp32 (numel,)
    flat_spec(numel) -> [(shape, dtype), ...] of the payload
    state_dict / load_state_dict: the stochastic-rounding generator `rng`, if any
`step` lets a codec vary with the synchronisation round (CocktailSGD's rolling mask).
The sender calls decompress on its own payload to learn exactly what it sent (error feedback).

Names (--diloco-compression): none (fp32), fp16, int8 (8-bit, one fp16 scale per 128 values),
fixpoint-b (b-bit, 1..8, same buckets), cocktail (random rolling + top-k + b-bit).
"""
import torch

from megatron.cc.codecs import fused
from megatron.cc.codecs.base import StepCodec
from megatron.cc.numerics.quant import (dequantize, pack_bits, packed_nbytes, quantize,
                                        unpack_bits)
from megatron.cc.numerics.rng import DeviceGenerator
from megatron.cc.codecs.sparse import CocktailCodec


class CastCodec(StepCodec):
    """The values in another float dtype (fp32: lossless, fp16: round to nearest)."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def flat_spec(self, numel: int):
        return [((numel,), self.dtype)]

    def compress(self, x: torch.Tensor, step: int):
        return [x.reshape(-1).to(self.dtype)]

    def decompress(self, payload, numel: int, step: int, dtype=None) -> torch.Tensor:
        return payload[0].float()


class BucketFixpointCodec(StepCodec):
    """b-bit fixpoint (quant.py's `scheme`), one fp16 scale per bucket of `bucket_size` values,
    bit-packed."""

    def __init__(self, bits: int, bucket_size: int = 128, stochastic: bool = False, seed: int = 0,
                 scheme: str = "fitted"):
        if not 1 <= bits <= 8:
            raise ValueError(f"fixpoint bits must be in 1..8, got {bits}")
        self.bits, self.bucket_size, self.scheme = bits, bucket_size, scheme
        self.rng = DeviceGenerator(seed) if stochastic else None

    def flat_spec(self, numel: int):
        return [((packed_nbytes(numel, self.bits),), torch.uint8),
                ((-(-numel // self.bucket_size),), torch.float16)]

    def compress(self, x: torch.Tensor, step: int):
        if self.rng is None:   # round to nearest: three kernels on CUDA (fused.py)
            return list(fused.encode(x.reshape(-1), self.bits, "bucket", self.bucket_size,
                                     torch.float16, self.scheme))
        codes, scales = quantize(x.reshape(-1), self.bits, "bucket", self.bucket_size,
                                 torch.float16, self.rng.get(x.device), self.scheme)
        return [pack_bits(codes, self.bits), scales]

    def decompress(self, payload, numel: int, step: int, dtype=None) -> torch.Tensor:
        return fused.decode(payload[0], payload[1], self.bits, (numel,), "bucket",
                            self.bucket_size, torch.float32, self.scheme)


def parse_fixpoint_bits(name: str):
    """'int8' -> 8, 'fixpoint-4' -> 4, anything else -> None."""
    if name == "int8":
        return 8
    if name.startswith("fixpoint-"):
        try:
            return int(name[len("fixpoint-"):])
        except ValueError:
            return None
    return None


def make_flat_codec(name: str, *, seed: int = 0, stochastic: bool = False, bits: int = 4,
                    random_ratio: float = 0.1, topk_ratio: float = 0.2, bucket_size: int = 128,
                    scheme: str = "fitted"):
    """A flat codec by name; `bits`/ratios configure cocktail, fixpoint-b carries its bits."""
    if name == "none":
        return CastCodec(torch.float32)
    if name == "fp16":
        return CastCodec(torch.float16)
    if name == "cocktail":
        return CocktailCodec(random_ratio, topk_ratio, bits, bucket_size, stochastic, seed,
                             scheme=scheme)
    b = parse_fixpoint_bits(name)
    if b is None or not 1 <= b <= 8:
        raise ValueError(f"unknown dp codec {name!r}; expected one of none, fp16, int8, "
                         f"fixpoint-<bits 1..8>, cocktail")
    return BucketFixpointCodec(b, bucket_size, stochastic, seed, scheme)
