"""Training step time on a real, rate-limited link: compression and overlap against bandwidth.

Builds its own test network: two network namespaces joined by a veth pair whose two ends are
shaped with `tc tbf` (each direction at the rate asked), and places the ranks so that the
channel under test crosses the link:

  pp    pipeline stage 0 on side A, stage 1 on side B (pp=2, dp=1): pp-fwd/pp-bwd cross
  dp    replica 0 on A, replica 1 on B (pp=2, dp=2): only the dp all-reduce crosses
  both  (stage, replica) on A when stage + replica is even (pp=2, dp=2): everything crosses

Every configuration runs at every rate, synchronously and with --overlap-p2p-comm
--overlap-grad-reduce, one after the other in this invocation; the table gives ms per
iteration (median after --skip start-up iterations), the bytes per iteration counted by the
veth counters next to the bytes the log line reports for the channels that cross, and the
final loss. Wire payload = veth tx bytes of both ends minus 66 bytes (Ethernet 14 + IPv4 20 +
TCP 32 with timestamps) per packet, over the measured iterations only; the remainder against
the logged bytes is gloo's own framing plus the log line's all-gather and loss all-reduce.

    sudo python bench/bench_slow_link.py                       # everything, rates none,100mbit,20mbit
    sudo python bench/bench_slow_link.py --rates none,100mbit,20mbit,5mbit \\
        --configs uncompressed,all-pipeline --iters 6
    # 1F1B vs interleaved 1F1B (2 model chunks per stage), with and without compression:
    sudo python bench/bench_slow_link.py --configs uncompressed,all-pipeline --virtual-pipeline 2
    python bench/bench_slow_link.py --replot                   # table + plot from the JSON

Root is needed (namespaces, veth, tc); without it the script stops with one line. The
namespaces and the veth pair are deleted on exit, on errors and on Ctrl-C.
Results: bench/results/slow_link.json (appended run by run), slow_link.md, slow_link.png.
"""
import argparse
import atexit
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
HEADER_BYTES = 66   # Ethernet 14 + IPv4 20 + TCP 20 + timestamp option 12, per packet

# The model: 4 layers, hidden 256, seq 256, micro-batch 4, 8 micro-batches, untied.
MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
         "--seq-length", "256", "--micro-batch-size", "4", "--untie-embeddings-and-output-weights",
         "--lr", "1e-4", "--lr-decay-style", "constant", "--attention-dropout", "0",
         "--hidden-dropout", "0", "--log-interval", "1", "--eval-interval", "1000000",
         "--eval-iters", "0", "--seed", "1234"]
FP4 = ["--forward-compress-method", "fixpoint", "--forward-bits", "4"]
CB = ["--inter-grad-comp", "--inter-grad-comp-rank", "16"]
LEP = ["--use-error-feedback"]
SC = ["--grad-comp", "--grad-comp-rank", "16", "--grad-comp-warm-up", "0"]

# name -> (placement, flags); placement fixes pp, dp and which side each rank is on
CONFIGS: Dict[str, tuple] = {
    "uncompressed": ("pp", []),
    "fixpoint4-fwd": ("pp", FP4),
    "tah-fwd": ("pp", ["--forward-compress-method", "tah"]),
    "fixpoint8-bwd": ("pp", ["--backward-compress-method", "fixpoint", "--backward-bits", "8"]),
    "cb16-bwd": ("pp", CB),
    "cb16+lep-bwd": ("pp", CB + LEP),
    "all-pipeline": ("pp", FP4 + CB + LEP),
    # Subspace Networks, rank 10 at 4 bits both ways (x101.6 at the demo shape)
    "subspace": ("pp", ["--forward-compress-method", "subspace", "--subspace-rank", "10",
                        "--subspace-constrain", "writes"]),
    # --compression auto: the run probes its link and picks codecs and overlap itself (one run
    # per rate, in the sync column: the overlap flags are its own choice)
    "auto": ("pp", ["--compression", "auto"]),
    "uncompressed-dp": ("dp", []),
    "sc16": ("dp", SC),
    # SparseLoCo at its codec defaults with the paper's H = 15: dp bytes every 15th step only
    "sparseloco-dp": ("dp", ["--dp-mode", "sparseloco", "--diloco-inner-steps", "15"]),
    "uncompressed-both": ("both", []),
    "everything": ("both", FP4 + CB + LEP + SC),
    # tp = 2 inside each side, the pipeline across: Megatron v2.5's scatter-gather sends (the
    # default), whole messages from each tp rank, sequence parallelism's shards
    "tp2-uncompressed": ("pp-tp2", []),
    "tp2-no-scatter-gather": ("pp-tp2", ["--no-scatter-gather-tensors-in-pipeline"]),
    "tp2-sp": ("pp-tp2", ["--sequence-parallel"]),
    "tp2-sp-all-pipeline": ("pp-tp2", ["--sequence-parallel"] + FP4 + CB + LEP),
}
# placement -> (pp, dp, tp)
PLACEMENT = {"pp": (2, 1, 1), "dp": (2, 2, 1), "both": (2, 2, 1), "pp-tp2": (2, 1, 2)}


def with_virtual(names: List[str], vp: Optional[int]) -> List[str]:
    """--virtual-pipeline N: after each configuration whose pipeline crosses the link, its
    interleaved twin `<name>-vpN` (N model chunks per stage, the same flags otherwise), so
    1F1B and interleaved 1F1B run side by side. The model's 4 layers need N in {2, 4} at pp 2,
    and the micro-batches per replica a multiple of 2."""
    if not vp or vp == 1:
        return names
    out = []
    for name in names:
        out.append(name)
        placement, flags = CONFIGS[name]
        if placement in ("pp", "both", "pp-tp2") and "-vp" not in name:
            twin = f"{name}-vp{vp}"
            CONFIGS[twin] = (placement, flags + ["--virtual-pipeline-model-parallel-size",
                                                 str(vp)])
            out.append(twin)
    return out
CROSSING = {"pp": ("pp-fwd", "pp-bwd"), "dp": ("dp",), "both": ("pp-fwd", "pp-bwd", "dp"),
            "pp-tp2": ("pp-fwd", "pp-bwd")}
OVERLAP_FLAGS = ["--overlap-p2p-comm", "--overlap-grad-reduce"]
_RATE = re.compile(r"^\d+(\.\d+)?(kbit|mbit|gbit)$")


# ------------------------------------------------------------------------------ parsing
def parse_rates(text: str) -> List[str]:
    rates = [r.strip().lower() for r in text.split(",") if r.strip()]
    bad = [r for r in rates if r != "none" and not _RATE.match(r)]
    if not rates or bad:
        raise ValueError(f"--rates: {bad or text!r} is not a list of none / <n>kbit / <n>mbit / "
                         f"<n>gbit, e.g. none,100mbit,20mbit")
    return rates


def rate_bits(rate: str) -> float:
    """'20mbit' -> 2e7 bit/s; 'none' -> inf."""
    if rate == "none":
        return float("inf")
    n, unit = _RATE.match(rate).group(0)[:-4], rate[-4:]
    return float(n) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[unit]


def parse_configs(text: str) -> List[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in CONFIGS]
    if bad:
        raise ValueError(f"--configs: unknown {bad}; choose from {','.join(CONFIGS)}")
    return names


_ITER = re.compile(r" iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): "
                   r"([\d.]+).*?lm loss: ([\d.E+-]+|nan)")
# "<channel> bytes" and "<channel> inter-node bytes" (what left the node: the link here)
_BYTES = re.compile(r"([a-z-]+(?: inter-node)?) bytes: ([\d.]+)(B|KB|MB|GB)"
                    r"(?: \(x([\d.inf]+)\))?")
_WAIT = re.compile(r"([a-z-]+(?: inter-node)?) wait ms: ([\d.]+)")
_UNIT = {"B": 1, "KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3}


def parse_line(line: str) -> Optional[dict]:
    """One Megatron log line -> {iteration, ms, loss, bytes{channel}, wait_ms{channel}}."""
    m = _ITER.search(line)
    if not m:
        return None
    return {"iteration": int(m.group(1)), "ms": float(m.group(2)), "loss": float(m.group(3)),
            "bytes": {c: float(n) * _UNIT[u] for c, n, u, _ in _BYTES.findall(line)},
            "wait_ms": {c: float(v) for c, v in _WAIT.findall(line)}}


def parse_net_dev(text: str, dev: str) -> dict:
    """/proc/<pid>/net/dev -> the counters of `dev` (both directions of the veth)."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == dev:
            f = [int(x) for x in rest.split()]
            return {"rx_bytes": f[0], "rx_packets": f[1], "tx_bytes": f[8], "tx_packets": f[9]}
    raise ValueError(f"no interface {dev} in /proc/net/dev")


def wire_payload(before: dict, after: dict) -> float:
    """Payload bytes that crossed the link between two readings of one end (both directions)."""
    d = {k: after[k] - before[k] for k in after}
    return (d["tx_bytes"] + d["rx_bytes"]) - HEADER_BYTES * (d["tx_packets"] + d["rx_packets"])


def summarise(lines: List[dict], counters: Dict[int, dict], skip: int, crossing) -> dict:
    """Per-iteration numbers over iterations skip+1 .. last-1.

    Both counter readings are taken at a log line that more training follows, so the few
    bytes the other ranks may already have sent for the next iteration are in both readings
    (the last iteration, followed by nothing, is left out for that reason).
    """
    end = lines[-1]["iteration"] - 1 if lines else 0
    measured = [l for l in lines if skip < l["iteration"] <= end]
    if not measured or skip not in counters or end not in counters:
        raise ValueError(f"need log lines for iterations {skip}..{skip + 2} at least (got "
                         f"{[l['iteration'] for l in lines]}); raise --iters")
    n = end - skip
    # the log's inter-node count where it has one (each side is a node), else the channels
    # the placement sends across
    inter = {c for l in measured for c in l["bytes"] if c.endswith(" inter-node")}
    logged = sum(l["bytes"].get(c, 0.0) for l in measured for c in (inter or crossing)) / n
    wait = {}
    for l in measured:
        for c, v in l["wait_ms"].items():
            wait[c] = wait.get(c, 0.0) + v / len(measured)
    ms = [l["ms"] for l in measured]
    wire = wire_payload(counters[skip], counters[end])
    rec = {"ms_per_iter": statistics.median(ms), "ms_min": min(ms), "ms_mean": statistics.mean(ms),
           "wire_bytes": wire / n, "logged_bytes": logged, "final_loss": last_loss(lines),
           "wait_ms": wait, "iterations": n}
    rec.update(periodic_dp(measured, counters, skip, end))
    return rec


def periodic_dp(measured: List[dict], counters: Dict[int, dict], skip: int, end: int) -> dict:
    """A dp mode that syncs every H-th step (DiLoCo, SparseLoCo): the dp payload on the wire.

    Every iteration also moves a few KB across the link (the log line's all-gather, the loss
    all-reduce). A sync's payload is the wire bytes of its iteration and the next (a reduce may
    drain into it) less two quiet iterations, the median of the others: the estimate then
    carries the quiet traffic's scatter of two iterations, not of the whole window.
    """
    syncs = [l["iteration"] for l in measured if l["bytes"].get("dp", 0.0) > 0]
    if not syncs or len(syncs) * 3 >= len(measured):
        return {}
    diff = {i: wire_payload(counters[i - 1], counters[i]) for i in range(skip + 1, end + 1)
            if i - 1 in counters and i in counters}
    busy = {i + d for i in syncs for d in (0, 1)}
    quiet = statistics.median(v for i, v in diff.items() if i not in busy)
    counted = [i for i in syncs if i + 1 in diff]     # a sync whose next iteration is measured
    if not counted:
        return {}
    logged = {l["iteration"]: l["bytes"]["dp"] for l in measured if l["iteration"] in counted}
    return {"syncs": len(counted), "dp_logged_per_sync": sum(logged.values()) / len(counted),
            "dp_wire_per_sync": sum(diff[i] + diff[i + 1] - 2 * quiet for i in counted)
            / len(counted), "quiet_wire_per_iter": quiet, "wire_per_iter": diff}


def last_loss(lines: List[dict]) -> float:
    return lines[-1]["loss"] if lines else float("nan")


# ------------------------------------------------------------------------------ the network
def tbf_limit(rate: str, queue_ms: Optional[float] = None) -> int:
    """tbf's queue in bytes: by default a few hundred ms (at least 512 KiB, 0.84 s at 5 Mbit/s);
    with queue_ms, that many ms at the rate on top of the 128 KiB burst (tc's own `latency`
    rule), so every rate queues the same time. The burst: one 64 KiB GSO packet must fit."""
    if queue_ms is None:
        return max(int(rate_bits(rate) / 8 * 0.3), 512 * 1024)
    return int(rate_bits(rate) / 8 * queue_ms / 1e3) + 128 * 1024


class SlowLink:
    """Two namespaces and a shaped veth pair; `close()` always removes them.

    `run` executes one command (a list); injectable so the clean-up can be tested without root.
    """

    def __init__(self, tag: Optional[str] = None, run: Callable = None,
                 slow_start_after_idle: Optional[int] = None, queue_ms: Optional[float] = None,
                 congestion_control: Optional[str] = None):
        tag = tag or str(os.getpid())
        self.slow_start_after_idle = slow_start_after_idle
        self.queue_ms = queue_ms
        self.congestion_control = congestion_control
        self.allowed_before: Optional[str] = None   # the host's list, restored on close
        self.ns = (f"mcc{tag}a", f"mcc{tag}b")
        self.dev = (f"mcc{tag}x", f"mcc{tag}y")
        self.ip = ("10.211.0.1", "10.211.0.2")
        self._run = run or (lambda cmd: subprocess.run(cmd, check=True, capture_output=True,
                                                       text=True))
        self.created: List[str] = []

    def sh(self, *cmd):
        return self._run(list(cmd))

    def open(self) -> "SlowLink":
        for ns in self.ns:
            self.sh("ip", "netns", "add", ns)
            self.created.append(ns)
            self.sh("ip", "-n", ns, "link", "set", "lo", "up")
        self.sh("ip", "link", "add", self.dev[0], "netns", self.ns[0], "type", "veth",
                "peer", "name", self.dev[1], "netns", self.ns[1])
        for ns, dev, ip in zip(self.ns, self.dev, self.ip):
            self.sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            self.sh("ip", "-n", ns, "link", "set", dev, "up")
            if self.slow_start_after_idle is not None:   # per namespace
                self.sh("ip", "netns", "exec", ns, "sysctl", "-qw",
                        f"net.ipv4.tcp_slow_start_after_idle={self.slow_start_after_idle}")
        if self.congestion_control is not None:
            self._allow(self.congestion_control)
            for ns in self.ns:   # per namespace; new sockets (every run's) take it
                self.sh("ip", "netns", "exec", ns, "sysctl", "-qw",
                        f"net.ipv4.tcp_congestion_control={self.congestion_control}")
        return self

    def _allow(self, cc: str) -> None:
        """A namespace may only pick a congestion control the host allows: add `cc` to the
        host's list for as long as the link exists."""
        key = "net.ipv4.tcp_allowed_congestion_control"
        allowed = (self.sh("sysctl", "-n", key).stdout or "").split()
        if cc not in allowed:
            self.allowed_before = " ".join(allowed)
            self.sh("sysctl", "-qw", f"{key}={' '.join(allowed + [cc])}")

    def congestion_control_in_use(self) -> str:
        """What new TCP sockets of side A use (the kernel's default unless set)."""
        out = self.sh("ip", "netns", "exec", self.ns[0], "sysctl", "-n",
                      "net.ipv4.tcp_congestion_control")
        return (out.stdout or "").strip()

    def set_rate(self, rate: str) -> None:
        """tbf on both ends (each direction); 'none' removes the shaping."""
        for ns, dev in zip(self.ns, self.dev):
            if rate == "none":
                try:
                    self.sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root")
                except subprocess.CalledProcessError:
                    pass   # nothing to delete
            else:
                limit = tbf_limit(rate, self.queue_ms)
                self.sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root",
                        "tbf", "rate", rate, "burst", "128kb", "limit", str(limit))

    def drops(self) -> List[int]:
        """Packets tbf has dropped so far on each end (its queue full), A then B; 0 unshaped."""
        out = []
        for ns, dev in zip(self.ns, self.dev):
            shown = self.sh("ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev)
            m = re.search(r"dropped (\d+)", shown.stdout or "")
            out.append(int(m.group(1)) if m else 0)
        return out

    def close(self) -> None:
        """Deleting a namespace deletes the veth end inside it, and with it its peer."""
        while self.created:
            ns = self.created.pop()
            try:
                self.sh("ip", "netns", "del", ns)
            except Exception as e:   # keep removing the others
                print(f"bench_slow_link: could not delete namespace {ns}: {e}", file=sys.stderr)
        if self.allowed_before is not None:
            before, self.allowed_before = self.allowed_before, None
            try:
                self.sh("sysctl", "-qw", f"net.ipv4.tcp_allowed_congestion_control={before}")
            except Exception as e:
                print(f"bench_slow_link: could not restore the host's allowed congestion "
                      f"controls ({before}): {e}", file=sys.stderr)

    def __enter__(self):
        atexit.register(self.close)
        try:
            return self.open()
        except BaseException:   # __exit__ is not called when __enter__ raises
            self.close()
            raise

    def __exit__(self, *exc):
        self.close()


AVAILABLE_CC = "/proc/sys/net/ipv4/tcp_available_congestion_control"


def add_congestion_control_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tcp-congestion-control", default=None, metavar="NAME",
                   help="TCP congestion control of both namespaces (e.g. cubic, bbr, reno; "
                        f"one of {AVAILABLE_CC}); default: the kernel's. Each record notes "
                        "the one in use")


def check_congestion_control(name: Optional[str], available: Optional[str] = None) -> None:
    """Refuse, before anything runs, a congestion control this kernel does not have."""
    if name is None:
        return
    if available is None:
        with open(AVAILABLE_CC) as f:
            available = f.read()
    if name not in available.split():
        raise ValueError(f"--tcp-congestion-control {name!r}: this kernel has "
                         f"{', '.join(available.split())} ({AVAILABLE_CC}); pick one of them")


def require_root() -> None:
    if os.geteuid() != 0:
        sys.exit("bench_slow_link: needs root (network namespaces, veth, tc); "
                 "run it with sudo, or use --replot to redraw saved results")


# ------------------------------------------------------------------------------ one run
def side_of(rank: int, placement: str, dp: int, tp: int = 1) -> int:
    """0 (A) or 1 (B); megatron-core orders ranks tp, dp, pp (pp slowest): a tp group stays on
    one side."""
    stage, replica = divmod(rank // tp, dp)
    return {"pp": stage, "dp": replica, "both": (stage + replica) % 2, "pp-tp2": stage}[placement]


def run_argv(name: str, overlap: bool, iters: int, microbatches: int) -> List[str]:
    """pretrain_gpt.py's flags for one configuration (also what the cost model is given)."""
    placement, flags = CONFIGS[name]
    pp, dp, tp = PLACEMENT[placement]
    return MODEL + ["--pipeline-model-parallel-size", str(pp), "--train-iters", str(iters),
                    "--tensor-model-parallel-size", str(tp),
                    "--global-batch-size", str(4 * microbatches * dp)] + flags \
        + (OVERLAP_FLAGS if overlap else [])


def run_one(link: SlowLink, name: str, rate: str, overlap: bool, iters: int, skip: int,
            microbatches: int, timeout: float, port: int, log_dir: str) -> dict:
    placement = CONFIGS[name][0]
    pp, dp, tp = PLACEMENT[placement]
    world = pp * dp * tp
    argv = run_argv(name, overlap, iters, microbatches)
    procs = []
    log_path = os.path.join(log_dir, f"{name}-{rate}-{'ovl' if overlap else 'sync'}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    lines, counters = [], {}
    drops0 = link.drops()
    t0 = time.time()
    with open(log_path, "w") as log:
        try:
            for rank in range(world):
                side = side_of(rank, placement, dp, tp)
                # GROUP_RANK: each side of the link is a node (the log's inter-node fields)
                env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                           GROUP_RANK=str(side),
                           MASTER_ADDR=link.ip[0], MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                           GLOO_SOCKET_IFNAME=link.dev[side],
                           PYTHONPATH=os.pathsep.join(
                               [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
                           PYTHONWARNINGS="ignore")
                cmd = ["ip", "netns", "exec", link.ns[side], sys.executable,
                       os.path.join(ROOT, "pretrain_gpt.py")] + argv
                last = rank == world - 1
                procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, text=True,
                                              stdout=subprocess.PIPE if last else log,
                                              stderr=log, start_new_session=True))
            counters_of = proc_counters(procs[0].pid, link.dev[0])   # rank 0 is on side A
            reader = threading.Thread(target=_read, args=(procs[-1], counters_of, lines,
                                                          counters, log))
            reader.start()
            deadline = time.time() + timeout
            while any(p.poll() is None for p in procs):
                if time.time() > deadline or any(p.poll() not in (None, 0) for p in procs):
                    break
                time.sleep(0.5)
            reader.join(timeout=10)
        finally:
            for p in procs:   # each rank in its own session: end it and only it
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    codes = [p.returncode for p in procs]
    if any(codes):
        raise RuntimeError(f"{name} at {rate} failed (exit codes {codes}); see {log_path}")
    rec = summarise(lines, counters, skip, CROSSING[placement])
    rec.update(config=name, rate=rate, overlap=overlap, placement=placement, world=world,
               microbatches=microbatches,
               wall_s=time.time() - t0, losses=[l["loss"] for l in lines],
               tbf_drops=[b - a for a, b in zip(drops0, link.drops())],
               tcp_congestion_control=link.congestion_control_in_use())
    with open(log_path) as f:   # what --compression auto measured, chose and applied
        auto = re.findall(r"compression auto: ((?:measured|chose|flags).*)", f.read())
    if auto:
        rec["auto"] = auto
    return rec


def _read(proc, counters_of: Callable[[], dict], lines: List[dict], counters: Dict[int, dict],
          log) -> None:
    """Last rank's stdout: read the veth counters the moment each log line appears."""
    for line in proc.stdout:
        log.write(line)
        rec = parse_line(line)
        if rec is not None:
            counters[rec["iteration"]] = counters_of()
            lines.append(rec)
    log.flush()


def proc_counters(pid: int, dev: str) -> Callable[[], dict]:
    """A fast reader (one file read, no process started) of `dev` in the namespace of `pid`."""
    def read():
        with open(f"/proc/{pid}/net/dev") as f:
            return parse_net_dev(f.read(), dev)
    return read


# ------------------------------------------------------------------------------ reporting
def table(records: List[dict]) -> str:
    """rate x configuration, sync and overlapped side by side, ratios against uncompressed."""
    rates = sorted({r["rate"] for r in records}, key=lambda r: -rate_bits(r))
    names = [c for c in CONFIGS if any(r["config"] == c for r in records)]
    by = {(r["config"], r["rate"], r["overlap"]): r for r in records}
    out = ["| link | configuration | ms/iter sync: median (min) | ms/iter overlap: median (min) | overlap speed-up | "
           "vs uncompressed sync | vs own unthrottled | wire MB/iter | logged MB/iter | "
           "wire/logged | final loss | wait ms (overlap) |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for rate in rates:
        for name in names:
            s, o = by.get((name, rate, False)), by.get((name, rate, True))
            if not (s or o):
                continue
            base_name = {"pp": "uncompressed", "dp": "uncompressed-dp",
                         "both": "uncompressed-both", "pp-tp2": "tp2-uncompressed"}[
                (s or o)["placement"]]
            base = by.get((base_name, rate, False))
            best = min(x["ms_per_iter"] for x in (s, o) if x)
            own = [by.get((name, "none", ov)) for ov in (False, True)]
            own_best = min([x["ms_per_iter"] for x in own if x] or [float("nan")])
            r = o or s
            out.append(
                f"| {rate} | {name} | {_ms(s)} | {_ms(o)} | "
                f"{_ratio(s and o and s['ms_per_iter'] / o['ms_per_iter'])} | "
                f"{_ratio(base and base['ms_per_iter'] / best)} | "
                f"{_ratio(best / own_best if own_best == own_best else None)} | "
                f"{r['wire_bytes'] / 1e6:.3f} | {r['logged_bytes'] / 1e6:.3f} | "
                f"{r['wire_bytes'] / r['logged_bytes']:.4f} | {r['final_loss']:.4f} | "
                + ", ".join(f"{c} {v:.0f}" for c, v in sorted((o or {}).get("wait_ms", {}).items()))
                + " |")
    return "\n".join(out)


def periodic_table(records: List[dict]) -> str:
    """Periodic dp modes: mean ms/iter over whole sync periods (the median would hide the sync
    step) against the unthrottled synchronous all-reduce, and the dp payload per sync."""
    rows = [r for r in records if r.get("syncs")]
    if not rows:
        return ""
    base = next((r for r in records if (r["config"], r["rate"], r["overlap"])
                 == ("uncompressed-dp", "none", False)), None)
    out = ["| link | configuration | mode | ms/iter mean | vs unthrottled all-reduce (sync, "
           "mean) | syncs | dp logged KB/sync | dp wire KB/sync | wire/logged | final loss |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (-rate_bits(r["rate"]), r["config"], r["overlap"])):
        vs = f"{r['ms_mean'] / base['ms_mean']:.3f}x" if base and base.get("ms_mean") else "-"
        out.append(f"| {r['rate']} | {r['config']} | {'overlap' if r['overlap'] else 'sync'} | "
                   f"{r['ms_mean']:.0f} | {vs} | {r['syncs']} | "
                   f"{r['dp_logged_per_sync'] / 1024:.1f} | {r['dp_wire_per_sync'] / 1024:.1f} | "
                   f"{r['dp_wire_per_sync'] / r['dp_logged_per_sync']:.4f} | "
                   f"{r['final_loss']:.4f} |")
    return "\n".join(out)


def _ms(r) -> str:
    return f"{r['ms_per_iter']:.0f} ({r['ms_min']:.0f})" if r else "-"


def _ratio(x) -> str:
    return f"{x:.2f}x" if x else "-"


def plot(records: List[dict], path: str) -> None:
    """Log-log: ms/iter against bandwidth, one line per configuration (unthrottled at the right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    finite = [rate_bits(r["rate"]) for r in records if r["rate"] != "none"]
    if not finite:
        return
    free = max(finite) * 10   # where "unthrottled" is drawn
    fig, ax = plt.subplots(figsize=(8, 5))
    keys = sorted({(r["config"], r["overlap"]) for r in records},
                  key=lambda k: (list(CONFIGS).index(k[0]), k[1]))
    for n, (name, ovl) in enumerate(keys):
        pts = sorted((rate_bits(r["rate"]) if r["rate"] != "none" else free, r["ms_per_iter"])
                     for r in records if (r["config"], r["overlap"]) == (name, ovl))
        ax.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], "o-" if ovl else "s--",
                color=plt.cm.tab20(list(CONFIGS).index(name) % 20),   # one colour per configuration
                label=f"{name} ({'overlap' if ovl else 'sync'})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"link bandwidth (Mbit/s; unthrottled drawn at {free / 1e6:.0f})")
    ax.set_ylabel("ms per iteration")
    ax.set_title("step time vs bandwidth (pp=2 across the link; dp/both: see table)")
    ax.legend(fontsize="x-small", loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def load(path: str) -> List[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def save(records: List[dict], path: str) -> None:
    sys.path.insert(0, ROOT)
    from megatron.training.checkpointing.save_load import atomic_write_text
    atomic_write_text(path, json.dumps(records, indent=1))


def report(records: List[dict], out_dir: str) -> str:
    text = table(records)
    periodic = periodic_table(records)
    if periodic:
        text += "\n\nPeriodic dp modes (dp across the link; payload net of the quiet " \
                "iterations' traffic):\n\n" + periodic
    from megatron.training.checkpointing.save_load import atomic_write_text
    atomic_write_text(os.path.join(out_dir, "slow_link.md"), text + "\n")
    plot(records, os.path.join(out_dir, "slow_link.png"))
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="none,100mbit,20mbit",
                   help="link rates to run, fastest first is not required: none (unshaped) or "
                        "<n>kbit/mbit/gbit for tc tbf")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"configurations to run, from: {','.join(CONFIGS)}")
    p.add_argument("--overlap", choices=["both", "on", "off"], default="both",
                   help="run each configuration synchronously, overlapped, or both")
    p.add_argument("--iters", type=int, default=7,
                   help="training iterations per run; iterations --skip+1 .. --iters-1 are measured")
    p.add_argument("--skip", type=int, default=2,
                   help="start-up iterations left out of the timing and the wire bytes")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per replica")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run before it is killed")
    p.add_argument("--out", default=RESULTS, help="directory of slow_link.{json,md,png}")
    p.add_argument("--logs", default=os.path.join(tempfile.gettempdir(), "bench_slow_link_logs"),
                   help="directory of the runs' full logs")
    p.add_argument("--fresh", action="store_true", help="start a new JSON instead of adding to it")
    p.add_argument("--replot", action="store_true", help="only redraw table and plot from the JSON")
    p.add_argument("--virtual-pipeline", type=int, default=None, metavar="N",
                   help="also run each pipeline configuration interleaved, N model chunks per "
                        "stage (rows <name>-vpN): step time of 1F1B vs interleaved 1F1B")
    p.add_argument("--tcp-slow-start-after-idle", type=int, choices=[0, 1], default=None,
                   help="set net.ipv4.tcp_slow_start_after_idle in both namespaces (Linux's "
                        "default 1 restarts a connection's congestion window after an idle "
                        "RTO); default: leave the kernel's setting")
    p.add_argument("--tbf-queue-ms", type=float, default=None,
                   help="tbf's queue as that many ms at the rate on top of the 128 KiB burst "
                        "(default: at least 512 KiB, 0.84 s at 5 Mbit/s)")
    add_congestion_control_flag(p)
    a = p.parse_args(argv)
    try:
        rates, names = parse_rates(a.rates), parse_configs(a.configs)
        names = with_virtual(names, a.virtual_pipeline)
        check_congestion_control(a.tcp_congestion_control)
    except ValueError as e:
        sys.exit(f"bench_slow_link: {e}")
    if a.skip < 1 or a.iters < a.skip + 2:
        sys.exit(f"bench_slow_link: --iters ({a.iters}) must be at least --skip ({a.skip}) + 2, "
                 f"--skip >= 1")
    sys.path.insert(0, ROOT)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "slow_link.json")
    records = [] if a.fresh else load(path)
    for r in records:   # interleaved rows of an earlier run: known configurations again
        m = re.match(r"^(.*)-vp(\d+)$", r["config"])
        if m and m.group(1) in CONFIGS:
            with_virtual([m.group(1)], int(m.group(2)))
    if a.replot:
        print(report(records, a.out))
        return 0
    require_root()
    overlaps = {"both": (False, True), "on": (True,), "off": (False,)}[a.overlap]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the clean-up on kill too
    port = 29400
    with SlowLink(slow_start_after_idle=a.tcp_slow_start_after_idle,
                  queue_ms=a.tbf_queue_ms, congestion_control=a.tcp_congestion_control) as link:
        for rate in rates:
            link.set_rate(rate)
            for name in names:
                for ovl in overlaps:
                    if ovl and "auto" in CONFIGS[name][1]:
                        continue   # auto refuses hand-given overlap flags: it chooses them
                    try:
                        port += 1   # a fresh port per run: no TIME_WAIT clash with the last
                        rec = run_one(link, name, rate, ovl, a.iters, a.skip, a.microbatches,
                                      a.timeout, port, a.logs)
                    except (RuntimeError, ValueError) as e:
                        print(f"bench_slow_link: {e}", file=sys.stderr, flush=True)
                        continue
                    records = [r for r in records if (r["config"], r["rate"], r["overlap"])
                               != (name, rate, ovl)] + [rec]
                    save(records, path)
                    print(f"{rate:>8} {name:>18} {'overlap' if ovl else 'sync':>7}: "
                          f"{rec['ms_per_iter']:.0f} ms/iter, wire {rec['wire_bytes'] / 1e6:.3f} "
                          f"MB vs logged {rec['logged_bytes'] / 1e6:.3f} MB, loss "
                          f"{rec['final_loss']:.4f}, wait {rec['wait_ms']}", flush=True)
                    for line in rec.get("auto", []):
                        print(f"{'':>27}auto: {line}", flush=True)
    print(report(records, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
