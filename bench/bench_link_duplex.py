"""Both directions of the slow link at once: how much slower than one?

The cost model's overlapped 1F1B period lets a forward and a backward message cross the link
in opposite directions at the same time. This measures what the slow-link bench's transport
(gloo between two ranks over bench_slow_link's tbf-shaped veth pair) gives when they do. Per
rate, two ranks in the two namespaces move N messages of S bytes:
  one_way    rank 0 sends, rank 1 receives (the link's one-direction time)
  both_ways  each sends to the other at once, one batch_isend_irecv of [isend, irecv] (the
             order megatron.cc.common.transport used before 2026-11-26)
  both_recv_first  the same with [irecv, isend] (the transport's order now)
  alternate  a send, then the reply (strictly one direction at a time)
Each direction carries the same N x S bytes in every pattern; both / one_way is 1.0 for a
full-duplex pipe and 2.0 when the two directions take turns. On gloo the order inside the batch
decides it: send first, the two directions take turns; receive first, they cross.

    sudo python bench/bench_link_duplex.py [--rates none,100mbit,20mbit,5mbit] [--mib 1]

Needs root (network namespaces, veth, tc). Writes bench/results/link_duplex.{json,md}.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_slow_link import SlowLink, parse_rates, rate_bits, require_root  # noqa: E402

PATTERNS = ("one_way", "both_ways", "both_recv_first", "alternate")


def worker(rank: int, master: str, port: int, n: int, size: int) -> None:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=2)
    peer, buf, out = 1 - rank, torch.ones(size // 4), torch.empty(size // 4)

    def one_way():
        for _ in range(n):
            dist.send(buf, 1) if rank == 0 else dist.recv(out, 0)

    def both_ways():
        for _ in range(n):
            ops = [dist.P2POp(dist.isend, buf, peer), dist.P2POp(dist.irecv, out, peer)]
            for r in dist.batch_isend_irecv(ops):
                r.wait()

    def both_recv_first():
        for _ in range(n):
            ops = [dist.P2POp(dist.irecv, out, peer), dist.P2POp(dist.isend, buf, peer)]
            for r in dist.batch_isend_irecv(ops):
                r.wait()

    def alternate():
        for _ in range(n):
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(out, 1)
            else:
                dist.recv(out, 0)
                dist.send(buf, 0)

    seconds = {}
    for name, f in (("warm-up", one_way), ("one_way", one_way), ("both_ways", both_ways),
                    ("both_recv_first", both_recv_first), ("alternate", alternate)):
        dist.barrier()
        time.sleep(1.0)   # the idle link refills tbf's bucket before every pattern alike
        dist.barrier()
        t = time.time()
        f()
        dist.barrier()
        seconds[name] = time.time() - t
    if rank == 0:
        print(json.dumps({k: seconds[k] for k in PATTERNS}), flush=True)
    dist.destroy_process_group()


def measure(link: SlowLink, rate: str, size: int, port: int, seconds: float = 4.0) -> dict:
    # about `seconds` one way on a shaped link, 64 messages unshaped
    n = 64 if rate == "none" else max(2, int(seconds * rate_bits(rate) / 8 / size))
    link.set_rate(rate)
    procs = [subprocess.Popen(
        ["ip", "netns", "exec", link.ns[r], sys.executable, os.path.abspath(__file__),
         "--worker", str(r), link.ip[0], str(port), str(n), str(size)],
        env=dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=link.dev[r]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=900) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{rate}: a rank failed:\n{outs[0][1][-2000:]}\n{outs[1][1][-2000:]}")
    seconds = json.loads(outs[0][0].strip().splitlines()[-1])
    return {"rate": rate, "messages": n, "bytes": size, **seconds,
            "both_over_one": seconds["both_ways"] / seconds["one_way"],
            "recv_first_over_one": seconds["both_recv_first"] / seconds["one_way"],
            "alternate_over_one": seconds["alternate"] / seconds["one_way"]}


def table(rows) -> str:
    out = ["| link | messages x size | one way s | both ways, send first s | both ways, receive "
           "first s | alternate s | send first / one | receive first / one | alternate / one |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['rate']} | {r['messages']} x {r['bytes'] / 2**20:g} MiB | "
                   f"{r['one_way']:.3f} | {r['both_ways']:.3f} | {r['both_recv_first']:.3f} | "
                   f"{r['alternate']:.3f} | {r['both_over_one']:.2f} | "
                   f"{r['recv_first_over_one']:.2f} | {r['alternate_over_one']:.2f} |")
    return "\n".join(out)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        rank, master, port, n, size = sys.argv[2:7]
        return worker(int(rank), master, int(port), int(n), int(size))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="none,100mbit,20mbit,5mbit",
                   help="comma-separated: none or <n>kbit/mbit/gbit for tc tbf")
    p.add_argument("--mib", type=float, default=1.0, help="message size in MiB (default 1)")
    p.add_argument("--seconds", type=float, default=4.0,
                   help="one-way time to aim each shaped pattern at (default 4; at 5 Mbit/s "
                        "that is only 2 messages of 1 MiB)")
    p.add_argument("--port", type=int, default=29990)
    p.add_argument("--tbf-queue-ms", type=float, default=None,
                   help="tbf queue as time at the rate (default: bench_slow_link's 512 KiB+)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    a = p.parse_args()
    try:
        rates = parse_rates(a.rates)   # a bad rate is named before any namespace exists
    except ValueError as e:
        p.error(str(e))
    require_root()
    rows = []
    with SlowLink(queue_ms=a.tbf_queue_ms) as link:
        for rate in rates:
            rows.append(measure(link, rate, int(a.mib * 2**20), a.port, a.seconds))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "link_duplex.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(a.out, "link_duplex.md"), "w") as f:
        f.write("gloo between two ranks over bench_slow_link's tbf-shaped veth pair: each "
                "direction carries the same bytes in every pattern\n\n" + table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
