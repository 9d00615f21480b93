"""The pipeline channels' registries: one plug-in per --forward-compress-method (pp-fwd) and
per --backward-compress-method (pp-bwd), one file each.

A plug-in (base.PpMethod) owns its flags as dataclass fields, their checks (`check`) and
`build(c, spec)`, which returns the finished link end (codec and policy); CompressionConfig
holds an instance of each (`pp_sections`). Adding a method: a file here and a line in FWD or
BWD.
"""
from dataclasses import dataclass
from typing import Optional

from megatron.cc.common.config_fields import ConfigError, channel_sections, flag
from megatron.cc.pipeline.base import LinkEnd, PpMethod, Warmup
from megatron.cc.pipeline.delta import Delta
from megatron.cc.pipeline.delta_lowbits import DeltaLowbits
from megatron.cc.pipeline.fixpoint import Fixpoint
from megatron.cc.pipeline.fixpoint_bwd import FixpointBackward
from megatron.cc.pipeline.lowrank import LowRank
from megatron.cc.pipeline.subspace import Subspace
from megatron.cc.pipeline.tah import TAH

FWD = {m.name: m for m in (PpMethod, Fixpoint, Delta, DeltaLowbits, TAH, Subspace)}
BWD = {m.name: m for m in (PpMethod, FixpointBackward, LowRank, Subspace)}

__all__ = ["BWD", "FWD", "LinkEnd", "LowRank", "PpRules", "Subspace", "pp_codec", "pp_link",
           "pp_method", "pp_sections", "Warmup"]


def pp_sections() -> tuple:
    """The pipeline channels' config dataclasses: the shared flags, then each method's
    sections and own fields (FWD's, then BWD's)."""
    return channel_sections(PpChannel, (*FWD.values(), *BWD.values()))


@dataclass
class PpChannel:   # the flags both pipeline channels share
    forward_compress_method: str = flag(
        "none", "Codec of the activations sent forward between pipeline stages: fixpoint "
                "(b-bit, one scale per hidden channel), delta / delta-lowbits (AC-SGD: the b-bit "
                "change against a per-sample activation cache kept on both ends), tah "
                "(TAH-Quant), subspace (Subspace Networks: the subspace-constrained model "
                "sends --subspace-rank coefficients per token both ways; see "
                "megatron/training/model/subspace.py). Validation passes always send uncompressed.",
        choices=FWD)
    backward_compress_method: str = flag(
        "none", "Codec of the activation gradients sent back: fixpoint (b-bit, no error "
                "feedback) or lowrank (Optimus-CC CB, the same as --inter-grad-comp, with "
                "its --inter-grad-comp-* / --use-error-feedback modifiers); subspace comes "
                "with --forward-compress-method subspace.", choices=BWD)
    stochastic_rounding: bool = flag(
        False, "fixpoint / delta quantisers round stochastically (unbiased) instead of to "
               "nearest; the generators are in the checkpoint.")
    quant_scheme: str = flag(
        "fitted", "Grid and scale of every b-bit quantiser (fixpoint / delta activations and "
                  "gradients, CocktailSGD values, the dp modes' int8 / fixpoint-b): fitted "
                  "(every one of the 2^b codes, symmetric, each group's scale chosen to minimise "
                  "its squared error; 1 bit = sign x mean|x|), absmax (the same grid with the "
                  "scale = max|x|: nothing clipped, |error| <= step/2), or seed (the AC-SGD / "
                  "CocktailSGD grid: 2^b codes from -2^(b-1) to 2^(b-1)-1 times max|x|/2^(b-1); "
                  "1 bit = sign x RMS). Stochastic rounding always scales by max|x|.",
        choices=["fitted", "absmax", "seed"])
    compress_warmup: Warmup = flag(Warmup(), "Pipeline channels send uncompressed at first "
                                   "(base.Warmup).", spellings={
        "--compress-warmup-iters": (Warmup.in_iters, "Pipeline channels send uncompressed for "
                                    "this many iterations (give this or --warmup-epochs)."),
        "--warmup-epochs": (Warmup.in_epochs, "The same warm-up in epochs of the training "
                            "split (activation caches fill); converted to whole iterations.")})


class PpRules:
    """The pipeline channels' rules over the whole CompressionConfig (its fields live in
    pp_sections())."""

    @property
    def compressed_backprop(self) -> bool:
        """CB on the bwd channel, asked for in either spelling."""
        return self.backward_compress_method == "lowrank"

    @property
    def activation_cache(self) -> bool:
        """The fwd codec keeps a per-sample cache (keyed by dataset index across epochs)."""
        return FWD[self.forward_compress_method].caches

    @property
    def uses_epochs(self) -> bool:
        """Training revisits a fixed set of samples epoch after epoch (see the Trainer)."""
        w = self.compress_warmup
        return self.activation_cache or (w.unit == "epochs" and w.amount > 0)

    def validate_pipeline_codecs(self, pp: int) -> None:
        fwd, bwd = self.forward_compress_method, self.backward_compress_method
        given = bwd != "none" and not (self.inter_grad_comp and bwd == "lowrank")   # as before
        if pp == 1 and (fwd != "none" or given):
            raise ConfigError(f"--forward-compress-method {fwd} / --backward-compress-method "
                              f"{bwd} compress what crosses pipeline stages; with "
                              f"--pipeline-model-parallel-size 1 nothing does")
        for plugin in (*FWD.values(), *BWD.values()):   # every method's values, whichever is on
            plugin.check(self, pp)
        if self.compress_warmup.amount < 0:
            raise ConfigError(f"{self.compress_warmup} must be >= 0")
        quantised = FWD[fwd].quantises or BWD[bwd].quantises or self.dp_plugin.quantises
        if self.stochastic_rounding and not quantised:
            raise ConfigError("--stochastic-rounding changes the fixpoint / delta quantisers, "
                              f"but --forward-compress-method is {fwd} and "
                              f"--backward-compress-method is {bwd}")
        if self.quant_scheme != "fitted" and not quantised:
            raise ConfigError(f"--quant-scheme {self.quant_scheme} changes the fixpoint / delta / "
                              f"cocktail quantisers, but none is on: --forward-compress-method "
                              f"is {fwd}, --backward-compress-method {bwd}")
        LowRank.check_options(self)


def pp_method(c, channel: str):
    """The plug-in of `channel` (pp-fwd or pp-bwd) this config chose."""
    return (FWD[c.forward_compress_method] if channel == "pp-fwd"
            else BWD[c.backward_compress_method])


def pp_link(c, spec: LinkEnd):
    """This rank's finished end of one pipeline link (spec.channel: pp-fwd or pp-bwd)."""
    return pp_method(c, spec.channel).build(c, spec)


def pp_codec(c, channel: str, spec: Optional[LinkEnd] = None):
    """The codec of `channel` (None: uncompressed); the default spec sizes it (the planner)."""
    return pp_method(c, channel).codec(c, spec or LinkEnd(channel))
