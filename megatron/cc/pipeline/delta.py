"""--forward-compress-method delta: AC-SGD, the b-bit change against a per-sample activation
cache both ends keep (megatron/cc/codecs/delta.py)."""
import os
from dataclasses import dataclass
from typing import Optional

from megatron.cc.codecs.delta import DeltaCodec
from megatron.cc.common.config_fields import ConfigError, flag
from megatron.cc.pipeline.base import PpMethod


@dataclass
class ActivationCache:
    """The activation cache's flags, one config section that delta and delta-lowbits share."""
    max_activation_cache_size: Optional[int] = flag(
        None, "delta*: samples each activation cache holds (least recently used evicted "
              "beyond). Default: every training sample the replica will see. Each rank holds "
              "one cache per link end; the size is printed at start-up and a cache that does "
              "not fit is refused.")
    activation_cache_location: str = flag(
        "ram", "delta*: 'ram' (host memory; pinned, with asynchronous copies, when training "
               "on GPUs), 'device' (GPU memory), or 'disk:DIR' for memory-mapped files in the "
               "existing directory DIR (one per cache, deleted at exit).")
    activation_cache_dtype: str = flag(
        "fp16", "delta: element type of the activation cache (AC-SGD's fp16 by default: half "
                "fp32's memory, same loss as fp32 measured, since each delta is taken against "
                "the rounded copy both ends hold; values saturate at +-65504). bf16: same "
                "memory, fp32's range; fp32: twice the memory. Both ends round alike, so their "
                "caches stay identical. (delta-lowbits stores --forward-bits-act bits instead.)",
        choices=["fp32", "fp16", "bf16"])


class Delta(PpMethod):
    name = "delta"
    codec_class = DeltaCodec
    quantises = True
    caches = True
    sections = (ActivationCache,)

    @staticmethod
    def check(c, pp: int) -> None:
        if not c.activation_cache:
            for name in ("max_activation_cache_size", "activation_cache_location",
                         "activation_cache_dtype"):
                if getattr(c, name) != ActivationCache.__dataclass_fields__[name].default:
                    raise ConfigError(f"--{name.replace('_', '-')} configures the delta "
                                      f"codecs' activation cache, but --forward-compress-method "
                                      f"is {c.forward_compress_method}")
        if c.forward_compress_method == "delta-lowbits" and c.activation_cache_dtype != "fp16":
            raise ConfigError(f"--activation-cache-dtype {c.activation_cache_dtype} sets the "
                              f"dense cache of --forward-compress-method delta; delta-lowbits "
                              f"stores its cache at --forward-bits-act bits")
        n = c.max_activation_cache_size
        if n is not None and n < 1:
            raise ConfigError(f"--max-activation-cache-size must be >= 1, got {n}")
        loc = c.activation_cache_location
        if loc not in ("ram", "device"):
            if not loc.startswith("disk:") or not os.path.isdir(loc[5:]):
                raise ConfigError(f"--activation-cache-location must be 'ram', 'device' or "
                                  f"'disk:DIR' with an existing directory DIR, got {loc!r}")

    @staticmethod
    def cache_kw(c) -> dict:
        return dict(cache_dtype=c.activation_cache_dtype)

    @classmethod
    def codec(cls, c, spec):
        return cls.codec_class(bits=c.forward_bits, capacity=spec.capacity,
                               sample_shape=spec.sample_shape,
                               storage=c.activation_cache_location,
                               ram_limit_bytes=spec.ram_limit, stochastic=c.stochastic_rounding,
                               seed=spec.seed, device=spec.device, scheme=c.quant_scheme,
                               **cls.cache_kw(c))
