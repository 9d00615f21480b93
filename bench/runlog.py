"""Launch pretrain_gpt.py under torchrun and parse its Megatron log lines (for benchmarks)."""
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ITER = re.compile(r" iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)"
                   r".*?lm loss: ([\d.E+-]+)")
_VALID = re.compile(r"validation loss( \(replica average\))? at iteration (\d+) \| "
                    r"lm loss value: ([\d.E+-]+)")
_BYTES = re.compile(r"([a-z-]+) bytes: ([\d.]+)(B|KB|MB|GB) \(x([\d.inf]+)\)")
_UNIT = {"B": 1, "KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3}


@dataclass
class RunResult:
    name: str
    losses: Dict[int, float] = field(default_factory=dict)
    valid: Dict[int, float] = field(default_factory=dict)
    # parameter-syncing dp modes: validation of the mean of the replicas' weights
    valid_mean: Dict[int, float] = field(default_factory=dict)
    ms_per_iter: List[float] = field(default_factory=list)
    bytes_per_iter: Dict[str, float] = field(default_factory=dict)   # last log line's
    ratio: Dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    log: str = ""

    @property
    def final_valid(self) -> Optional[float]:
        return self.valid[max(self.valid)] if self.valid else None

    @property
    def final_valid_mean(self) -> Optional[float]:
        return self.valid_mean[max(self.valid_mean)] if self.valid_mean else None

    @property
    def steady_ms(self) -> float:
        """Median time per iteration after the first log interval (start-up excluded)."""
        xs = sorted(self.ms_per_iter[1:] or self.ms_per_iter)
        return xs[len(xs) // 2] if xs else float("nan")


def parse_log(name: str, text: str) -> RunResult:
    r = RunResult(name, log=text)
    for line in text.splitlines():
        m = _ITER.search(line)
        if m:
            r.losses[int(m.group(1))] = float(m.group(3))
            r.ms_per_iter.append(float(m.group(2)))
            for ch, num, unit, ratio in _BYTES.findall(line):
                r.bytes_per_iter[ch] = float(num) * _UNIT[unit]
                r.ratio[ch] = float(ratio)
        m = _VALID.search(line)
        if m:
            (r.valid_mean if m.group(1) else r.valid)[int(m.group(2))] = float(m.group(3))
    return r


def run_pretrain(name: str, nproc: int, flags: List[str], port: int = 29650,
                 timeout: int = 3600, env: Optional[dict] = None, nodes: int = 1) -> RunResult:
    """`nodes` > 1: that many torchrun agents (--nnodes, --node-rank) share the nproc ranks on
    this machine, an emulated cluster whose nodes the log line's inter-node fields tell apart."""
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {}))
    t0 = time.time()
    procs, files = [], []
    for node in range(nodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
               str(nproc // nodes), "--master-port", str(port)]
        if nodes > 1:
            cmd += ["--nnodes", str(nodes), "--node-rank", str(node),
                    "--master-addr", "127.0.0.1"]
        # files, not pipes: a full pipe of one agent would stall the collective of the others
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        files.append((out, err))
        procs.append(subprocess.Popen(cmd + [os.path.join(ROOT, "pretrain_gpt.py")] + flags,
                                      cwd=ROOT, env=e, stdout=out, stderr=err, text=True))
    try:
        for p in procs:
            p.wait(timeout=max(timeout - (time.time() - t0), 1))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    outs = []
    for out, err in files:
        out.seek(0)
        err.seek(0)
        outs.append((out.read(), err.read()))
        out.close()
        err.close()
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            raise RuntimeError(f"{name} failed:\n{err[-4000:]}")
    # the log line is printed by the last rank: on the last node
    r = parse_log(name, "".join(out for out, _ in outs))
    r.wall_s = time.time() - t0
    return r


def plot_losses(results: List[RunResult], path: str, title: str,
                valid_only: bool = False) -> None:
    """One colour per run (tab20 past 10 runs): train solid, validation dashed with markers.
    valid_only drops the training curves (many runs)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colours = plt.get_cmap("tab10" if len(results) <= 10 else "tab20").colors
    entries = len(results) * (1 if valid_only else 2)
    fig, ax = plt.subplots(figsize=(9, max(4.5, 0.25 * entries + 0.8)))
    for n, r in enumerate(results):
        c = colours[n % len(colours)]
        if not valid_only:
            its = sorted(r.losses)
            ax.plot(its, [r.losses[i] for i in its], color=c, lw=1, label=f"{r.name} (train)")
        if r.valid:
            vits = sorted(r.valid)
            ax.plot(vits, [r.valid[i] for i in vits], "o--", color=c, lw=1.5,
                    label=r.name if valid_only else f"{r.name} (valid)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("lm loss")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)


_KEEP = ("name", "losses", "valid", "valid_mean", "ms_per_iter", "bytes_per_iter", "ratio",
         "wall_s")


def save_runs(path: str, iters: int, runs: List[RunResult], meta: Optional[dict] = None) -> None:
    """The numbers of `runs` as JSON (atomic), for redrawing tables and plots later; `meta`:
    the settings the table's caption needs (see load_meta)."""
    import dataclasses
    import json
    from megatron.training.checkpointing.save_load import atomic_write_text
    atomic_write_text(path, json.dumps({"iters": iters, "meta": meta or {}, "runs": [
        {k: v for k, v in dataclasses.asdict(r).items() if k in _KEEP} for r in runs]}))


def load_meta(path: str) -> dict:
    """The `meta` given to save_runs ({} for files written without one)."""
    import json
    with open(path) as f:
        return json.load(f).get("meta", {})


def load_runs(path: str):
    """(iters, runs) from a file written by save_runs."""
    import json
    with open(path) as f:
        saved = json.load(f)
    return saved["iters"], [
        RunResult(r["name"], losses={int(k): v for k, v in r["losses"].items()},
                  valid={int(k): v for k, v in r["valid"].items()},
                  valid_mean={int(k): v for k, v in r.get("valid_mean", {}).items()},
                  ms_per_iter=r["ms_per_iter"], bytes_per_iter=r["bytes_per_iter"],
                  ratio=r["ratio"], wall_s=r.get("wall_s", 0.0)) for r in saved["runs"]]
