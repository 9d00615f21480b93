"""What a pipeline-channel plug-in is (one per --forward-compress-method and per
--backward-compress-method): a PpMethod subclass, a dataclass whose fields are its flags
(CompressionConfig holds one instance of it, `c.of(Method)`), with static `check`, `codec` and
`policy` that take the whole config `c` (shared fields, and every field by its flat name)."""
import math
from argparse import ArgumentTypeError
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Tuple

from megatron.cc.common.config_fields import ConfigError
from megatron.cc.pipeline.p2p import Link
from megatron.cc.pipeline.policy import WarmupPolicy
from megatron.cc.common.speed import TimedCodec


@dataclass(frozen=True)
class Warmup:
    """The pipeline channels' uncompressed warm-up, one field however it was spelled:
    --compress-warmup-iters N, or --warmup-epochs E of the training split (caches fill)."""
    amount: float = 0
    unit: str = "iters"   # or "epochs"

    # argparse shows an ArgumentTypeError's own text after the flag's name
    @classmethod
    def in_iters(cls, text: str) -> "Warmup":
        try:
            return cls(int(text), "iters")
        except ValueError:
            raise ArgumentTypeError(f"expected a whole number of iterations, got {text!r}") \
                from None

    @classmethod
    def in_epochs(cls, text: str) -> "Warmup":
        try:
            return cls(float(text), "epochs")
        except ValueError:
            raise ArgumentTypeError(f"expected a number of epochs, got {text!r}") from None

    def __str__(self) -> str:   # as given on the command line
        return f"--{'compress-warmup-iters' if self.unit == 'iters' else 'warmup-epochs'} " \
               f"{self.amount}"

    def then(self, later: "Warmup") -> "Warmup":
        """This warm-up, then `later` given on the command line: the same spelling replaces it,
        the other spelling at 0 leaves it, a second nonzero warm-up is refused."""
        if later.unit == self.unit or not self.amount:
            return later
        if later.amount:
            raise ConfigError(f"{self} and {later} both set the warm-up; give one")
        return self

    def iters(self, iters_per_epoch: Optional[int] = None) -> int:
        """Iterations whose pipeline messages go uncompressed (epochs rounded up)."""
        if self.unit == "iters" or not self.amount:
            return int(self.amount)
        if iters_per_epoch is None:
            raise ConfigError("--warmup-epochs needs the iterations per epoch of the training "
                              "split; give --compress-warmup-iters instead")
        return math.ceil(self.amount * iters_per_epoch)


@dataclass
class LinkEnd:
    """One link end as its codec and policy need it; the defaults size a codec (the planner)."""
    channel: str = "pp-fwd"
    peer: int = 0
    seed: int = 0                   # the link's stochastic-rounding stream (both ends alike)
    comp_seed: int = 0              # the low-rank compressors' seed (--comp-seed, else --seed)
    capacity: int = 1               # samples per activation cache (delta*)
    sample_shape: Optional[Tuple[int, int]] = None   # (S, H) of a cached sample; None: lazy
    ram_limit: Optional[int] = None
    device: Any = None              # where messages arrive
    warmup_iters: int = 0           # --compress-warmup-iters / --warmup-epochs, in iterations
    sender_stage: int = 0
    sender_chunk: int = 0
    pp: int = 1
    vp: int = 1
    num_microbatches: int = 1
    train_iters: int = 0
    leaves_node: bool = False
    tag: int = 0
    speed: Any = None               # --check-comp-speed's CompSpeed


class PpMethod:
    """The contract, and itself the method `none`: no codec, every message sent as it is."""
    name: ClassVar[str] = "none"
    quantises: ClassVar[bool] = False   # --stochastic-rounding / --quant-scheme apply
    caches: ClassVar[bool] = False      # keeps a per-sample activation cache (epochs)
    sections: ClassVar[Tuple[type, ...]] = ()   # config dataclasses it shares with others

    @classmethod
    def profile(cls, c) -> str:
        """Its row of the planner's codec-throughput table (megatron/cc/plan/step_time.py)."""
        return cls.name

    @staticmethod
    def check(c, pp: int) -> None:
        """ConfigError (naming the flag and the fix) on a bad value; runs for every method."""

    @staticmethod
    def codec(c, spec: LinkEnd):
        """This link end's codec; None: always uncompressed."""
        return None

    @staticmethod
    def policy(c, spec: LinkEnd):
        """Which messages the codec compresses (None: all): here the pipeline warm-up."""
        return WarmupPolicy(spec.warmup_iters) if spec.warmup_iters else None

    @classmethod
    def build(cls, c, spec: LinkEnd) -> Link:
        """The finished link end."""
        codec = cls.codec(c, spec)
        if codec is not None and spec.speed is not None:
            codec = TimedCodec(codec, spec.speed, spec.channel)
        policy = cls.policy(c, spec) if codec is not None else None
        return Link(spec.channel, spec.peer, codec, policy, leaves_node=spec.leaves_node,
                    tag=spec.tag)
