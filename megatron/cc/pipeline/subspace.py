"""--forward-compress-method subspace: Subspace Networks' coefficients, both directions.

The model is constrained by the driver (megatron/training/model/subspace.py: output projections into
a shared k-dim subspace, x0 rebuilt on every stage); this plug-in owns the flags and puts the
(.., k) messages on the wire (codecs/subspace.py). It is registered for both channels and
chosen for pp-bwd at parse time (`fold`): the gradient's k coefficients are its partner.
"""
import math
from dataclasses import dataclass
from typing import Optional

from megatron.cc.codecs.subspace import SubspaceCodec
from megatron.cc.common.config_fields import ConfigError, flag
from megatron.cc.pipeline.base import PpMethod

# The defaults sit where the quality protocol (docs/quality_protocol.md) found the highest
# ratio within its 2% budget on every corpus: k = 3H/4 at 4 bits, only the stage boundary
# projected (x10.6 both ways against fp32). Fewer directions cost more on the corpora the
# settings were not chosen on (docs/subspace.md).
DEFAULT_RANK_SHARE = 0.75
DEFAULT_BITS = 4
DEFAULT_CONSTRAIN = "boundary"   # with the method; --subspace-rank alone constrains the writes


def default_rank(hidden: int) -> int:
    return max(1, round(DEFAULT_RANK_SHARE * hidden))


def constrain_mode(method: Optional[str], constrain: Optional[str]) -> str:
    """--subspace-constrain as given, else boundary with the method and writes without it
    (a saved config's values work too: older ones hold "writes" explicitly)."""
    return constrain or (DEFAULT_CONSTRAIN if method == "subspace" else "writes")


def saved_constrain_mode(compression: Optional[dict]) -> str:
    """constrain_mode of a checkpoint's saved compression dict."""
    saved = compression or {}
    return constrain_mode(saved.get("forward_compress_method"), saved.get("subspace_constrain"))


def default_write_scale(k: int, hidden: int) -> float:
    """sqrt(k / H): each subspace direction gets the size an unconstrained write gives each of
    its own (megatron/training/model/subspace.py's docstring); also the import tool's default."""
    return math.sqrt(k / hidden)


@dataclass
class Subspace(PpMethod):
    name = "subspace"
    quantises = True   # --quant-scheme picks the coefficients' fixpoint grid
    subspace_rank: Optional[int] = flag(
        None, "k of the subspace model. With --forward-compress-method subspace (default "
              "3/4 of --hidden-size) stage boundaries carry k coefficients per token both "
              "ways; alone (any pp, pp 1 included) it builds the writes-constrained model "
              "and sends whole activations.")
    subspace_bits: Optional[int] = flag(
        None, "--forward-compress-method subspace: bits per coefficient on the wire, both "
              "directions: 1..8 = fixpoint (one 16-bit scale per coefficient and message), "
              "0 = unquantised (the exact messages). Default 4: with the default k, "
              "x10.6 both ways against fp32.")

    subspace_constrain: Optional[str] = flag(
        None, "What the subspace model confines to span(U): writes (every attention / MLP "
                  "output projection on every stage, as Subspace Networks: the residual stream "
                  "itself stays k-dimensional) or boundary (only what crosses a stage "
                  "boundary: each stage's output is projected, c = U^T (x - x0), and its layers "
                  "write at full width) or learned (boundary with a trained encoder E on the "
                  "sending stage and decoder D on the receiving one, both starting at U: "
                  "c = E^T (x - x0), x = x0 + D c). boundary and learned need "
                  "--forward-compress-method subspace. Default: boundary with it, writes with "
                  "--subspace-rank alone.",
        choices=["writes", "boundary", "learned"])
    subspace_write_scale: Optional[float] = flag(
        None, "a in W_eff = a U U^T W for every constrained write. Default sqrt(k / "
              "--hidden-size): a write keeps the per-direction size of an unconstrained one "
              "(measured at k 10, hidden 128: 0.5 to 1.4 percent higher validation loss than "
              "uncompressed, against 2.7 to 3.1 at a = 1). Saved with the model: a "
              "checkpoint keeps its own.")

    @staticmethod
    def fold(c) -> None:
        """The backward partner comes with the method (a different one is left for `check`)."""
        if c.forward_compress_method == "subspace" and c.backward_compress_method == "none":
            c.backward_compress_method = "subspace"

    @staticmethod
    def check(c, pp: int) -> None:
        fwd, bwd = c.forward_compress_method, c.backward_compress_method
        if bwd == "subspace" and fwd != "subspace":
            raise ConfigError("--backward-compress-method subspace is the backward half of "
                              "--forward-compress-method subspace; give that instead")
        if fwd == "subspace" and bwd != "subspace":
            raise ConfigError(f"--forward-compress-method subspace brings its own backward "
                              f"partner (the gradient's k coefficients, exact at "
                              f"--subspace-bits 0): drop --backward-compress-method {bwd} / "
                              f"--inter-grad-comp")
        if fwd == "subspace" and c.stochastic_rounding:
            raise ConfigError("--stochastic-rounding: the subspace coefficients round to "
                              "nearest; drop the flag")

    @staticmethod
    def rank(c, hidden: int) -> Optional[int]:
        """k of the constrained model, or None (the ordinary model)."""
        if c.subspace_rank is not None:
            return c.subspace_rank
        return default_rank(hidden) if c.forward_compress_method == "subspace" else None

    @staticmethod
    def constrain(c) -> str:
        return constrain_mode(c.forward_compress_method, c.subspace_constrain)

    @staticmethod
    def write_scale(c, hidden: int) -> float:
        """a of a fresh constrained model (module docstring of megatron/training/model/subspace.py)."""
        if c.subspace_write_scale is not None:
            return c.subspace_write_scale
        return default_write_scale(Subspace.rank(c, hidden), hidden)

    @staticmethod
    def bits(c) -> int:
        return DEFAULT_BITS if c.subspace_bits is None else c.subspace_bits

    @staticmethod
    def codec(c, spec):
        if spec.sample_shape is None:   # the planner's sizing: the model changes, not modelled
            raise ValueError("the planner does not model --forward-compress-method subspace "
                             "yet; its pipeline bytes per message are megatron/training/"
                             "subspace.py's expected_bytes_per_message")
        return SubspaceCodec(hidden_size=spec.sample_shape[1],
                             rank=Subspace.rank(c, spec.sample_shape[1]),
                             bits=Subspace.bits(c), scheme=c.quant_scheme)

    @staticmethod
    def policy(c, spec):
        return None   # coefficients from the first step: the model is built that way
