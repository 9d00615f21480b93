"""The cost model against the real slow link: predicted vs measured step time, run by run.

Reads the records of bench/bench_slow_link.py (its JSON) and, for each, asks the cost model
(megatron/cc/plan/step_time.py) for the step time of that exact run: the same pretrain_gpt.py
flags (bench_slow_link.run_argv, parsed by tools/plan_compression.parse_run), on a cluster
whose two datacentres are the two sides of the veth pair, ranks placed as the bench places
them (bench_slow_link.side_of):
  inter_datacentre  the veth pair, shared by every flow crossing it: the tbf rate as TCP
                    payload (x 1448 / 1514: full segments with Ethernet, IPv4 and
                    TCP+timestamp headers), tbf's 128 KiB burst (as payload too) and
                    --latency-us; unshaped ('none'): --veth-gbps
  intra_node        processes of one side over loopback: --veth-gbps
Codec throughput: the model's CPU table. Compute: the model's one measured input, calibrated
per placement on that placement's fastest unthrottled uncompressed run (synchronous or
overlapped: the same work on an idle link, and other load on the box can only lengthen a
run): the TFLOP/s at which the model predicts that run's step time exactly. Every other run
of the placement is a prediction; the calibration run itself is listed with error 0.

    python bench/validate_cost_model.py bench/results/slow_link.json [more.json ...]

Prints a table (link, configuration, sync/overlap, measured and predicted ms/iter, error) and
the worst case; --out writes it as markdown. Records of configurations the cost model does not
cover (subspace, auto) are listed as not modelled.
"""
import argparse
import json
import os
import re
import sys
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from bench_slow_link import (CONFIGS, PLACEMENT, rate_bits, run_argv, side_of,  # noqa: E402
                             with_virtual)
from megatron.cc.plan.links import Cluster, LinkSpec  # noqa: E402
from megatron.cc.plan.shapes import ModelShape  # noqa: E402
from megatron.cc.plan.step_time import step_time  # noqa: E402
from megatron.training.compression.auto_compression import layout_of  # noqa: E402
from tools.plan_compression import PlanError, parse_run, vocab_size  # noqa: E402

UNCOMPRESSED = ("uncompressed", "uncompressed-dp", "uncompressed-both", "tp2-uncompressed")
PAYLOAD_SHARE = 1448 / 1514   # TCP payload of a full frame that tbf counts whole
TBF_BURST_KB = 128            # bench_slow_link's `tc ... tbf burst 128kb` (KiB, frames)


class SlowLinkCluster(Cluster):
    """The two sides of the veth pair as two datacentres, ranks on them as the bench puts them.

    The link is one pipe that every rank of a side shares (each direction at the tbf rate),
    which is the cost model's inter-datacentre level: its bandwidth is divided among the
    flows crossing it at once (the two stages' dp all-reduces of the dp placement, say)."""

    def __init__(self, placement: str, links: Dict[str, LinkSpec], tflops: float):
        pp, dp, tp = PLACEMENT[placement]
        super().__init__(nodes=2, gpus_per_node=pp * dp * tp, links=links,
                         tflops_per_gpu=tflops, device="cpu", datacentres=[[0], [1]])
        self.side = [side_of(r, placement, dp, tp) for r in range(pp * dp * tp)]

    def level(self, a: int, b: int) -> str:
        return "intra_node" if self.side[a] == self.side[b] else "inter_datacentre"

    def rank_datacentre(self, rank: int) -> int:
        return self.side[rank]


def links_at(rate: str, veth_gbps: float, latency_us: float) -> Dict[str, LinkSpec]:
    fast = LinkSpec(veth_gbps, latency_us)
    link = fast if rate == "none" else LinkSpec(rate_bits(rate) * PAYLOAD_SHARE / 1e9,
                                                latency_us, TBF_BURST_KB * PAYLOAD_SHARE)
    return {"intra_node": fast, "inter_node": fast, "inter_datacentre": link}


class Model:
    """The parsed run of one record (shape, layout, compression config)."""

    def __init__(self, rec: dict, a):
        argv = run_argv(rec["config"], rec["overlap"], rec.get("iterations", 4) + 2,
                        rec.get("microbatches", 8))
        args = parse_run(argv, rec["world"])
        self.shape = ModelShape.from_args(args.model, vocab_size(args, a.vocab_size))
        self.layout, self.c = layout_of(args), args.compression

    def seconds(self, rec: dict, tflops: float, a) -> float:
        cl = SlowLinkCluster(rec["placement"], links_at(rec["rate"], a.veth_gbps, a.latency_us),
                             tflops)
        return step_time(self.shape, self.layout, self.c, cl, overlap=rec["overlap"]).total


def calibrate(model: Model, rec: dict, a) -> float:
    """TFLOP/s at which the model predicts `rec`'s measured step time (bisection in log)."""
    want, lo, hi = rec[a.stat] / 1e3, 1e-6, 1e3
    if model.seconds(rec, hi, a) >= want:
        raise ValueError(f"{rec['config']}: the model's communication alone exceeds the "
                         f"measured {want:.3f} s")
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if model.seconds(rec, mid, a) > want else (lo, mid)
    return (lo * hi) ** 0.5


def modelled(rec: dict) -> bool:
    flags = CONFIGS[rec["config"]][1]
    return "--compression" not in flags and "subspace" not in flags


def register_twins(records: List[dict]) -> None:
    """The bench's interleaved twins (`<name>-vpN`, made by its --virtual-pipeline N) back in
    CONFIGS, so their records give their own flags."""
    for rec in records:
        m = re.fullmatch(r"(.+)-vp(\d+)", rec["config"])
        if m and rec["config"] not in CONFIGS:
            with_virtual([m.group(1)], int(m.group(2)))


def validate(records: List[dict], a) -> Tuple[List[dict], Dict[str, float]]:
    """Rows (rate, config, overlap, measured, predicted, error, note) and the calibrated
    TFLOP/s per placement."""
    register_twins(records)
    rows = []
    rates: Dict[str, float] = {}
    calib: Dict[str, dict] = {}
    for rec in records:   # per placement its fastest unthrottled uncompressed run (sync or
        # overlapped: the same work on an idle link; other load on the box only lengthens)
        if rec["rate"] == "none" and rec["config"] in UNCOMPRESSED and (
                rec["placement"] not in calib or rec[a.stat] < calib[rec["placement"]][a.stat]):
            calib[rec["placement"]] = rec
    for placement, rec in calib.items():
        rates[placement] = calibrate(Model(rec, a), rec, a)
    for rec in records:
        row = dict(rate=rec["rate"], config=rec["config"], overlap=rec["overlap"],
                   measured=rec[a.stat], predicted=None, error=None, note="")
        if not modelled(rec):
            row["note"] = "not modelled"
        elif rec["placement"] not in rates:
            row["note"] = "no calibration run (unthrottled, uncompressed) in the JSON"
        else:
            try:
                row["predicted"] = 1e3 * Model(rec, a).seconds(rec, rates[rec["placement"]], a)
                row["error"] = 100 * (row["predicted"] - row["measured"]) / row["measured"]
            except (PlanError, NotImplementedError, ValueError) as e:
                row["note"] = f"not modelled: {e}"
        rows.append(row)
    return rows, rates


def table(rows: List[dict], rates: Dict[str, float], tol: float) -> List[str]:
    out = ["| link | configuration | mode | measured ms/iter | predicted ms/iter | error |",
           "|---|---|---|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (-rate_bits(r["rate"]), r["config"], r["overlap"])):
        mode = "overlap" if r["overlap"] else "sync"
        if r["predicted"] is None:
            out.append(f"| {r['rate']} | {r['config']} | {mode} | {r['measured']:.0f} | - | "
                       f"{r['note']} |")
            continue
        flag = "" if abs(r["error"]) <= tol else " **x**"
        out.append(f"| {r['rate']} | {r['config']} | {mode} | {r['measured']:.0f} | "
                   f"{r['predicted']:.0f} | {r['error']:+.1f}%{flag} |")
    done = [r for r in rows if r["predicted"] is not None]
    if done:
        worst = max(done, key=lambda r: abs(r["error"]))
        inside = sum(abs(r["error"]) <= tol for r in done)
        out += ["", f"{inside} of {len(done)} predictions within {tol:g}%; worst: "
                    f"{worst['config']} at {worst['rate']} "
                    f"({'overlap' if worst['overlap'] else 'sync'}), {worst['error']:+.1f}%",
                "calibrated compute: " + ", ".join(f"{k} {v * 1e3:.2f} GFLOP/s per rank"
                                                   for k, v in sorted(rates.items()))]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("json", nargs="+", help="bench_slow_link.py result files")
    p.add_argument("--veth-gbps", type=float, default=10.0,
                   help="unshaped veth / loopback bandwidth (default 10 Gbit/s)")
    p.add_argument("--latency-us", type=float, default=100.0, help="one-way latency (100 us)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="the runs' vocabulary (default: the embedded corpus's, as the bench)")
    p.add_argument("--stat", choices=["ms_per_iter", "ms_min"], default="ms_per_iter",
                   help="measured time: the median iteration (default) or the fastest, which "
                        "other load on the machine can only lengthen")
    p.add_argument("--tolerance", type=float, default=15.0, help="percent (default 15)")
    p.add_argument("--out", default=None, help="write the table here (markdown)")
    a = p.parse_args(argv)
    records = [r for path in a.json for r in json.load(open(path))]
    rows, rates = validate(records, a)
    lines = table(rows, rates, a.tolerance)
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            f.write(f"Cost model vs {', '.join(a.json)}\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
