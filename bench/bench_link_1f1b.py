"""The pipeline's own message pattern on the slow link, with compute replaced by sleeps.

bench_slow_link.py measures whole training runs; this runs the same 1F1B loop
(megatron.cc.pipeline.schedule.forward_backward, real PipelineChannels over gloo between two ranks on
bench_slow_link's tbf-shaped veth pair) with a stand-in stage step that sleeps for each
stage's measured compute (--slot-ms: forward + backward per micro-batch, a third forward),
so the link is the only thing that varies. Per exchange mode (sync, prefetch = the
overlapped mode on gloo) it prints the time per iteration beside the cost model's
(megatron.cc.plan.step_time: sync_period / overlapped_period over transfer_seconds on the
validator's link), and a timeline of every message: when its sender posted it, when the
receiving stage had it (the end of its wait), and the link time that implies.

    sudo python bench/bench_link_1f1b.py [--rates 5mbit] [--mib 1] [--slot-ms 141,235]
        [--tcp-congestion-control bbr,cubic]   (one link each, one after the other)

Needs root (network namespaces, veth, tc). Writes bench/results/link_1f1b.{json,md}.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from bench_slow_link import (SlowLink, add_congestion_control_flag,  # noqa: E402
                             check_congestion_control, parse_rates, require_root)

MODES = ("sync", "prefetch")


class SleepStep:
    """A stage that computes nothing: forward sleeps a third of its slot, backward the rest;
    notes when each compute started (its input had arrived) and ended (its output posted)."""

    def __init__(self, slot_s: float, shape, last: bool, log: list, M: int):
        import torch
        self.t_f, self.t_b, self.last, self.log = slot_s / 3, 2 * slot_s / 3, last, log
        self.order = iter(range(M))   # 1F1B runs the backwards in micro-batch order
        self.out = torch.ones(shape)
        self.loss = torch.zeros(())

    def sample_ids(self, mb):
        import torch
        return torch.tensor([mb])

    def _run(self, kind, mb, seconds):
        t0 = time.time()
        time.sleep(seconds)
        self.log.append((kind, mb, t0, time.time()))

    def forward(self, x, mb):
        self._run("F", mb, self.t_f)
        return self.loss if self.last else self.out

    def backward(self, x, y, g):
        self._run("B", next(self.order), self.t_b)
        return self.out


def worker(rank: int, master: str, port: int, mode: str, numel: int, slots, M: int,
           iters: int) -> None:
    import torch
    import torch.distributed as dist
    from megatron.cc.pipeline.p2p import Link, PipelineChannels
    from megatron.cc.pipeline.schedule import Schedule, forward_backward
    from megatron.cc.common.stats import ChannelStats
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=2)
    links = dict(next_fwd=Link("pp-fwd", 1), next_bwd=Link("pp-bwd", 1)) if rank == 0 else \
        dict(prev_fwd=Link("pp-fwd", 0), prev_bwd=Link("pp-bwd", 0))
    shape = (numel,)
    ch = PipelineChannels(shape, torch.float32, ChannelStats(), **links)
    posts = []   # (channel, micro-batch, time the send was posted)
    post = ch.post

    def noted(send, recv):
        if send is not None:
            posts.append((send[0].channel, send[2].microbatch, time.time()))
        return post(send, recv)
    ch.post = noted
    iterations = []
    for it in range(iters):
        log = []
        step = SleepStep(slots[rank], shape, rank == 1, log, M)
        posts.clear()
        dist.barrier()
        t0 = time.time()
        forward_backward(step, ch, M, it, rank, 2, Schedule(exchange=mode))
        dist.barrier()
        iterations.append({"t0": t0, "t1": time.time(), "compute": list(log),
                           "posts": list(posts)})
    print(json.dumps(iterations), flush=True)
    dist.destroy_process_group()


def model_ms(rate: str, nbytes: int, slots, M: int, mode: str) -> float:
    """The cost model's time per iteration of this pattern (pp 2, no codecs)."""
    from validate_cost_model import links_at
    from megatron.cc.plan.links import Cluster
    from megatron.cc.plan.step_time import (steady_overlapped_period, sync_period,
                                            transfer_seconds)
    cl = Cluster(nodes=2, gpus_per_node=1, links=links_at(rate, 10.0, 100.0),
                 datacentres=[[0], [1]])
    top = max(slots)

    def c(refill):
        return transfer_seconds(cl, "inter_datacentre", nbytes, refill)
    alone = c(top)
    if mode == "sync":   # the steady batches cross: each direction its own message
        period = sync_period(slots, c(top), c(top))
    else:   # one flow a direction: a message alone is its direction's whole load
        period, (alone, _), _ = steady_overlapped_period(
            slots, lambda refill: ((c(refill),) * 2, (c(refill),) * 2), top)
    return 1e3 * ((M + 1) * top + 2 * alone + (M - 1) * (period - top))


def timeline(its, M):
    """Per message (channel, micro-batch): posted by its sender, had by its receiver (the
    start of the compute that used it), seconds from the iteration's start on rank 0."""
    rows = []
    for a, b in zip(*its):
        t0 = a["t0"]
        fstart = {mb: s for k, mb, s, _ in b["compute"] if k == "F"}
        bstart = {mb: s for k, mb, s, _ in a["compute"] if k == "B"}
        msgs = [("pp-fwd", mb, t, fstart.get(mb)) for ch, mb, t in a["posts"] if ch == "pp-fwd"]
        msgs += [("pp-bwd", mb, t, bstart.get(mb)) for ch, mb, t in b["posts"] if ch == "pp-bwd"]
        rows.append([(ch, mb, round(p - t0, 3), round(r - t0, 3)) for ch, mb, p, r in
                     sorted(msgs, key=lambda m: m[2])])
    return rows


def measure(link, rate, mode, nbytes, slots, M, iters, port):
    link.set_rate(rate)
    procs = [subprocess.Popen(
        ["ip", "netns", "exec", link.ns[r], sys.executable, os.path.abspath(__file__),
         "--worker", str(r), link.ip[0], str(port), mode, str(nbytes // 4),
         json.dumps(slots), str(M), str(iters)],
        env=dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=link.dev[r]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=3600) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{rate} {mode}: a rank failed:\n{outs[0][1][-2000:]}\n"
                           f"{outs[1][1][-2000:]}")
    its = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    ms = [1e3 * (x["t1"] - x["t0"]) for x in its[0]][1:]   # the first is a warm-up
    return {"rate": rate, "mode": mode, "bytes": nbytes, "slots_ms": [1e3 * s for s in slots],
            "microbatches": M, "ms": ms, "model_ms": model_ms(rate, nbytes, slots, M, mode),
            "timeline": timeline(its, M)[1:]}


def table(rows) -> str:
    out = ["| TCP | link | mode | measured ms/iter (each) | model ms/iter | error |",
           "|---|---|---|---|---:|---:|"]
    for r in rows:
        m = statistics.mean(r["ms"])
        each = ", ".join(f"{x:.0f}" for x in r["ms"])
        out.append(f"| {r.get('tcp_congestion_control', '?')} | {r['rate']} | {r['mode']} | "
                   f"{m:.0f} ({each}) | {r['model_ms']:.0f} | {(r['model_ms'] - m) / m:+.1%} |")
    return "\n".join(out)


def message_table(r) -> str:
    out = [f"{r.get('tcp_congestion_control', '?')}, {r['rate']} {r['mode']}, the last "
           "iteration: seconds from its start",
           "| message | posted | had | had - posted |", "|---|---:|---:|---:|"]
    for ch, mb, p, h in r["timeline"][-1]:
        out.append(f"| {ch} {mb} | {p:.3f} | {h:.3f} | {h - p:.3f} |")
    return "\n".join(out)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        rank, master, port, mode, numel, slots, M, iters = sys.argv[2:10]
        return worker(int(rank), master, int(port), mode, int(numel), json.loads(slots),
                      int(M), int(iters))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="5mbit", help="comma-separated <n>kbit/mbit/gbit for tc tbf")
    p.add_argument("--modes", default=",".join(MODES), help="exchange modes: sync, prefetch")
    p.add_argument("--mib", type=float, default=1.0, help="message size in MiB")
    p.add_argument("--slot-ms", default="141,235",
                   help="each stage's compute per micro-batch, ms (default: bench_slow_link's "
                        "uncompressed stages as the validator calibrates them)")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--iters", type=int, default=4, help="iterations per run (the first is a warm-up)")
    p.add_argument("--port", type=int, default=29970)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    add_congestion_control_flag(p)
    a = p.parse_args()
    try:
        rates = parse_rates(a.rates)
        slots = [float(x) / 1e3 for x in a.slot_ms.split(",")]
        ccs = a.tcp_congestion_control.split(",") if a.tcp_congestion_control else [None]
        for cc in ccs:
            check_congestion_control(cc)
    except ValueError as e:
        p.error(str(e))
    modes = a.modes.split(",")
    if any(m not in MODES for m in modes):
        p.error(f"--modes: expected a list of {', '.join(MODES)}, got {a.modes!r}")
    if len(slots) != 2:
        p.error("--slot-ms: two stages, two numbers (e.g. 141,235)")
    if a.iters < 2:
        p.error("--iters: at least 2 (the first is a warm-up)")
    require_root()
    rows = []
    port = a.port
    for want in ccs:   # a link per congestion control: every socket starts with it
        with SlowLink(congestion_control=want) as link:
            cc = link.congestion_control_in_use()
            for rate in rates:
                for mode in modes:
                    port += 1
                    rows.append(dict(measure(link, rate, mode, int(a.mib * 2**20), slots,
                                             a.microbatches, a.iters, port),
                                     tcp_congestion_control=cc))
                    print(table(rows).splitlines()[-1], flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "link_1f1b.json"), "w") as f:
        json.dump(rows, f, indent=1)
    text = (table(rows) + "\n\n" + "\n\n".join(message_table(r) for r in rows) + "\n")
    with open(os.path.join(a.out, "link_1f1b.md"), "w") as f:
        f.write("The 1F1B loop's messages on the slow link, compute replaced by sleeps "
                "(bench_link_1f1b.py)\n\n" + text)
    print(text)


if __name__ == "__main__":
    main()
