"""The cost model at paper and datacentre scale: pure computation.

(b) Optimus-CC's settings: GPT-2.5B and GPT-8.3B at TP8 x PP4 x DP4 on 16 A100 nodes, each
    scheme the paper evaluates (baseline, CB, CB+LEP, +FE, +SC), predicted step time and
    speed-up over the baseline, synchronous 1F1B as in the paper's Megatron v2.5.
(c) GPT-8.3B and a Llama-2-70B-shaped model across 2 and 4 datacentres at 100, 10 and
    1 Gbit/s: the planner's fastest candidate within the quality budget, its step time and
    utilisation (compute / step time), at --bf16 and, separately, in fp32 (where the
    parameter-syncing dp modes, DiLoCo and CocktailSGD, are allowed).

    python bench/plan_at_scale.py              # both tables, ~10 min on one CPU core
    python bench/plan_at_scale.py --only b     # the Optimus-CC table, seconds
    python bench/plan_at_scale.py --replot     # the report again from the saved .json

Writes bench/results/plan_at_scale.md and .json, and the cluster YAMLs it used under
bench/clusters/ (tools/plan_compression.py plan --cluster reads them). Every assumption
below is a constant of this file and is printed in the report.
"""
import argparse
import json
import os
import sys
from dataclasses import asdict, replace
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import yaml  # noqa: E402

from megatron.cc.config import CompressionConfig  # noqa: E402
from megatron.cc.plan.links import Cluster, cluster_from_dict, placement  # noqa: E402
from megatron.cc.plan.planner import layouts, plan  # noqa: E402
from megatron.cc.plan.shapes import Layout, ModelShape  # noqa: E402
from megatron.cc.plan.step_time import step_time  # noqa: E402

RESULTS = os.path.join(HERE, "results")
CLUSTERS = os.path.join(HERE, "clusters")

# ---- models. GPT shapes as the Optimus-CC artifact's scripts (AIS-SNU/Optimus-CC,
# ASPLOS23/tbl2_fig9_tbl4/GPT2-{2.5B,8.3B}-*.sh): GPT-2 BPE vocabulary, learned positions,
# tied embedding, seq 1024.
GPT_2_5B = ModelShape(num_layers=52, hidden_size=1920, num_attention_heads=24, vocab_size=50257,
                      seq_length=1024)
GPT_8_3B = ModelShape(num_layers=72, hidden_size=3072, num_attention_heads=24, vocab_size=50257,
                      seq_length=1024)
# Llama-2-70B's shape: GQA with 8 key/value heads, SwiGLU 28672, RMSNorm, rope, untied, no bias
LLAMA2_70B = ModelShape(num_layers=80, hidden_size=8192, num_attention_heads=64,
                        vocab_size=32000, seq_length=4096, ffn_hidden_size=28672,
                        num_query_groups=8, swiglu=True, normalization="RMSNorm",
                        position_embedding_type="rope",
                        untie_embeddings_and_output_weights=True, disable_bias_linear=True)

# ---- (b) A100 cluster. Achieved rate in the 6 N T rule: 312 TFLOP/s fp16 peak x 0.40
# achieved x 0.75 (the paper's scripts recompute activations: 8 N T of work per 6 N T counted)
A100_TFLOPS = round(312 * 0.40 * 0.75, 1)
A100_NVLINK_GBPS = 1840        # ~230 GB/s NCCL all-reduce bus bandwidth inside a node
# The artifact's README: "Our GPU Box (Node) interconnects with 200Gbps Infiniband". One
# 200 Gbit/s port per node shared by its 8 GPUs is 25 Gbit/s per GPU; a DGX-A100-style node
# (one 200 Gbit/s HCA per GPU) is 200. Both are tabulated.
A100_IB_PER_GPU = {"200 Gbit/s per node": 25, "200 Gbit/s per GPU": 200}
OPTIMUS_BATCH = dict(micro_batch_size=8, global_batch_size=512)   # the artifact's scripts
CB = dict(inter_grad_comp=True, inter_grad_comp_rank=16, inter_grad_comp_epilogue_only=True)
LEP = dict(use_error_feedback=True)
FE = dict(emb_comm_opt=True)
SC = dict(grad_comp=True, grad_comp_rank=128, grad_comp_warm_up=0.1, selective_grad_comp=True,
          selective_grad_comp_way=3)
OPTIMUS_SCHEMES = {"baseline": {}, "CB": CB, "CB+LEP": {**CB, **LEP},
                   "CB+LEP+FE": {**CB, **LEP, **FE},
                   "CB+LEP+FE+SC (Optimus-CC)": {**CB, **LEP, **FE, **SC}}
PAPER_FIGURES = "not found in the sources available here"
PAPER_SOURCES = [
    "github.com/AIS-SNU/Optimus-CC README.md (every stored version) and "
    "ASPLOS23/fig10/*.sh: settings, no speed-up figures",
    "arXiv 2301.09830 abstract (emergentmind, tomesphere, deeppaper, deepai pages): "
    "'superior speedup', no figure",
]

# ---- (c) H100 datacentres. 989 TFLOP/s bf16 dense peak x 0.40; fp32 runs on TF32 tensor
# cores at half that. NVLink 4 ~360 GB/s NCCL bus bandwidth; 400 Gbit/s InfiniBand per GPU.
H100_TFLOPS = {"bf16": round(989 * 0.40, 1), "fp32": round(495 * 0.40, 1)}
NODES_PER_DC = 8               # 64 GPUs per datacentre
WAN_LATENCY_US = 20000         # one way, between any two datacentres
WAN_GBPS = (100, 10, 1)
DATACENTRES = (2, 4)
QUALITY_BUDGET = 2.0           # --compression auto's default, percent of validation loss
WAN_RUNS = {   # model -> (shape, micro-batch, global batch in sequences)
    "GPT-8.3B": (GPT_8_3B, 4, 2048),       # 2M tokens per step
    "Llama-2-70B": (LLAMA2_70B, 1, 1024),  # 4M tokens per step (Llama 2's batch)
}
ANCHORS = {"INTELLECT-1 (10B, DiLoCo + int8, up to 14 nodes on 3 continents)": "83-96%",
           "Covenant-72B (SparseLoCo, ~20 peers of 8xB200 over the internet)": "94.5%"}
ANCHOR_SOURCES = ["arXiv 2412.01152 abstract (INTELLECT-1 Technical Report)",
                  "Covenant AI's launch post, news.ycombinator.com item 47335107 "
                  "(report: arXiv 2603.08163)"]


def a100_cluster(ib_per_gpu_gbps: float) -> Dict:
    return {"nodes": 16, "gpus_per_node": 8, "tflops_per_gpu": A100_TFLOPS, "device": "gpu",
            "gpu_memory_gb": 80,
            "links": {"intra_node": {"bandwidth_gbps": A100_NVLINK_GBPS, "latency_us": 3},
                      "inter_node": {"bandwidth_gbps": ib_per_gpu_gbps, "latency_us": 5}}}


def h100_cluster(datacentres: int, wan_gbps: float, precision: str = "bf16") -> Dict:
    return {"nodes": NODES_PER_DC * datacentres, "gpus_per_node": 8,
            "tflops_per_gpu": H100_TFLOPS[precision], "device": "gpu", "gpu_memory_gb": 80,
            "datacentres": datacentres,
            "links": {"intra_node": {"bandwidth_gbps": 2880, "latency_us": 3},
                      "inter_node": {"bandwidth_gbps": 400, "latency_us": 5},
                      "inter_datacentre": {"bandwidth_gbps": wan_gbps,
                                           "latency_us": WAN_LATENCY_US}}}


# --------------------------------------------------------------------------- (b)

def optimus_rows(models=None, ib=None) -> List[Dict]:
    """One row per (model, IB variant, scheme): predicted step time, its parts, speed-up."""
    models = models or {"GPT-2.5B": GPT_2_5B, "GPT-8.3B": GPT_8_3B}
    ib = ib or A100_IB_PER_GPU
    rows = []
    for name, m in models.items():
        lay = Layout(tp=8, pp=4, dp=4, micro_batch_size=OPTIMUS_BATCH["micro_batch_size"],
                     num_microbatches=OPTIMUS_BATCH["global_batch_size"]
                     // (OPTIMUS_BATCH["micro_batch_size"] * 4), dtype=torch.float16)
        for ib_name, gbps in ib.items():
            cluster = cluster_from_dict(a100_cluster(gbps))
            base = None
            for scheme, overrides in OPTIMUS_SCHEMES.items():
                t = step_time(m, lay, CompressionConfig(**overrides), cluster)
                base = base or t.total
                rows.append({"model": name, "params_b": m.num_params() / 1e9, "ib": ib_name,
                             "scheme": scheme, "step_s": t.total, "speedup": base / t.total,
                             "parts": asdict(t), "paper": PAPER_FIGURES})
    return rows


def optimus_table(rows: List[Dict]) -> List[str]:
    ibs = list(dict.fromkeys(r["ib"] for r in rows))
    head = "| model | scheme | " + " | ".join(f"{i}: step s (speed-up)" for i in ibs) + \
        f" | exposed pp / dp / emb ms ({ibs[0]}) | paper's speed-up |"
    out = [head, "|" + "---|" * (4 + len(ibs))]
    for (model, scheme) in dict.fromkeys((r["model"], r["scheme"]) for r in rows):
        cells = [r for r in rows if (r["model"], r["scheme"]) == (model, scheme)]
        p = cells[0]["parts"]
        out.append(f"| {model} | {scheme} | " + " | ".join(
            f"{r['step_s']:.3f} ({r['speedup']:.3f}x)" for r in cells) +
            f" | {1e3 * p['pp']:.0f} / {1e3 * p['dp']:.0f} / {1e3 * p['emb']:.0f} | "
            "not found (below) |")
    return out


# --------------------------------------------------------------------------- (c)

def wan_channels(cluster: Cluster, lay: Layout) -> str:
    """Which channels cross a datacentre boundary with the layout's rank order."""
    place, out = placement(lay.tp, lay.dp, lay.pp, lay.rank_order), []
    dc = lambda r: cluster.datacentre_of(r // cluster.gpus_per_node)   # noqa: E731
    if any(dc(place(0, d, s)) != dc(place(0, d, s + 1))
           for s in range(lay.pp - 1) for d in range(lay.dp)):
        out.append("pp")
    if any(len({dc(place(0, d, s)) for d in range(lay.dp)}) > 1 for s in range(lay.pp)):
        out.append("dp")
    return "+".join(out) or "none"


def _best(shape, raw_cluster: Dict, mb: int, gbs: int, dtype, order: str = "tp-dp-pp") -> Dict:
    """The planner's fastest candidate within the budget, and the fastest uncompressed one,
    over its layouts placed in `order` (tp-pp-dp: a what-if the driver does not launch)."""
    cluster = cluster_from_dict(raw_cluster)
    lays = [replace(lay, rank_order=order) for lay in layouts(shape, cluster, gbs, mb, dtype)]
    cands = plan(shape, cluster, gbs, mb, QUALITY_BUDGET, dtype, layout_list=lays)
    best = cands[0]
    exact = min((c for c in cands if c.name == "uncompressed"), key=lambda c: c.time.total)

    def row(c):
        lay = c.layout
        return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "M": lay.num_microbatches,
                "scheme": c.name + (" (overlap)" if c.overlap else ""), "step_s": c.time.total,
                "compute_s": c.time.compute, "utilisation": c.time.utilisation,
                "gap_pct": c.gap_pct, "wan": wan_channels(cluster, lay),
                "rank_order": lay.rank_order, "flags": c.flags()}   # flags: tp-dp-pp only
    return {"best": row(best), "uncompressed": row(exact), "candidates": len(cands)}


PRECISIONS = (("bf16", torch.bfloat16), ("fp32", torch.float32))


def wan_rows(runs=None, datacentres=DATACENTRES, wan_gbps=WAN_GBPS) -> List[Dict]:
    rows = []
    for name, (shape, mb, gbs) in (runs or WAN_RUNS).items():
        for dcs in datacentres:
            for gbps in wan_gbps:
                row = {"model": name, "params_b": shape.num_params() / 1e9,
                       "datacentres": dcs, "wan_gbps": gbps,
                       "tokens_per_step": gbs * shape.seq_length}
                for key, order in (("driver", "tp-dp-pp"), ("replicas_per_dc", "tp-pp-dp")):
                    by = {p: _best(shape, h100_cluster(dcs, gbps, p), mb, gbs, dt, order)
                          for p, dt in PRECISIONS}
                    by["chosen"] = min(by, key=lambda p: by[p]["best"]["step_s"])
                    row[key] = by
                rows.append(row)
    return rows


def chosen(by: Dict) -> Dict:
    """The faster precision's best candidate, with the precision and its utilisation counted
    at bf16's rate (fp32's compute takes twice as long: comparable across precisions)."""
    b, p = by[by["chosen"]]["best"], by["chosen"]
    return dict(b, precision=p,
                util_bf16=b["utilisation"] * H100_TFLOPS[p] / H100_TFLOPS["bf16"])


def util(b: Dict) -> str:
    u = f"{100 * b['utilisation']:.1f}%"
    return u if b["precision"] == "bf16" else f"{u} ({100 * b['util_bf16']:.1f}%)"


def wan_table(rows: List[Dict]) -> List[str]:
    out = ["| model | DCs | WAN Gbit/s | planner's choice: precision, tp/pp/dp, scheme | step s "
           "| utilisation (at bf16's rate) | WAN carries | uncompressed (bf16): step s, "
           "utilisation | what-if, whole replicas per DC: precision, tp/pp/dp, scheme | step s "
           "| utilisation (at bf16's rate) |",
           "|---|---:|---:|---|---:|---:|---|---|---|---:|---:|"]
    for r in rows:
        a, w = chosen(r["driver"]), chosen(r["replicas_per_dc"])
        ex = r["driver"]["bf16"]["uncompressed"]
        cell = lambda b: f"{b['precision']}, {b['tp']}/{b['pp']}/{b['dp']}, {b['scheme']}"  # noqa
        out.append(f"| {r['model']} | {r['datacentres']} | {r['wan_gbps']:g} | {cell(a)} | "
                   f"{a['step_s']:.2f} | {util(a)} | {a['wan']} | "
                   f"{ex['step_s']:.2f}, {100 * ex['utilisation']:.1f}% | {cell(w)} | "
                   f"{w['step_s']:.2f} | {util(w)} |")
    return out


# --------------------------------------------------------------------------- report

def assumptions() -> List[str]:
    return [
        f"- (b) 16 nodes x 8 A100 (TP8 x PP4 x DP4 = 128 GPUs, megatron-core's rank order: "
        f"each node one tensor-parallel group), fp16, micro-batch "
        f"{OPTIMUS_BATCH['micro_batch_size']}, global batch {OPTIMUS_BATCH['global_batch_size']}"
        f" (M = 16), synchronous 1F1B (no --overlap-*), compute {A100_TFLOPS:.1f} TFLOP/s in "
        f"the 6 N T rule (312 x 0.40 achieved x 0.75 for activation recompute), NVLink "
        f"{A100_NVLINK_GBPS} Gbit/s, InfiniBand 5 us; CB rank 16 on the critical-path backward "
        f"sends (epilogue only), SC rank 128 on stages 0-2, 10% warm-up (steady state shown).",
        f"- (c) {NODES_PER_DC} nodes x 8 H100 per datacentre (80 GB), NVLink 2880 Gbit/s, "
        f"InfiniBand 400 Gbit/s per GPU, datacentres joined by one interconnect of the given "
        f"bandwidth shared by every flow crossing it, {WAN_LATENCY_US / 1000:g} ms one way; "
        f"compute {H100_TFLOPS['bf16']:.0f} TFLOP/s at bf16 (989 x 0.40), "
        f"{H100_TFLOPS['fp32']:.0f} in fp32 (TF32, 495 x 0.40); quality budget "
        f"{QUALITY_BUDGET:g}% (SparseLoCo, measured at +6.45%, is outside it); GPT-8.3B "
        f"micro-batch 4, 2048 x 1024 = 2M tokens per step; Llama-2-70B micro-batch 1, 1024 x 4096 = 4M tokens "
        f"per step; layouts: tp within a node, every pp dividing the layers, weights + "
        f"gradients + Adam in 80 GB (18 bytes per parameter). Each configuration is planned "
        f"at bf16 and in fp32 (where DiLoCo and CocktailSGD are allowed) and the faster kept. "
        f"The driver places ranks in megatron-core's order (tp, dp, pp outermost), so any "
        f"pp > 1 puts a pipeline boundary across the datacentres; the what-if columns place "
        f"whole replicas inside a datacentre (order tp-pp-dp, which the driver does not "
        f"launch), as INTELLECT-1 and Covenant-72B do.",
        "- Utilisation = compute / step time; the 1F1B bubble counts as idle; the 6 N T rule "
        "leaves attention's S^2 term out (~5% of the FLOPs at GPT-8.3B's seq 1024, ~8% at "
        "Llama-2-70B's 4096). GPU codec throughputs are measured on one H200 "
        "(megatron/cc/plan/codec_speeds_h200.json: bench/bench_gpu.py's rows of 2026-11-26, "
        "each codec the median of its Fig. 14 rows; codecs without rows take a related "
        "codec's number, as the file says), on the A100s of (b) too.",
    ]


def report(b_rows, c_rows) -> str:
    lines = ["# The cost model at paper and datacentre scale", "",
             "Generated by `bench/plan_at_scale.py` (pure computation, no training).", "",
             "## Assumptions", ""] + assumptions()
    if b_rows:
        lines += ["", "## (b) Optimus-CC's settings: predicted speed-up over the baseline", ""]
        lines += optimus_table(b_rows)
        lines += ["", "Paper's figures: " + PAPER_FIGURES + "; read: " +
                  "; ".join(PAPER_SOURCES) + "."]
    if c_rows:
        lines += ["", "## (c) Across datacentres: the planner's choice and utilisation", ""]
        lines += wan_table(c_rows)
        lines += ["", "Anchors (reported compute utilisation): " +
                  "; ".join(f"{k}: {v}" for k, v in ANCHORS.items()) + " (" +
                  "; ".join(ANCHOR_SOURCES) + ")."]
    return "\n".join(lines) + "\n"


def write_clusters(out_dir: str) -> List[str]:
    """The cluster YAMLs of both tables (the (c) ones at bf16), loadable by plan --cluster."""
    os.makedirs(out_dir, exist_ok=True)
    files = {f"a100_16x8_ib{g}.yaml": a100_cluster(g) for g in A100_IB_PER_GPU.values()}
    files.update({f"h100_{d}dc_{NODES_PER_DC}x8_wan{g:g}g.yaml": h100_cluster(d, g)
                  for d in DATACENTRES for g in WAN_GBPS})
    for name, raw in files.items():
        with open(os.path.join(out_dir, name), "w") as f:
            yaml.safe_dump(raw, f, sort_keys=False)
    return sorted(files)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["b", "c"], default=None,
                   help="Only the Optimus-CC table (b) or the datacentre table (c).")
    p.add_argument("--out", default=RESULTS, help="Folder of plan_at_scale.md and .json.")
    p.add_argument("--clusters", default=CLUSTERS, help="Folder for the cluster YAMLs used.")
    p.add_argument("--replot", action="store_true",
                   help="Rewrite plan_at_scale.md from the .json in --out, without planning.")
    ns = p.parse_args(argv)
    os.makedirs(ns.out, exist_ok=True)
    if ns.replot:
        with open(os.path.join(ns.out, "plan_at_scale.json")) as f:
            saved = json.load(f)
        b_rows, c_rows = saved["optimus_cc"], saved["datacentres"]
    else:
        write_clusters(ns.clusters)
        b_rows = optimus_rows() if ns.only in (None, "b") else []
        c_rows = wan_rows() if ns.only in (None, "c") else []
    text = report(b_rows, c_rows)
    with open(os.path.join(ns.out, "plan_at_scale.md"), "w") as f:
        f.write(text)
    with open(os.path.join(ns.out, "plan_at_scale.json"), "w") as f:
        json.dump({"optimus_cc": b_rows, "datacentres": c_rows}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
