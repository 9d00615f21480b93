"""What a --dp-mode plug-in is: a dataclass whose fields are its flags (CompressionConfig
holds one instance of it, `c.of(Mode)`), with static `check` and `build` that take the whole
config `c`, where the shared fields (--stochastic-rounding, --quant-scheme, --dp-backend) and
the flat names of every field (`c.grad_comp_rank`) can be read."""
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Tuple


GRAD_BYTES = 4   # fp32 main_grad / fp32 parameter deltas


def exact_bytes(params) -> dict:
    """An fp32 all-reduce of `params` (ParamSpecs) counted once per rank."""
    n = GRAD_BYTES * sum(p.numel for p in params)
    return {"sent": n, "raw": n, "messages": 1}


def segment_specs(params) -> dict:
    """param_sync.param_segments on ParamSpecs: {segment: [spec, ...]}, the tied embedding
    apart, empty segments left out."""
    out = {"embedding": [p for p in params if p.shared_embedding],
           "params": [p for p in params if not p.shared_embedding]}
    return {k: v for k, v in out.items() if v}


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
    sections: ClassVar[Tuple[type, ...]] = ()  # config dataclasses it shares with other modes

    @classmethod
    def owned(cls) -> Tuple[str, ...]:
        """Fields refused with another --dp-mode: given there, they are a mistake."""
        own = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
        return tuple(f.name for t in cls.sections for f in dataclasses.fields(t)) + \
            tuple(f.name for f in own if f.name not in cls.shared)

    @staticmethod
    def borrows(c) -> Tuple[str, ...]:
        """Other modes' fields this mode reads with these settings."""
        return ()

    @classmethod
    def profile(cls, c) -> str:
        """Its row of the planner's codec-throughput table (megatron/cc/plan/step_time.py)."""
        return cls.name

    @classmethod
    def stage_bytes(cls, c, params, layout, stage: int, iteration: Optional[int]) -> dict:
        """The planner's {sent, raw, messages} for one rank of `stage` at `iteration` (None:
        the steady-state average), by the counting rule of the channel `build` returns;
        `params`: the stage's plan.shapes.ParamSpec list."""
        raise NotImplementedError(f"--dp-mode {cls.name}: its exchanges depend on which "
                                  f"replicas are ready at run time; the cost model covers "
                                  f"allreduce, cocktail_sgd, diloco and sparseloco")

    @staticmethod
    def check(c, pp: int, dp: int) -> None:
        """ConfigError (naming the flag and the fix) on a bad value; runs in every mode."""

    @staticmethod
    def build(c, topo, stats, run: DpRun):
        """This rank's finished dp channel (a SyncChannel)."""
        raise NotImplementedError
