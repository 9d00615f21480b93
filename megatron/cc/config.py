"""Configuration of every compression channel (fwd, bwd, dp, emb), one dataclass.

The library (megatron.cc) receives this object in constructors and never reads flags itself;
the training driver generates the flags from these fields (megatron.training.config_flags).
"""
from dataclasses import dataclass

from megatron.training.config_flags import ConfigError, flag  # noqa: F401  (ConfigError for validate)


@dataclass
class CompressionConfig:
    check_comp_ratio: bool = flag(
        False, "Log bytes sent per channel and the ratio against uncompressed bytes "
               "(always counted; this also prints a per-channel summary at the end).")

    def validate(self, pp: int, dp: int, tp: int) -> None:
        pass
