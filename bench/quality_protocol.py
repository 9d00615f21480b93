"""Quality protocol: every compression claim measured on corpora, seeds and shapes it was not
tuned on, unattended, resumable, runs side by side.

The grid is (method) x (corpus) x (seed) x (shape), each cell one pretrain_gpt.py process
(torchrun, gloo) whose log, command and result land in bench/results/quality_protocol/<run-id>/.
Methods come in three settings, each with its own reference run (the gap is always against the
reference of the same setting, corpus, seed and shape):

  pp    tp 1 x pp 2, bench_subspace's flags (dropout off, micro-batch 4, global batch 32):
        pp-baseline (uncompressed) and subspace-default (--forward-compress-method subspace
        alone: k = 3H/4 at 4 bits, the boundary projected, x10.6 both ways; chosen on the code
        and Markov corpora)
  dp    dp 4, bench_dp_modes' warm-start setting at global batch 32 (the claim's was 128),
        micro-batch 8; every run starts from `--iters` iterations of all-reduce pretraining on
        the same corpus, seed and shape, a `warm` run of its own: allreduce, the DiLoCo recipe
        of x1010.5 (diloco-Q4-fixpoint-2-rim-a1.2-avg-last3-dpadam, tuned on the embedded
        corpus; also at batch 128 as a named setting, `-b128`) and
        SparseLoCo at its defaults (sparseloco-H15-d1.56-2b-dpadam); rows imported from
        bench_dp_modes.RUNS
  seed  pp 2 x dp 2, bench_optimus_cc's flags at pp 2, micro-batch 2, global batch 16 (4
        micro-batches per replica): seed-baseline and every seed method, one seed per corpus:
        CB+LEP, epilogue-only CB+LEP, FE, SC (stage 0), AC-SGD fixpoint-4 / delta-4 /
        delta-lowbits-4/8 and TAH-Quant (each with fixpoint-8 gradients back, as
        bench_activation_compression), CocktailSGD, preduce

Shapes: demo (4 layers, hidden 128, 4 heads, seq 128: the Makefile's demo) on every corpus and
large (6 layers, hidden 256, 8 heads: 4.4x the parameters; pp and dp settings, first seed) on
the embedded and code corpora; tiny (2 layers, hidden 32) only when asked for. Corpora:
bench/quality_corpora.py. Claim methods and their references run on every --seeds value, seed
methods on the first.

A run whose result.json exists is skipped; a run directory without one (a run cut short) is
wiped and run again; result.json is written last, atomically. A failed run writes failed.json
instead and is retried by the next invocation. `--jobs N` runs N runs side by side, never more
ranks at once than --cores (one run always may start); with GPUs, one run per GPU.

    python bench/quality_protocol.py                       # the whole grid, then the report
    python bench/quality_protocol.py --dry-run             # the grid and its estimated cost
    python bench/quality_protocol.py --only subspace-default --corpora code --seeds 1234
    python bench/quality_protocol.py --report              # the table from the result files
"""
from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (HERE, ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)
import bench_activation_compression as bench_ac  # noqa: E402
import bench_dp_modes  # noqa: E402
import bench_optimus_cc  # noqa: E402
import bench_subspace  # noqa: E402
import quality_corpora  # noqa: E402
from runlog import parse_log  # noqa: E402

OUT = os.path.join(HERE, "results", "quality_protocol")
RESULT, FAILED, LOG, CMD = "result.json", "failed.json", "log.txt", "cmd.txt"
DEFAULT_ITERS = 300
CLAIM_SEEDS = (1234, 4321)   # --seeds adds more (5555 was run for some claims)
SHAPES = {
    "demo": ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
             "--seq-length", "128"],
    "large": ["--num-layers", "6", "--hidden-size", "256", "--num-attention-heads", "8",
              "--seq-length", "128"],
    "tiny": ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--seq-length", "32"],
}
DEFAULT_SHAPES = ("demo", "large")
SHAPE_CORPORA = {"large": ("embedded", "code")}   # shapes run on a subset of the corpora
SHAPE_SEEDS = {"large": 1}                        # ... and on the first seed(s) only
CHANNELS = ("pp-fwd", "pp-bwd", "dp", "emb", "tp")
DILOCO_RECIPE = "diloco-Q4-fixpoint-2-rim-a1.2-avg-last3-dpadam"
SPARSELOCO_DEFAULTS = "sparseloco-H15-d1.56-2b-dpadam"
MULOCO = "diloco-Q4-fixpoint-2-rim-a1.2-avg-last3-muon"
# the DiLoCo x1010.5 claim was measured at global batch 128; the protocol runs dp at 32 (one
# micro-batch of 8 per rank), a quarter of the cost, so that the grid fits 2 cores in hours
DP_BATCH, DP_MICRO = 32, 8
SEED_EPOCHS = 4                     # seed-epochs: passes over its cut training split
SEED_BATCH = 16                     # seed methods: 4 micro-batches of 2 per replica at pp 2 x dp 2
STARTUP_S = 25.0                    # torchrun, imports and data set-up of one run
FLOP_PER_CORE_S = 3e10              # until measured runs say otherwise (calibrate())


# ----------------------------------------------------------------------------- settings
def _log_interval(iters: int) -> str:
    return str(max(1, min(10, iters // 10)))


def pp_flags(iters: int) -> List[str]:
    """bench_subspace's common flags at tp 1 x pp 2."""
    return bench_subspace.DEMO + [
        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
        "--train-iters", str(iters), "--lr-warmup-iters", str(min(20, iters // 10)),
        "--log-interval", str(max(1, min(20, iters // 10))),
        "--eval-interval", str(max(1, iters // 3)), "--eval-iters", "4"]


def dp_flags(iters: int, batch: int = DP_BATCH) -> List[str]:
    """bench_dp_modes' common flags in its warm-start setting (the warm start's --load is added
    per run)."""
    return bench_dp_modes.DEMO + bench_dp_modes.batch_flags("allreduce", batch, DP_MICRO) + [
        "--train-iters", str(iters), "--eval-interval", str(max(iters // 6, 1)),
        "--log-interval", _log_interval(iters)]


def seed_flags(iters: int) -> List[str]:
    """bench_optimus_cc's flags at pp 2 x dp 2, micro-batch 2, global batch SEED_BATCH."""
    return bench_optimus_cc.DEMO + [
        "--pipeline-model-parallel-size", "2", "--micro-batch-size", "2",
        "--global-batch-size", str(SEED_BATCH),
        "--train-iters", str(iters), "--eval-interval", str(max(iters // 6, 1)),
        "--log-interval", _log_interval(iters)]


@dataclass(frozen=True)
class Setting:
    name: str
    nproc: int
    flags: Callable[[int], List[str]]
    reference: str
    warm_start: bool = False
    shapes: Tuple[str, ...] = ("demo", "large", "tiny")
    corpora: Tuple[str, ...] = ()   # () every corpus
    epochs: Optional[int] = None
    """The training split cut so the run passes over it about this many times (per-sample
    activation caches hit from the second pass on; in the whole corpus no sample comes back
    within a run)."""


SETTINGS = {
    "pp": Setting("pp", 2, pp_flags, "pp-baseline"),
    "dp": Setting("dp", 4, dp_flags, "allreduce", warm_start=True),
    # the DiLoCo claim's own batch, to tell a batch effect from a corpus effect (its methods are
    # frontier ones: they run only when named, as four times the batch costs four times the time)
    "dp-b128": Setting("dp-b128", 4, lambda iters: dp_flags(iters, batch=128), "allreduce-b128",
                       warm_start=True, shapes=("demo", "large")),
    "seed": Setting("seed", 4, seed_flags, "seed-baseline", shapes=("demo", "tiny")),
    # AC-SGD's regime: a fine-tuning set seen several times. Code and Markov only: they list
    # their held-out documents, so a cut keeps the validation split whole.
    "seed-epochs": Setting("seed-epochs", 4, lambda iters: seed_flags(iters) + ["--repeat-epoch"],
                           "seed-baseline-epochs", shapes=("demo", "tiny"),
                           corpora=("code", "markov"), epochs=SEED_EPOCHS),
}


@dataclass(frozen=True)
class Method:
    name: str
    setting: str
    flags: Tuple[str, ...]
    all_seeds: bool = True          # False: the first seed only (seed methods)
    tuned_on: Tuple[str, ...] = ()  # corpora its settings were tuned on (at the demo shape)
    source: str = ""
    frontier: bool = False          # a setting around a claim: run only when named exactly


def _sc(pp: int = 2) -> List[str]:
    """bench_optimus_cc's SC flags (FE dropped) compressing every stage but the last."""
    flags = [f for f in bench_optimus_cc.FE_SC if f != "--emb-comm-opt"]
    flags[flags.index("--selective-grad-comp-way") + 1] = str(pp - 1)
    return flags


_AC = bench_ac.METHODS
_CB = (("cb16-lep", tuple(bench_optimus_cc.cb(16) + bench_optimus_cc.LEP), "CB rank 16 + LEP"),
       ("cb16-lep-epilogue", tuple(bench_optimus_cc.cb(16) + bench_optimus_cc.EPILOGUE
                                   + bench_optimus_cc.LEP), "epilogue-only CB + LEP"))
_PREDUCE = [f for f in bench_dp_modes.RUNS["preduce-hetero"] if f not in bench_dp_modes.HETERO]
METHODS: Dict[str, Method] = {m.name: m for m in [
    Method("pp-baseline", "pp", tuple(bench_subspace.run_flags("none")),
           source="bench_subspace none"),
    # the defaults a user gets (k = 3H/4 at 4 bits, the boundary projected): chosen from the
    # settings below on the code and Markov corpora at the demo shape
    Method("subspace-default", "pp", ("--forward-compress-method", "subspace"),
           tuned_on=("code", "markov"), source="--forward-compress-method subspace (defaults)"),
    # the paper's model at k 10, 4 bits (x101.6), its write scale tuned on the embedded corpus
    Method("subspace-k10-b4", "pp", tuple(bench_subspace.run_flags("sub-k10-b4")),
           tuned_on=("embedded",), frontier=True,
           source="bench_subspace sub-k10-b4 (the paper's model)"),
    # the same wire bytes at other (rank, bits), and lower ratios: the frontier where the
    # default does not hold (chosen on the code corpus, seed 1234)
    *[Method(f"subspace-k{k}-b{b}", "pp", tuple(bench_subspace.run_flags(f"sub-k{k}-b{b}")),
             tuned_on=("code",), source=f"bench_subspace sub-k{k}-b{b}", frontier=True)
      for k, b in ((20, 2), (13, 3), (16, 4), (24, 4), (32, 4), (10, 8), (10, 0), (8, 5), (5, 8))],
    # only the stage boundary projected, the layers writing at full width
    *[Method(f"subspace-k{k}-b{b}-boundary", "pp",
             tuple(bench_subspace.run_flags(f"sub-k{k}-b{b}")
                   + ["--subspace-constrain", "boundary"]),
             tuned_on=("code", "markov"), frontier=True,
             source=f"bench_subspace sub-k{k}-b{b} --subspace-constrain boundary")
      for k, b in ((10, 4), (13, 3), (20, 2), (24, 4), (10, 0), (16, 4), (32, 4), (48, 4),
                   (64, 2), (64, 4), (128, 4), (64, 8), (96, 4), (128, 3))],
    # the boundary's encoder and decoder trained (both start at U)
    *[Method(f"subspace-k{k}-b{b}-learned", "pp",
             tuple(bench_subspace.run_flags(f"sub-k{k}-b{b}")
                   + ["--subspace-constrain", "learned"]),
             tuned_on=("code", "markov"), frontier=True,
             source=f"bench_subspace sub-k{k}-b{b} --subspace-constrain learned")
      for k, b in ((10, 4), (24, 4), (8, 5))],
    Method("allreduce", "dp", tuple(bench_dp_modes.RUNS["allreduce"]),
           source="bench_dp_modes allreduce"),
    Method(DILOCO_RECIPE, "dp", tuple(bench_dp_modes.RUNS[DILOCO_RECIPE]),
           tuned_on=("embedded",), source="bench_dp_modes (README x1010.5)"),
    Method(SPARSELOCO_DEFAULTS, "dp", tuple(bench_dp_modes.RUNS[SPARSELOCO_DEFAULTS]),
           source="bench_dp_modes (SparseLoCo defaults, H 15)"),
    # MuLoCo: the DiLoCo recipe over Muon inner steps, and Muon's all-reduce (both against the
    # AdamW all-reduce reference: what a user switching gets)
    *[Method(name, "dp", tuple(bench_dp_modes.RUNS[name]), frontier=True,
             source=f"bench_dp_modes {name}")
      for name in (MULOCO, "allreduce-muon")],
    Method("allreduce-b128", "dp-b128", (), frontier=True,
           source="bench_dp_modes allreduce at the claim's batch 128"),
    Method(DILOCO_RECIPE + "-b128", "dp-b128", tuple(bench_dp_modes.RUNS[DILOCO_RECIPE]),
           tuned_on=("embedded",), frontier=True,
           source="bench_dp_modes (README x1010.5) at the claim's batch 128"),
    Method("seed-baseline", "seed", (), all_seeds=False, source="bench_optimus_cc baseline"),
    # Optimus-CC's CB + LEP with its own flags, and with this repository's additions (`-ours`:
    # flush on uncompressed sends, 10% warm-up; bench_optimus_cc OURS, chosen on the embedded
    # corpus)
    *[Method(name + ours, "seed", flags + (tuple(bench_optimus_cc.OURS) if ours else ()),
             all_seeds=False, tuned_on=("embedded",) if ours else (), frontier=bool(ours),
             source=f"Optimus-CC {src}" + (" + lep flush, 10% warm-up" if ours else ""))
      for ours in ("", "-ours") for name, flags, src in _CB],
    Method("fe", "seed", ("--emb-comm-opt",), all_seeds=False, source="Optimus-CC FE"),
    Method("sc", "seed", tuple(_sc()), all_seeds=False, source="Optimus-CC SC rank 8"),
    Method("acsgd-fixpoint-4", "seed", tuple(_AC["fixpoint-4"] + bench_ac.BWD),
           all_seeds=False, source="AC-SGD fixpoint-4, fixpoint-8 back"),
    Method("acsgd-delta-4", "seed", tuple(_AC["delta-4"] + bench_ac.BWD), all_seeds=False,
           source="AC-SGD delta-4, fixpoint-8 back"),
    Method("acsgd-delta-lowbits-4-8", "seed", tuple(_AC["delta-lowbits-4/8"] + bench_ac.BWD),
           all_seeds=False, source="AC-SGD delta-lowbits 4/8, fixpoint-8 back"),
    Method("tah-4-3-0.8", "seed", tuple(_AC["tah-4/3/0.8"] + bench_ac.BWD), all_seeds=False,
           source="TAH-Quant 4/3 bits 0.8, fixpoint-8 back"),
    Method("seed-baseline-epochs", "seed-epochs", (), all_seeds=False,
           source="bench_optimus_cc baseline, the training split seen 4 times"),
    *[Method(f"{name}-epochs", "seed-epochs", tuple(_AC[label] + bench_ac.BWD), all_seeds=False,
             source=f"AC-SGD {label}, fixpoint-8 back, the training split seen 4 times")
      for name, label in (("acsgd-fixpoint-4", "fixpoint-4"), ("acsgd-delta-4", "delta-4"),
                          ("acsgd-delta-lowbits-4-8", "delta-lowbits-4/8"))],
    Method("cocktail", "seed", tuple(bench_dp_modes.COCKTAIL), all_seeds=False,
           source="CocktailSGD 0.1 / 0.2 / 4 bits"),
    Method("preduce", "seed", tuple(_PREDUCE), all_seeds=False, source="SD-PIPE preduce"),
]}


# ----------------------------------------------------------------------------- the grid
@dataclass
class Job:
    run_id: str
    method: str              # a METHODS key, or "warm" (the dp setting's warm start)
    setting: str
    corpus: str
    seed: int
    shape: str
    iters: int
    nproc: int
    flags: List[str]         # without data, seed, --load / --save
    deps: List[str] = field(default_factory=list)

    @property
    def warm(self) -> bool:
        return self.method == "warm"


def run_id(method: str, corpus: str, seed: int, shape: str, iters: int) -> str:
    return f"{method}__{corpus}__s{seed}__{shape}__i{iters}"


def warm_id(corpus: str, seed: int, shape: str, iters: int, setting: str = "dp") -> str:
    return run_id(f"warm-{setting}", corpus, seed, shape, iters)


def select_methods(only: Optional[str]) -> List[str]:
    """--only's names or glob patterns, with the reference of each setting they use."""
    if not only:
        return [m for m in METHODS if not METHODS[m].frontier]
    picked = []
    for pat in only.split(","):
        hit = [m for m in METHODS if m == pat or not METHODS[m].frontier
               and fnmatch.fnmatchcase(m, pat)]
        if not hit:
            raise SystemExit(f"--only: {pat!r} matches no method; methods: {', '.join(METHODS)}")
        picked += [m for m in hit if m not in picked]
    refs = {SETTINGS[METHODS[m].setting].reference for m in picked}
    return [m for m in METHODS if m in picked or m in refs]


def build_grid(methods: Sequence[str], corpora: Sequence[str], seeds: Sequence[int],
               shapes: Sequence[str], iters: int) -> List[Job]:
    """Every run of the grid, warm starts first, each once."""
    jobs: Dict[str, Job] = {}
    for corpus in corpora:
        for shape in shapes:
            if corpus not in SHAPE_CORPORA.get(shape, corpora):
                continue
            for name in methods:
                m = METHODS[name]
                s = SETTINGS[m.setting]
                if shape not in s.shapes or s.corpora and corpus not in s.corpora:
                    continue
                for seed in (seeds[:SHAPE_SEEDS.get(shape, len(seeds))] if m.all_seeds
                             else seeds[:1]):
                    deps = []
                    if s.warm_start:
                        wid = warm_id(corpus, seed, shape, iters, m.setting)
                        deps = [wid]
                        if wid not in jobs:
                            jobs[wid] = Job(wid, "warm", m.setting, corpus, seed, shape, iters,
                                            s.nproc, s.flags(iters) + SHAPES[shape])
                    rid = run_id(name, corpus, seed, shape, iters)
                    jobs[rid] = Job(rid, name, m.setting, corpus, seed, shape, iters, s.nproc,
                                    s.flags(iters) + list(m.flags) + SHAPES[shape], deps)
    return sorted(jobs.values(), key=lambda j: (not j.warm,))


def cut_documents(job: Job, assets: dict, epochs: int) -> int:
    """Training documents to keep so that the run's samples pass over them about `epochs`
    times (by the corpus's mean document length)."""
    tokens = job.iters * tokens_per_iter(job)
    per_doc = assets["num_tokens"] / assets["num_documents"]
    return math.ceil(tokens / epochs / per_doc)


def job_command(job: Job, assets: dict, out: str, port: int, gpu: bool = False) -> List[str]:
    """The torchrun command line of a run (data of its corpus, its seed, warm start)."""
    epochs = SETTINGS[job.setting].epochs
    if epochs:
        assets = quality_corpora.subset_assets(assets, cut_documents(job, assets, epochs))
    flags = list(job.flags) + quality_corpora.data_flags(assets) + ["--seed", str(job.seed),
                                                                    "--distributed-backend", "gloo"]
    if job.warm:
        flags += ["--save", os.path.join(out, job.run_id, "ckpt"), "--save-interval",
                  str(job.iters), "--eval-interval", str(job.iters)]
    for dep in job.deps:
        flags += ["--load", os.path.join(out, dep, "ckpt"), "--finetune"]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(job.nproc),
            "--master-port", str(port), os.path.join(ROOT, "pretrain_gpt.py")] + flags


# ----------------------------------------------------------------------------- cost
def params(shape: str, vocab: int = 4096) -> int:
    f = dict(zip(SHAPES[shape][0::2], SHAPES[shape][1::2]))
    layers, h, s = int(f["--num-layers"]), int(f["--hidden-size"]), int(f["--seq-length"])
    return 12 * layers * h * h + vocab * h + s * h


def tokens_per_iter(job: Job) -> int:
    """Global batch x sequence length, as the run's flags set them."""
    f = {}
    for k, v in zip(job.flags, job.flags[1:]):   # later flags win, as in argparse
        f[k] = v
    return int(f["--global-batch-size"]) * int(f["--seq-length"])


def job_flops(job: Job) -> float:
    """6 x parameters x tokens per iteration x iterations (the logit matmul counted)."""
    return 6.0 * params(job.shape) * tokens_per_iter(job) * job.iters


def estimate(jobs: Sequence[Job], rate: float = FLOP_PER_CORE_S) -> Dict[str, float]:
    """Estimated core-seconds of each run: its ranks busy for start-up plus compute."""
    return {j.run_id: j.nproc * STARTUP_S + job_flops(j) / rate for j in jobs}


def calibrate(out: str, jobs_by_id: Dict[str, Job]) -> Optional[float]:
    """FLOP per core-second measured by finished runs of >= 20 iterations (median), or None."""
    rates = []
    for j in jobs_by_id.values():
        r = load_json(os.path.join(out, j.run_id, RESULT))
        if r and j.iters >= 20 and r.get("steady_ms") and r["steady_ms"] == r["steady_ms"]:
            core_s = r["steady_ms"] / 1000 * j.iters * min(j.nproc, r.get("cores", j.nproc))
            rates.append(job_flops(j) / core_s)
    return sorted(rates)[len(rates) // 2] if rates else None


# ----------------------------------------------------------------------------- running
def load_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, obj) -> None:
    """Atomic: a reader sees the old file or the whole new one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def is_done(out: str, job: Job) -> bool:
    return os.path.isfile(os.path.join(out, job.run_id, RESULT))


def has_checkpoint(out: str, run: str) -> bool:
    return os.path.isfile(os.path.join(out, run, "ckpt", "latest_checkpointed_iteration.txt"))


def trained_on(out: str, job: Job) -> Optional[str]:
    """The corpus fingerprint a finished run recorded (None: not recorded)."""
    return (load_json(os.path.join(out, job.run_id, RESULT)) or {}).get("corpus_fingerprint")


def done_runs(out: str, jobs: Sequence[Job],
              fingerprints: Optional[Dict[str, Optional[str]]] = None) -> set:
    """Run ids with nothing left to do. `fingerprints` (corpus -> the build at hand): a run
    trained on another build, or one that recorded none, is to run again (the embedded corpus
    is read from the installed packages, so another install builds another one). A warm start
    whose checkpoint is gone (checkpoints are not kept in git) is to run again while a run
    that loads it is not done: its result alone would let that run start from scratch."""
    fingerprints = fingerprints or {}
    done = {j.run_id for j in jobs if is_done(out, j)
            and fingerprints.get(j.corpus) in (None, trained_on(out, j))}
    needed = {d for j in jobs if j.run_id not in done for d in j.deps}
    return {r for r in done if r not in needed or has_checkpoint(out, r)}


def hardware() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = gpu_names()
    return f"{os.cpu_count()} x {cpu}" + (f", {len(gpus)} x {gpus[0]}" if gpus else "")


def portable(cmd: List[str]) -> str:
    """The command as recorded: repository-relative paths and `python`, so a result file
    names no directory of the machine it ran on."""
    def rel(c: str) -> str:
        if c == sys.executable:
            return "python"
        return os.path.relpath(c, ROOT) if c.startswith(ROOT + os.sep) else c
    return " ".join(shlex.quote(rel(c)) for c in cmd)


def result_of(job: Job, log: str, rc: int, wall: float, cmd: List[str], cores: int,
              corpus_fingerprint: Optional[str] = None) -> dict:
    """What result.json keeps: the parsed log (bytes and ratios as logged; dp averaged over
    the run's log lines), the build of the corpus it trained on (the embedded corpus is read
    from the installed packages, so another install can build another one) and where it ran."""
    r = parse_log(job.run_id, log)
    r.dp_history = bench_dp_modes.dp_bytes_per_log(log)
    bench_dp_modes.average_dp(r)
    return {"run_id": job.run_id, "method": job.method, "setting": job.setting,
            "corpus": job.corpus, "corpus_fingerprint": corpus_fingerprint, "seed": job.seed,
            "shape": job.shape, "iters": job.iters, "nproc": job.nproc, "returncode": rc,
            "final_valid": r.final_valid,
            "valid": r.valid, "losses": r.losses, "ratio": r.ratio,
            "bytes_per_iter": r.bytes_per_iter, "steady_ms": r.steady_ms, "wall_s": wall,
            "cores": cores, "command": portable(cmd),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "hardware": hardware(), "protocol_argv": sys.argv[1:]}


def run_job(job: Job, assets: dict, out: str, port: int, gpu: Optional[int] = None,
            timeout: float = 24 * 3600, cores: int = 1) -> dict:
    """Run one job (a directory left by a run cut short is wiped first); returns its result
    (result.json written) or its failure (failed.json written)."""
    d = os.path.join(out, job.run_id)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    missing = [dep for dep in job.deps if not has_checkpoint(out, dep)]
    if missing:   # pretrain_gpt.py would warn and train from scratch
        res = {"run_id": job.run_id, "returncode": None, "final_valid": None,
               "error": f"no checkpoint of its warm start {', '.join(missing)}"}
        write_json(os.path.join(d, FAILED), res)
        return res
    cmd = job_command(job, assets, out, port, gpu is not None)
    with open(os.path.join(d, CMD), "w") as f:
        f.write(portable(cmd) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env["CUDA_VISIBLE_DEVICES"] = "" if gpu is None else str(gpu)
    t0 = time.time()
    with open(os.path.join(d, LOG), "w") as logf:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            rc = p.wait()
    with open(os.path.join(d, LOG), errors="replace") as f:
        log = f.read()
    res = result_of(job, log, rc, time.time() - t0, cmd, cores, assets.get("fingerprint"))
    if rc != 0 or res["final_valid"] is None:
        res["error"] = log[-3000:]
        write_json(os.path.join(d, FAILED), res)
    else:
        write_json(os.path.join(d, RESULT), res)
    return res


def default_jobs(gpus: int, cores: int, nproc: int = 2) -> int:
    return gpus if gpus else max(1, cores // nproc)


def gpu_names() -> List[str]:
    """Names of the GPUs nvidia-smi lists (none without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [ln.split(":", 1)[1].split("(")[0].strip() for ln in out.stdout.splitlines()
            if ln.startswith("GPU ")]


def gpu_count() -> int:
    return len(gpu_names())


def fingerprints_of(assets: Dict[str, dict]) -> Dict[str, Optional[str]]:
    return {c: a.get("fingerprint") for c, a in assets.items()}


def run_grid(jobs: Sequence[Job], assets: Dict[str, dict], out: str, n_jobs: int = 1,
             cores: int = 1, gpus: int = 0, base_port: int = 29810,
             runner: Callable = run_job, log=print) -> Dict[str, str]:
    """Run every job not done yet, up to n_jobs at once and (CPU) no more ranks than cores
    unless nothing else runs; a run waits for its warm start. Returns run id -> status."""
    import concurrent.futures as cf
    status = {r: "done" for r in done_runs(out, jobs, fingerprints_of(assets))}
    for rid in status:
        log(f"skip {rid} (done)")
    pending = [j for j in jobs if j.run_id not in status]
    running: Dict[cf.Future, Tuple[Job, int]] = {}
    os.makedirs(out, exist_ok=True)
    with cf.ThreadPoolExecutor(max_workers=max(1, n_jobs)) as pool:
        while pending or running:
            for j in list(pending):
                if any(status.get(d) in ("failed", "skipped") for d in j.deps):
                    status[j.run_id] = "skipped"
                    pending.remove(j)
                    log(f"skip {j.run_id} (its warm start failed)")
            used = {slot for _, slot in running.values()}
            ranks = sum(job.nproc for job, _ in running.values())
            for j in list(pending):
                if len(running) >= max(1, n_jobs):
                    break
                if not all(status.get(d) == "done" for d in j.deps):
                    continue
                if running and not gpus and ranks + j.nproc > cores:
                    continue
                slot = next(s for s in range(max(1, n_jobs)) if s not in used)
                used.add(slot)
                ranks += j.nproc
                pending.remove(j)
                log(f"start {j.run_id} ({j.nproc} ranks, slot {slot})")
                fut = pool.submit(runner, j, assets[j.corpus], out, base_port + 10 * slot,
                                  (slot % gpus) if gpus else None, cores=cores)
                running[fut] = (j, slot)
            if not running:
                for j in pending:   # waiting on a dependency that is not in the grid
                    status[j.run_id] = "skipped"
                    log(f"skip {j.run_id} (its warm start is not in the grid)")
                break
            done, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
            for fut in done:
                j, _ = running.pop(fut)
                try:
                    res = fut.result()
                    ok = is_done(out, j)
                except Exception as e:   # one broken run must not stop the grid
                    res, ok = {"error": repr(e)}, False
                status[j.run_id] = "done" if ok else "failed"
                v = res.get("final_valid")
                log(f"{'done' if ok else 'FAILED'} {j.run_id}"
                    + (f": validation loss {v:.4f}, {res.get('wall_s', 0):.0f} s" if ok and v
                       else f": {str(res.get('error', ''))[-300:]}"))
    return status


# ----------------------------------------------------------------------------- report
def load_results(out: str) -> List[dict]:
    res = []
    if not os.path.isdir(out):
        return res
    for name in sorted(os.listdir(out)):
        r = load_json(os.path.join(out, name, RESULT))
        if r:
            res.append(r)
    return res


def load_failures(out: str) -> List[dict]:
    if not os.path.isdir(out):
        return []
    return [f for f in (load_json(os.path.join(out, n, FAILED)) for n in sorted(os.listdir(out))
                        if not os.path.isfile(os.path.join(out, n, RESULT))) if f]


def tuned_mark(method: str, corpus: str, shape: str) -> str:
    """TUNED: settings tuned on this corpus at this shape; corpus: on this corpus only."""
    m = METHODS.get(method)
    if m is None or corpus not in m.tuned_on:
        return ""
    return "TUNED" if shape == "demo" else "corpus"


def summarize(results: Sequence[dict]) -> List[dict]:
    """One row per (method, corpus, shape, iters): gaps to the reference of the same corpus,
    seed, shape and iterations (mean, worst = largest), ratios as logged (mean over seeds)."""
    index = {(r["method"], r["corpus"], r["seed"], r["shape"], r["iters"]): r for r in results}
    rows: Dict[tuple, dict] = {}
    for r in results:
        if r["method"] == "warm" or r["method"] not in METHODS:
            continue
        key = (r["method"], r["corpus"], r["shape"], r["iters"])
        row = rows.setdefault(key, {"method": r["method"], "corpus": r["corpus"],
                                    "shape": r["shape"], "iters": r["iters"], "seeds": [],
                                    "gaps": [], "valid": [], "ratios": {},
                                    "other_build": []})
        row["seeds"].append(r["seed"])
        row["valid"].append(r["final_valid"])
        ref_name = SETTINGS[METHODS[r["method"]].setting].reference
        ref = index.get((ref_name, r["corpus"], r["seed"], r["shape"], r["iters"]))
        if ref is not None and r.get("corpus_fingerprint") != ref.get("corpus_fingerprint"):
            row["other_build"].append(r["run_id"])   # not comparable: no gap
        elif ref is not None and ref["final_valid"]:
            row["gaps"].append((r["final_valid"] - ref["final_valid"]) / ref["final_valid"])
        for ch, q in r.get("ratio", {}).items():
            row["ratios"].setdefault(ch, []).append(q)
    out = []
    for key in sorted(rows, key=lambda k: (list(METHODS).index(k[0]), k[1], k[2], k[3])):
        row = rows[key]
        g = row["gaps"]
        row["mean_gap"] = sum(g) / len(g) if g else None
        row["worst_gap"] = max(g) if g else None
        row["mean_ratio"] = {ch: sum(v) / len(v) for ch, v in row["ratios"].items()}
        row["tuned"] = tuned_mark(row["method"], row["corpus"], row["shape"])
        out.append(row)
    return out


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:+.2f}%"


def ratio_text(ratios: Dict[str, float]) -> str:
    chans = [c for c in CHANNELS if c in ratios] + sorted(c for c in ratios if c not in CHANNELS)
    return ", ".join(f"{c} x{ratios[c]:.1f}" for c in chans) or "-"


def by_corpus_lines(rows: Sequence[dict]) -> List[str]:
    """The summary pivoted: a line per (method, shape), a column per corpus with the worst gap
    over its seeds, and the worst of those (tuned corpora included: the number to quote)."""
    refs = {s.reference for s in SETTINGS.values()}
    cells: Dict[tuple, Dict[str, dict]] = {}
    for r in rows:
        if r["method"] not in refs and r["worst_gap"] is not None:
            cells.setdefault((r["method"], r["shape"]), {})[r["corpus"]] = r
    corpora = [c for c in quality_corpora.CORPORA
               if any(c in by for by in cells.values())]
    lines = ["| method | shape | ratio as logged | " + " | ".join(corpora) + " | worst |",
             "|---|---|---|" + "---:|" * (len(corpora) + 1)]
    for (method, shape), by in cells.items():
        def cell(c):
            r = by.get(c)
            if r is None:
                return "-"
            n = len(r["gaps"])
            return (f"{_pct(r['worst_gap'])} ({n} seed{'s' * (n > 1)}"
                    f"{', tuned' if r['tuned'] else ''})")
        ratio = next(iter(by.values()))["mean_ratio"]
        worst = max(r["worst_gap"] for r in by.values())
        lines.append(f"| {method} | {shape} | {ratio_text(ratio)} | "
                     + " | ".join(cell(c) for c in corpora) + f" | **{_pct(worst)}** |")
    return lines


def corpus_lines(corpora: Sequence[str], cache_dir: Optional[str]) -> List[str]:
    """Each corpus's size and, for the Markov one, its floor (from manifests already built)."""
    lines = ["| corpus | documents (train / held out) | tokens | floor (nats/token) |",
             "|---|---:|---:|---:|"]
    for name in corpora:
        if name == "embedded":
            ec = quality_corpora.embedded_corpus
            m = load_json(os.path.join(ec.default_cache_dir(),
                                       f"{ec.VERSION}-{ec.DEFAULT_MAX_BYTES}", "manifest.json"))
            tokens = f"{m['num_tokens']:,}" if m else "-"
            lines.append(f"| embedded | {m['num_documents'] if m else '?'}, split 969,30,1 | "
                         f"{tokens} | - |")
            continue
        base = cache_dir or quality_corpora.default_cache_dir()
        found = sorted(d for d in (os.listdir(base) if os.path.isdir(base) else [])
                       if d.startswith(f"{name}-{quality_corpora.BUILD_VERSIONS[name]}-")
                       and os.path.isfile(os.path.join(base, d, "manifest.json")))
        if not found:
            lines.append(f"| {name} | (not built) | - | - |")
            continue
        m = load_json(os.path.join(base, found[0], "manifest.json"))
        floor = m.get("markov", {}).get("floor_nats_per_token")
        lines.append(f"| {name} | {m['train_documents']} / {m['valid_documents']} | "
                     f"{m['num_tokens']:,} | {'-' if floor is None else f'{floor:.4f}'} |")
    return lines


# where runs go and how many run at once: no bearing on what a run computes
PLACEMENT_OPTIONS = ("--out", "--cache-dir", "--port", "--jobs", "--cores")


def reproduce_argv(argv: Sequence[str]) -> str:
    """An invocation's arguments without its placement options (paths, ports, parallelism)."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in PLACEMENT_OPTIONS:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in PLACEMENT_OPTIONS)):
            kept.append(a)
    return " ".join(kept)


def report(out: str, cache_dir: Optional[str] = None) -> str:
    """The markdown of <out>/README.md from the result files."""
    results = load_results(out)
    rows = summarize(results)
    hosts = sorted({r.get("hardware", "?") for r in results})
    dates = sorted(r.get("date", "") for r in results)
    argvs = sorted({reproduce_argv(r.get("protocol_argv", [])) for r in results})
    text = ["# Quality protocol: compression claims off their tuning data", "",
            "Generated by `python bench/quality_protocol.py --report` from the result files in "
            "this directory (one per run: `<run-id>/result.json`, its log and command beside it).",
            "", f"- generated: {datetime.date.today().isoformat()}",
            f"- runs: {len(results)}"
            + (f", from {dates[0]} to {dates[-1]}" if dates else ""),
            f"- hardware: {'; '.join(hosts) or '-'}",
            "- reproduce (one invocation a line; add `--jobs N` to run N side by side):",
            *(f"  - `{f'python bench/quality_protocol.py {a}'.strip()}`" for a in argvs or [""]),
            "", "Gap: final validation loss against the reference run of the same setting, "
            "corpus, seed, shape and iterations (pp-baseline, allreduce or seed-baseline), mean "
            "and worst (largest) over the seeds run. Ratios: the iteration lines' `(xN)` per "
            "channel as logged (the last line's; dp: averaged over the run's lines), mean over "
            "seeds. **TUNED**: the method's settings were tuned on this corpus at this shape, "
            "so that row is not an out-of-sample result; *corpus*: tuned on this corpus at "
            "another shape.", "",
            "| method | corpus | shape | iters | seeds | tuned | mean gap | worst gap | "
            "val loss (mean) | ratio as logged |",
            "|---|---|---|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        v = [x for x in r["valid"] if x is not None]
        text.append(f"| {r['method']} | {r['corpus']} | {r['shape']} | {r['iters']} | "
                    f"{','.join(map(str, sorted(r['seeds'])))} | "
                    f"{'**TUNED**' if r['tuned'] == 'TUNED' else r['tuned'] and '*corpus*'} | "
                    f"{_pct(r['mean_gap'])} | {_pct(r['worst_gap'])} | "
                    f"{sum(v) / len(v):.4f} | {ratio_text(r['mean_ratio'])} |")
    if not rows:
        text.append("| (no finished runs yet) | | | | | | | | | |")
    else:
        text += ["", "By corpus: the worst gap over each corpus's seeds (tuned: the method's "
                 "settings were chosen on that corpus), and the worst over all of them:", ""]
        text += by_corpus_lines(rows)
    other = [rid for r in rows for rid in r["other_build"]]
    if other:
        text += ["", "Not compared (the reference trained on another build of the corpus, or "
                 "one of the two recorded none; run them again): " + ", ".join(other)]
    corpora = sorted({r["corpus"] for r in results}) or list(quality_corpora.CORPORA)
    text += ["", "Corpora (bench/quality_corpora.py):", ""] + corpus_lines(corpora, cache_dir)
    fails = load_failures(out)
    if fails:
        text += ["", "Failed runs (retried by the next invocation):", ""]
        for f in fails:
            last = [ln for ln in f.get("error", "").splitlines() if ln.strip()][-1:] or [""]
            text.append(f"- {f['run_id']}: rc {f.get('returncode')}: `{last[0][:200]}`")
    return "\n".join(text) + "\n"


def write_report(out: str, cache_dir: Optional[str] = None) -> str:
    text = report(out, cache_dir)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "README.md")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return text


# ----------------------------------------------------------------------------- command line
def dry_run_text(jobs: Sequence[Job], out: str, n_jobs: int, cores: int, gpus: int,
                 rate: float, fingerprints: Optional[Dict[str, Optional[str]]] = None) -> str:
    cost = estimate(jobs, rate)
    done = done_runs(out, jobs, fingerprints)
    todo = [j for j in jobs if j.run_id not in done]
    lines = [f"{'run id':78s} {'ranks':>5s} {'est. core-h':>11s}  status"]
    for j in jobs:
        lines.append(f"{j.run_id:78s} {j.nproc:5d} {cost[j.run_id] / 3600:11.2f}  "
                     f"{'done' if j.run_id in done else 'to run'}")
    core_s = sum(cost[j.run_id] for j in todo)
    par = min(cores, max(1, n_jobs) * max(j.nproc for j in jobs)) if jobs else 1
    lines.append(f"{len(jobs)} runs ({len(todo)} to run, {sum(j.warm for j in jobs)} warm "
                 f"starts); estimated {core_s / 3600:.1f} core-hours to run, about "
                 f"{core_s / par / 3600:.1f} hours on {cores} cores with --jobs {n_jobs}"
                 + (f" ({gpus} GPUs)" if gpus else "")
                 + f" (estimate: {STARTUP_S:.0f} s start-up per run, "
                   f"{rate:.2g} FLOP per core-second)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated method names or globs (the "
                   "references they need are added); methods: " + ", ".join(METHODS))
    p.add_argument("--corpora", default=",".join(quality_corpora.CORPORA))
    p.add_argument("--seeds", default=",".join(map(str, CLAIM_SEEDS)),
                   help="seeds of the claim methods and references; seed methods use the first")
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                   help=f"of {', '.join(SHAPES)} (large runs only on "
                        f"{', '.join(SHAPE_CORPORA['large'])})")
    p.add_argument("--iters", type=int, default=DEFAULT_ITERS,
                   help="training iterations of every run (and of each warm start)")
    p.add_argument("--jobs", type=int, default=None,
                   help="runs side by side (default: one per GPU, else cores // 2)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="ranks that may run at once on the CPU (one run may always start)")
    p.add_argument("--port", type=int, default=29810, help="first torchrun master port")
    p.add_argument("--out", default=OUT, help="results directory")
    p.add_argument("--cache-dir", default=None, help="corpora cache (bench/quality_corpora.py)")
    p.add_argument("--corpus-seed", type=int, default=quality_corpora.DEFAULT_SEED)
    p.add_argument("--dry-run", action="store_true", help="print the grid and its cost, exit")
    p.add_argument("--report", action="store_true",
                   help="only regenerate <out>/README.md from the result files")
    a = p.parse_args(argv)
    if a.report:
        print(write_report(a.out, a.cache_dir), end="")
        return 0
    corpora = [c for c in a.corpora.split(",") if c]
    shapes = [s for s in a.shapes.split(",") if s]
    for c in corpora:
        if c not in quality_corpora.CORPORA:
            p.error(f"--corpora: unknown {c!r}; of {', '.join(quality_corpora.CORPORA)}")
    for s in shapes:
        if s not in SHAPES:
            p.error(f"--shapes: unknown {s!r}; of {', '.join(SHAPES)}")
    seeds = [int(s) for s in a.seeds.split(",") if s]
    jobs = build_grid(select_methods(a.only), corpora, seeds, shapes, a.iters)
    gpus = gpu_count()
    n_jobs = a.jobs or default_jobs(gpus, a.cores)
    # built (once, cached) before the dry run too: which results were trained on this build
    assets = {c: quality_corpora.corpus_assets(c, a.cache_dir, a.corpus_seed) for c in corpora}
    if a.dry_run:
        rate = calibrate(a.out, {j.run_id: j for j in jobs}) or FLOP_PER_CORE_S
        print(dry_run_text(jobs, a.out, n_jobs, a.cores, gpus, rate, fingerprints_of(assets)))
        return 0
    status = run_grid(jobs, assets, a.out, n_jobs, a.cores, gpus, a.port)
    print(write_report(a.out, a.cache_dir), end="")
    bad = [k for k, v in status.items() if v != "done"]
    if bad:
        print(f"{len(bad)} runs did not finish: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
