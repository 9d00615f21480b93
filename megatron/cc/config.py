"""Configuration of every compression channel (fwd, bwd, dp, emb, tp): one dataclass instance
per plug-in and per set of shared flags (a section), composed by CompressionConfig.

Each section declares its flags once, as fields with help and bounds; the driver turns every
section's fields into flat flags (megatron.training.config.config_flags). `c.of(Fixpoint)` is
the fixpoint plug-in's instance; `c.forward_bits` reads the same field by its flag's name. The
library receives this object in constructors and never reads flags itself.
"""
import dataclasses
from dataclasses import dataclass
from typing import Optional

from megatron.cc.common.config_fields import (ConfigError, check_bounds, field_default, flag,
                                             flag_fields)
from megatron.cc.data_parallel.registry import DpRules, dp_sections
from megatron.cc.embedding.registry import EmbRules, emb_sections
from megatron.cc.pipeline.registry import LowRank, PpRules, Subspace, pp_sections
from megatron.cc.tensor_parallel.powersgd import TpPowerSGD


@dataclass
class RunOptions:
    """What applies to every channel: logging, the compressors' seed, --compression auto."""
    check_comp_ratio: bool = flag(
        False, "Log bytes sent per channel and the ratio against uncompressed bytes "
               "(always counted; this also prints a per-channel summary at the end).")
    check_comp_speed: bool = flag(
        False, "Log compression / decompression speed per channel on the log line (GB/s of "
               "uncompressed bytes, mean over messages and ranks; codec compute only, not the "
               "collectives): every pipeline codec, --grad-comp-type RandomizedSVD and "
               "--emb-grad-comp. CUDA events read once complete (no sync); wall clock on CPU.")
    comp_seed: Optional[int] = flag(
        None, "Seed of the low-rank compressors' random draws, equal on every rank: the "
              "initial Q of CB, of --grad-comp's PowerSGD and of --emb-grad-comp, and the "
              "RandomizedSVD projections. Default: --seed (Optimus-CC: 714, independent of "
              "--seed). Saved in checkpoints; a resume must keep it.")

    # ---- --compression auto: the planner chooses the codecs
    #      (megatron/training/compression/auto_compression.py)
    compression: str = flag(
        "manual", "manual: the compression flags given (today's behaviour). auto: at start-up "
                  "probe every channel's link (bandwidth, latency) and the compute rate, run the "
                  "planner of tools/plan_compression.py on the launched tp/pp/dp layout, print "
                  "the plan and train with its fastest candidate within --quality-budget "
                  "(codecs, dp mode and --overlap-* flags; give none of them by hand).",
        choices=["manual", "auto"])
    quality_budget: float = flag(
        2.0, "--compression auto: largest expected validation-loss gap in percent "
             "(megatron/cc/plan/quality.py's measured gaps; unmeasured schemes are left out).")


class CompressionConfig(DpRules, PpRules, EmbRules):
    """Every section's instance; built from flat field values (`CompressionConfig(
    forward_bits=4)`, unknown names refused), read and written by flat name or by section."""

    @staticmethod
    def section_types() -> tuple:
        """The sections, in --help order, from the channels' registries as they are now."""
        return (*emb_sections(), *pp_sections(), *dp_sections(), RunOptions, TpPowerSGD)

    def __init__(self, **values):
        sections = {}
        for t in self.section_types():
            names = {f.name for f in dataclasses.fields(t)}
            sections[t] = t(**{k: values.pop(k) for k in list(values) if k in names})
        if values:
            raise TypeError(f"CompressionConfig has no field {', '.join(sorted(values))}")
        self.__dict__["sections"] = sections
        self.__dict__["_owner"] = {f.name: s for s in sections.values()
                                   for f in dataclasses.fields(s)}
        self.fold_dp_mode()
        LowRank.fold(self)
        Subspace.fold(self)

    def of(self, section: type):
        """The instance of one section (a plug-in class or a shared-flags dataclass)."""
        return self.sections[section]

    def __getattr__(self, name):   # a field by its flat name (only called when not found)
        try:
            return getattr(self.__dict__["_owner"][name], name)
        except KeyError:
            raise AttributeError(f"CompressionConfig has no field {name!r}") from None

    def __setattr__(self, name, value):
        if name not in self._owner:
            raise AttributeError(f"CompressionConfig has no field {name!r}")
        setattr(self._owner[name], name, value)

    def values(self) -> dict:
        """{field: value} of every flag, in --help order (values as they are)."""
        return {f.name: getattr(self, f.name) for _, f in flag_fields(type(self))}

    def to_dict(self) -> dict:
        """Flat, nested dataclass values as dicts (dataclasses.asdict): what checkpoints keep."""
        out = {}
        for s in self.sections.values():
            out.update(dataclasses.asdict(s))
        return {name: out[name] for name in self.values()}

    def replace(self, **changes) -> "CompressionConfig":
        return type(self)(**{**self.values(), **changes})

    __copy__ = replace   # a copy's sections are its own, as a dataclass copy's fields

    @classmethod
    def default(cls, name: str):
        return field_default(next(f for _, f in flag_fields(cls) if f.name == name))

    def __eq__(self, other):
        return type(other) is type(self) and self.values() == other.values()

    def __repr__(self) -> str:
        return f"CompressionConfig({', '.join(f'{k}={v!r}' for k, v in self.values().items())})"

    def validate(self, pp: int, dp: int, tp: int) -> None:
        self.validate_auto()
        check_bounds(self)   # the fields' declared bounds, whichever method is on
        self.validate_pipeline_codecs(pp)
        self.validate_dp_mode(pp, dp)
        self.validate_emb(pp)
        self.of(TpPowerSGD).check(tp)

    # fields --compression auto leaves to the user: logging, seeds, transports, emulation
    AUTO_KEEPS = ("compression", "quality_budget", "check_comp_ratio", "check_comp_speed",
                  "comp_seed", "dp_backend", "hetero")

    def validate_auto(self) -> None:
        """--compression auto owns every codec field: one given by hand would be overridden
        or would change what the planner predicted, so it is refused by name."""
        if self.quality_budget < 0:
            raise ConfigError(f"--quality-budget is a loss gap in percent, >= 0; got "
                              f"{self.quality_budget}")
        if self.compression == "manual":
            if self.quality_budget != self.default("quality_budget"):
                raise ConfigError("--quality-budget is the budget of --compression auto; add "
                                  "--compression auto or drop it")
            return
        # the spellings folded at parse time first, so the message names the flag given
        fields = [f for _, f in flag_fields(type(self))]
        for f in sorted(fields, key=lambda f: f.name not in LowRank.FOLDED):
            value = getattr(self, f.name)
            if f.name not in self.AUTO_KEEPS and value != f.default:
                given = value if f.metadata.get("spellings") else f"--{f.name.replace('_', '-')}"
                raise ConfigError(f"{given} is chosen by --compression auto; drop it, or use "
                                  f"--compression manual")
