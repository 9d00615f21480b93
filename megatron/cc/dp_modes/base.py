"""What a --dp-mode plug-in is. Its flags are the dataclass fields of a DpMode subclass, which
CompressionConfig inherits (so flags and `args.compression.<field>` stay flat); `check` and
`build` are static and take that composed config `c`, where the shared fields
(--stochastic-rounding, --quant-scheme, --dp-backend) sit next to the mode's own."""
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Tuple


@dataclass
class DpRun:
    """What a dp mode (or emb plug-in) needs from the run besides its flags and the Topology."""
    seed: int
    comp_seed: int                     # --comp-seed, else --seed
    train_iters: int
    tied_embedding: bool = True
    exclude_embedding: bool = False    # the emb channel sums it alone (--emb-comm-opt)
    overlap_grad_reduce: bool = False
    bucket_size: Optional[int] = None  # --ddp-bucket-size
    num_microbatches: int = 1
    speed: Any = None                  # --check-comp-speed's CompSpeed
    group_timeout: Any = None          # of the groups a channel creates (a timedelta)


class DpMode:
    name: ClassVar[str]
    aliases: ClassVar[Tuple[str, ...]] = ()
    syncs_parameters: ClassVar[bool] = True   # exchanges after the optimizer step
    own_group: ClassVar[bool] = False         # --dp-backend applies
    quantises: ClassVar[bool] = False         # --stochastic-rounding / --quant-scheme apply
    shared: ClassVar[Tuple[str, ...]] = ()    # its fields other modes may be given too

    @classmethod
    def owned(cls) -> Tuple[str, ...]:
        """Fields refused with another --dp-mode: given there, they are a mistake."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.shared)

    @staticmethod
    def borrows(c) -> Tuple[str, ...]:
        """Other modes' fields this mode reads with these settings."""
        return ()

    @classmethod
    def profile(cls, c) -> str:
        """Its row of the planner's codec-throughput table (megatron/cc/plan/step_time.py)."""
        return cls.name

    @staticmethod
    def check(c, pp: int, dp: int) -> None:
        """ConfigError (naming the flag and the fix) on a bad value; runs in every mode."""

    @staticmethod
    def build(c, topo, stats, run: DpRun):
        """This rank's finished dp channel (a SyncChannel)."""
        raise NotImplementedError
