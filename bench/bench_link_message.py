"""One message after the link idled, alone and crossing one the other way: the cost model's rule.

The cost model (megatron/cc/plan/step_time.py, `transfer_seconds`) charges a message of x
bytes on a tbf-shaped link latency + max(0, x - tokens) / rate, the bucket holding
min(burst, rate x idle) tokens after the link idled. This checks that rule message by message
on bench_slow_link's link (gloo between two ranks over the tbf-shaped veth pair), the way a
pipeline uses it: after an idle gap (--gap, longer than the bucket's refill) rank A sends one
message to B,
  alone     and nothing else moves;
  crossing  and B sends one of the same size to A, starting --offsets seconds after A
            (receives posted first, as megatron.cc.common.transport posts them).
Each message's time runs from its send to its receive's completion (one clock: both
namespaces share the kernel's). Prints, per rate, size and pattern, the mean and the worst
message next to the rule's prediction (the validator's link: tbf rate as TCP payload, 128 KiB
burst).

    sudo python bench/bench_link_message.py [--rates 5mbit,20mbit] [--mib 1,0.25] [--repeats 4]

Needs root (network namespaces, veth, tc). Writes bench/results/link_message.{json,md}.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from bench_slow_link import SlowLink, parse_rates, require_root  # noqa: E402


def worker(rank: int, master: str, port: int, size: int, offsets, repeats: int,
           gap: float) -> None:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=2)
    peer, buf, out = 1 - rank, torch.ones(size // 4), torch.empty(size // 4)
    times = []   # (pattern offset or None, repeat, send time, receive-complete time)
    for off in [None] + list(offsets):
        for i in range(repeats + 1):   # the first of each is a warm-up, left out
            dist.barrier()
            time.sleep(gap)            # the idle link refills tbf's bucket
            dist.barrier()
            base = time.time()
            sends, receives = rank == 0 or off is not None, rank == 1 or off is not None
            got = []
            if receives:   # a thread notes the receive's end, even while
                r = dist.irecv(out, peer)      # this rank sleeps until its own send
                waiter = threading.Thread(target=lambda: (r.wait(), got.append(time.time())))
                waiter.start()
            if sends:
                time.sleep(max(0.0, base + (off or 0.0) * rank - time.time()))
            t_send = time.time()
            s = dist.isend(buf, peer) if sends else None
            if receives:
                waiter.join()
            if s is not None:
                s.wait()
            times.append((off, i, t_send if sends else None, got[0] if got else None))
    print(json.dumps(times), flush=True)
    dist.destroy_process_group()


def rule_ms(rate: str, size: int) -> float:
    """The cost model's time for `size` bytes after a full refill, on the validator's link."""
    from validate_cost_model import links_at
    from megatron.cc.plan.links import Cluster
    from megatron.cc.plan.step_time import transfer_seconds
    cl = Cluster(nodes=2, gpus_per_node=1, links=links_at(rate, 10.0, 100.0),
                 datacentres=[[0], [1]])
    return 1e3 * transfer_seconds(cl, "inter_datacentre", size, refill_s=1e9)


def measure(link: SlowLink, rate: str, size: int, offsets, repeats: int, gap: float,
            port: int) -> list:
    link.set_rate(rate)
    procs = [subprocess.Popen(
        ["ip", "netns", "exec", link.ns[r], sys.executable, os.path.abspath(__file__),
         "--worker", str(r), link.ip[0], str(port), str(size), json.dumps(offsets),
         str(repeats), str(gap)],
        env=dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=link.dev[r]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=1800) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{rate}: a rank failed:\n{outs[0][1][-2000:]}\n{outs[1][1][-2000:]}")
    a, b = (json.loads(o[0].strip().splitlines()[-1]) for o in outs)
    rows, rule = [], rule_ms(rate, size)
    for off in [None] + list(offsets):
        ab = [1e3 * (y[3] - x[2]) for x, y in zip(a, b) if x[0] == off and x[1] > 0]
        ba = [1e3 * (x[3] - y[2]) for x, y in zip(a, b) if x[0] == off and x[1] > 0 and
              off is not None]
        rows.append({"rate": rate, "bytes": size, "pattern": "alone" if off is None else
                     f"crossing +{off:g} s", "rule_ms": rule, "a_to_b_ms": ab, "b_to_a_ms": ba})
    return rows


def table(rows) -> str:
    out = ["| link | size | pattern | rule ms | A->B mean (worst) ms | B->A mean (worst) ms |",
           "|---|---|---|---:|---:|---:|"]
    for r in rows:
        def cell(xs):
            return f"{statistics.mean(xs):.0f} ({max(xs):.0f})" if xs else "-"
        out.append(f"| {r['rate']} | {r['bytes'] / 2**20:g} MiB | {r['pattern']} | "
                   f"{r['rule_ms']:.0f} | {cell(r['a_to_b_ms'])} | {cell(r['b_to_a_ms'])} |")
    return "\n".join(out)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        rank, master, port, size, offsets, repeats, gap = sys.argv[2:9]
        return worker(int(rank), master, int(port), int(size), json.loads(offsets),
                      int(repeats), float(gap))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="5mbit,20mbit",
                   help="comma-separated <n>kbit/mbit/gbit for tc tbf")
    p.add_argument("--mib", default="1,0.25", help="message sizes in MiB, comma-separated")
    p.add_argument("--offsets", default="0,0.3,0.8",
                   help="seconds after A's send that B sends its crossing message")
    p.add_argument("--repeats", type=int, default=4, help="messages per pattern (plus a warm-up)")
    p.add_argument("--gap", type=float, default=0.6,
                   help="idle seconds before each message (default 0.6: a full 128 KiB refill "
                        "down to 2 Mbit/s)")
    p.add_argument("--port", type=int, default=29960)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    a = p.parse_args()
    try:
        rates = parse_rates(a.rates)
        sizes = [int(float(x) * 2**20) for x in a.mib.split(",")]
        offsets = [float(x) for x in a.offsets.split(",")]
    except ValueError as e:
        p.error(str(e))
    if "none" in rates:
        p.error("--rates: 'none' has no bucket to check; give shaped rates only")
    require_root()
    rows = []
    with SlowLink() as link:
        for i, rate in enumerate(rates):
            for j, size in enumerate(sizes):
                rows += measure(link, rate, size, offsets, a.repeats, a.gap,
                                a.port + i * len(sizes) + j)
                print(table(rows).splitlines()[-1], flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "link_message.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(a.out, "link_message.md"), "w") as f:
        f.write("One message after an idle link (gloo, bench_slow_link's tbf-shaped veth pair) "
                "against the cost model's rule latency + max(0, x - burst) / rate\n\n"
                + table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
