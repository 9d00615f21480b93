"""Data-parallel modes side by side on the demo model: all-reduce, SC PowerSGD, CocktailSGD,
DiLoCo, SD-PIPE preduce and AD-PSGD.

One invocation runs every configuration one after the other with the same seed, data and
flags apart from the dp channel, and reports final validation loss, the gap to all-reduce,
dp bytes per iteration with the ratio against the uncompressed gradient all-reduce, and
time per iteration. The raw numbers go to dp_modes.json after EVERY run (a long benchmark
cut short still leaves what finished); --replot redraws table and plot from it.

Runs (dp=4, pp=1 unless the name says pp2):
  allreduce            exact gradient all-reduce (the reference)
  isolated             one replica alone (1 rank, global batch 8 = a dp=4 replica's share):
                       what a replica learns with no dp channel at all
  diloco-H1            exact fp32 parameter averaging after every local Adam step (DiLoCo
                       H=1, outer lr 1, momentum 0; 1x bytes): local Adam steps averaged with
                       no codec, no staleness and no drift between replicas
  powersgd             SC: --grad-comp rank 8, 10% warm-up
  cocktail             --dp-mode cocktail_sgd 0.1 / 0.2 / 4 bits, overlapped (one step stale)
  cocktail-w30         the same after 30 warm-up iterations of exact all-reduce (10%)
  cocktail-r0.5, cocktail-r1-k0.5, cocktail-r1-k1-8b   less compression (random / top-k /
                       bits 0.5/0.2/4, 1/0.5/4, 1/1/8): the bytes / quality curve
  cocktail-r0.125-k1-2b   0.125 / 1 / 2 bits: every sampled entry sent (no mask), 2 bits
  diloco-H10 / -H50    --dp-mode diloco, H inner steps, exact fp32 outer all-reduce
  diloco-H10-int8 / -H50-int8   the same with int8 pseudo-gradients (error feedback)
  diloco-H50-int8-avg  H=50, int8, outer lr 1 and momentum 0 (plain parameter averaging)
  *-dpadam             the same with --dp-adam-correction (local Adam steps divided by an
                       estimate of the all-reduced gradient's second moment, no bytes):
                       cocktail-dpadam, cocktail-k0.5-2b-dpadam (0.1 / 0.5 / 2 bits),
                       cocktail-r0.125-k1-2b-dpadam (0.125 / 1 / 2 bits: no mask sent),
                       diloco-H1-dpadam, diloco-H50-int8-dpadam, diloco-H50-int8-avg-dpadam,
                       diloco-H50-F5-int8-dpadam (Streaming DiLoCo: 5 fragments in turn)
  allreduce-hetero, preduce-hetero, adpsgd-hetero   --hetero 0.5 (replicas randomly up to
                       50% slower per iteration): time per iteration is the point there
  pp2-allreduce, pp2-cocktail, pp2-diloco-H50-int8   pp=2 x dp=2
  sparseloco-H15-d1.56-2b   --dp-mode sparseloco at its defaults (density 1/64 of every 4096
                       chunk, 12-bit indices, 2-bit values, error decay 0.95, outer SGD lr 1)
                       with the paper's H = 15: x1078 fewer dp bytes than all-reduce at dp=4
  sparseloco-H15-d0.78-2b / -d3.13-2b   density 1/128 (x2118) / 1/32 (x544)
  sparseloco-H15-d1.56-1b / -4b         1 / 4 bits per kept value (x1159 / x945)
  sparseloco-H30-d1.56-2b   H = 30 (Covenant-72B's; x2155)
  sparseloco-H30-d3.13-2b / -H50-d5.66-2b   fewer, denser syncs at the same budget
                       (k = 128 at H = 30: x1087; k = 232 at H = 50: x1004)
  sparseloco-*-dpadam  the same with --dp-adam-correction (the warm-start, batch-128 setting);
                       sparseloco-H15-F3-d1.56-2b-dpadam: streaming, 3 fragments in turn
  diloco-H50-dpadam    exact fp32 DiLoCo H=50 (x50), the reference of the rows below
  diloco-H100-fixpoint-3-dpadam / -H75-fixpoint-2 / -H150-fixpoint-4   fewer syncs through the
                       sharded fixpoint codec (x1024 / x1129 / x1164)
  diloco-H<h>-psgd<r>-dpadam   --diloco-compression powersgd-<r>: one warm-started PowerSGD
                       round of rank r per matrix with error feedback (DiLoCoX), vectors exact
                       in fp32; sent per sync = sum 4 r (n + m) + 4 x vector values, so at
                       dp=4 on the demo model: H50 r4 x1158, H50 r6 x804, H30 r4 x695,
                       H30 r2 x1241, H40 r3 x1188, H75 r6 x1206, H100 r8 x1232;
                       -avg: outer lr 1, no momentum; -m0.5: Nesterov momentum 0.5
  diloco-H75-fixpoint-2-noef-dpadam / -ef0.5, diloco-H50-fixpoint-1[-noef]-dpadam,
  diloco-H100-fixpoint-3-noef-dpadam   --diloco-error-decay 0 / 0.5 (1: plain error
                       feedback): x1129 / x1422 / x1024; diloco-H75-dpadam: exact, x75
  diloco-H50-fixpoint-<4|3|2>[-noef|-ef0.5]-dpadam, diloco-H30-fixpoint-1-noef-dpadam
                       the frontier at <= 2%: x388 / x512 / x753, x853
  diloco-Q<K>[-<codec>][-noef][-last<b>]-dpadam   --diloco-sync-steps lr2:K: K syncs at
                       windows of equal sum of lr^2 (short while the rate is high); -last<b>:
                       --diloco-final-compression fixpoint-<b>; Q6h / Q3h: the first runs'
                       hand-computed steps (33,54,77,103,140,300 / 54,103,300)
  diloco-Q<K>-<codec>[-noef|-rim][-a<lr>][-avg][-last<b>]-dpadam   -a<lr>: --diloco-outer-lr
                       (Nesterov 0.9 kept); -rim: --diloco-residual-in-model with
                       --diloco-error-decay 0 (-rimsef: 1, the owners' server errors fed
                       back); -avg: --diloco-final-average; -muon: --optimizer muon
                       inner steps in place of -dpadam's Adam (MuLoCo); allreduce-muon its
                       all-reduce reference

    python bench/bench_dp_modes.py [--iters 300] [--runs allreduce,cocktail] [--replot]
    python bench/bench_dp_modes.py --warm-start 300 --out bench/results/warm --runs ...

Writes bench/results/dp_modes.md, dp_modes.json, dp_modes_loss.png and dp_modes_frontier.png
(every run's dp byte ratio against its validation-loss gap: the bytes-vs-loss frontier).

--warm-start N: the papers' setting (CocktailSGD fine-tunes pretrained models; DiLoCo starts
from a pretrained checkpoint). First N iterations of exact all-reduce pretraining are saved
(once: <out>/warm_start, reused by later invocations with the same N), then every run starts
from those weights with --finetune (fresh optimizer, iteration 0, same schedule and data).

Where the quality targets (<= 2% at >= 100x / 150x) are met (docs/data_parallel.md): the warm
start with a 4x larger batch, so each replica's local steps see 32 samples, not 8 (about 10
minutes a run on 2 CPU cores):
    python bench/bench_dp_modes.py --warm-start 300 --global-batch-size 128 \
        --micro-batch-size 8 --out bench/results/dp_modes_warm_b128 \
        --runs allreduce,diloco-H50-int8-dpadam,cocktail-dpadam,cocktail-r0.125-k1-2b-dpadam
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from runlog import (RunResult, load_meta, load_runs, plot_losses,  # noqa: E402
                    run_pretrain, save_runs)

from megatron.training.checkpointing.save_load import atomic_write_text  # noqa: E402

DEMO = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
        "--seq-length", "128", "--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-fraction", "0.0667",
        "--lr-decay-style", "cosine", "--log-interval", "10", "--eval-iters", "8"]
PP2 = ["--pipeline-model-parallel-size", "2"]


def cocktail(random_ratio: float, topk_ratio: float, bits: int):
    return ["--dp-mode", "cocktail_sgd", "--cocktail-random-ratio", str(random_ratio),
            "--cocktail-topk-ratio", str(topk_ratio), "--cocktail-bits", str(bits)]


COCKTAIL = cocktail(0.1, 0.2, 4)
HETERO = ["--hetero", "0.5"]
DPADAM = ["--dp-adam-correction"]
MUON = ["--optimizer", "muon"]
NPROC = {"isolated": 1}   # every other run: 4 ranks


def sparseloco(h: int, density: float, bits: int, fragments: int = 1):
    return ["--dp-mode", "sparseloco", "--diloco-inner-steps", str(h), "--diloco-fragments",
            str(fragments), "--sparseloco-density", str(density), "--sparseloco-bits", str(bits)]


NESTEROV = ["--sparseloco-outer-lr", "0.7", "--sparseloco-outer-momentum", "0.9"]


def diloco(h: int, comp: str = "none"):
    return ["--dp-mode", "diloco", "--diloco-inner-steps", str(h), "--diloco-compression", comp]


def diloco_cocktail(h: int, random_ratio: float, bits: int = 2):
    return diloco(h, "cocktail") + cocktail(random_ratio, 1.0, bits)[2:]


AVG = ["--diloco-outer-lr", "1", "--diloco-outer-momentum", "0"]


def outer_lr(lr: float):
    """DiLoCo's outer learning rate (Nesterov momentum stays at its default, 0.9)."""
    return ["--diloco-outer-lr", str(lr)]

NOEF = ["--diloco-error-decay", "0"]
EF_HALF = ["--diloco-error-decay", "0.5"]
RIM = NOEF + ["--diloco-residual-in-model"]
FINAL_AVG = ["--diloco-final-average"]


# K syncs at windows of equal sum of lr^2 under the run's own schedule (the quadratic
# synchronisation rule); at 300 iterations: lr2:3 55,104,300; lr2:4 44,77,120,300;
# lr2:6 34,55,77,104,140,300; lr2:8 29,44,60,77,97,120,153,300
SYNC_Q3, SYNC_Q4 = ["--diloco-sync-steps", "lr2:3"], ["--diloco-sync-steps", "lr2:4"]
SYNC_Q6, SYNC_Q8 = ["--diloco-sync-steps", "lr2:6"], ["--diloco-sync-steps", "lr2:8"]
# the first lr2:6 and lr2:3 runs (seed 1234): steps by hand from the cosine formula, one off
SYNC_Q6_HAND = ["--diloco-sync-steps", "33,54,77,103,140,300"]
SYNC_Q3_HAND = ["--diloco-sync-steps", "54,103,300"]
SYNC_Q5 = ["--diloco-sync-steps", "lr2:5"]
LAST3, LAST4, LAST5 = (["--diloco-final-compression", f"fixpoint-{b}"] for b in (3, 4, 5))


def diloco_psgd(h: int, rank: int):
    return diloco(h, f"powersgd-{rank}") + DPADAM


RUNS = {
    "allreduce": [],
    "isolated": [],   # one replica's share of the batch, the same validation samples: batch()
    "diloco-H1": ["--dp-mode", "diloco", "--diloco-inner-steps", "1", "--diloco-outer-lr", "1",
                  "--diloco-outer-momentum", "0"],
    "cocktail": COCKTAIL,
    "cocktail-w30": COCKTAIL + ["--cocktail-warmup-steps", "30"],
    # less compression: where on the bytes / quality curve does CocktailSGD reach all-reduce?
    "cocktail-r0.5": cocktail(0.5, 0.2, 4),
    "cocktail-r1-k0.5": cocktail(1.0, 0.5, 4),
    "cocktail-r1-k1-8b": cocktail(1.0, 1.0, 8),
    "diloco-H50-int8": diloco(50, "int8"),
    "cocktail-dpadam": COCKTAIL + DPADAM,
    "cocktail-k0.5-2b-dpadam": cocktail(0.1, 0.5, 2) + DPADAM,
    # top-k 1: no mask is sent, so 2-bit values of 1/8 of the entries fit in 120x
    "cocktail-r0.125-k1-2b": cocktail(0.125, 1.0, 2),
    "cocktail-r0.125-k1-2b-dpadam": cocktail(0.125, 1.0, 2) + DPADAM,
    "diloco-H1-dpadam": ["--dp-mode", "diloco", "--diloco-inner-steps", "1", "--diloco-outer-lr",
                         "1", "--diloco-outer-momentum", "0"] + DPADAM,
    "diloco-H50-int8-dpadam": diloco(50, "int8") + DPADAM,
    "diloco-H50-F5-int8-dpadam": diloco(50, "int8") + ["--diloco-fragments", "5"] + DPADAM,
    "diloco-H50-int8-avg-dpadam": diloco(50, "int8") + ["--diloco-outer-lr", "1",
                                                        "--diloco-outer-momentum", "0"] + DPADAM,
    "diloco-H50-int8-avg": diloco(50, "int8") + ["--diloco-outer-lr", "1",
                                                 "--diloco-outer-momentum", "0"],
    "diloco-H10-int8": diloco(10, "int8"),
    "powersgd": ["--grad-comp", "--grad-comp-rank", "8", "--grad-comp-warm-up", "0.1"],
    "diloco-H50": diloco(50),
    "diloco-H10": diloco(10),
    "allreduce-hetero": HETERO,
    "preduce-hetero": ["--dp-mode", "preduce"] + HETERO,
    "adpsgd-hetero": ["--dp-mode", "adpsgd"] + HETERO,
    "pp2-allreduce": PP2,
    "pp2-cocktail": PP2 + COCKTAIL,
    "pp2-diloco-H50-int8": PP2 + diloco(50, "int8"),
    # SparseLoCo: densities and bit widths around the paper's 1/64 of 4096 at 2 bits, H = 15
    "sparseloco-H15-d1.56-2b": sparseloco(15, 1 / 64, 2),
    "sparseloco-H15-d0.78-2b": sparseloco(15, 1 / 128, 2),
    "sparseloco-H15-d3.13-2b": sparseloco(15, 1 / 32, 2),
    "sparseloco-H15-d1.56-1b": sparseloco(15, 1 / 64, 1),
    "sparseloco-H15-d1.56-4b": sparseloco(15, 1 / 64, 4),
    "sparseloco-H30-d1.56-2b": sparseloco(30, 1 / 64, 2),
    "sparseloco-H15-d1.56-2b-dpadam": sparseloco(15, 1 / 64, 2) + DPADAM,
    "sparseloco-H15-d0.78-2b-dpadam": sparseloco(15, 1 / 128, 2) + DPADAM,
    "sparseloco-H15-d3.13-2b-dpadam": sparseloco(15, 1 / 32, 2) + DPADAM,
    "sparseloco-H15-d1.56-4b-dpadam": sparseloco(15, 1 / 64, 4) + DPADAM,
    "sparseloco-H30-d1.56-2b-dpadam": sparseloco(30, 1 / 64, 2) + DPADAM,
    "sparseloco-H15-F3-d1.56-2b-dpadam": sparseloco(15, 1 / 64, 2, fragments=3) + DPADAM,
    # fewer, denser syncs at the same >= 1000x: k = 128 of 4096 at H = 30, 232 at H = 50
    "sparseloco-H30-d3.13-2b-dpadam": sparseloco(30, 1 / 32, 2) + DPADAM,
    "sparseloco-H50-d5.66-2b-dpadam": sparseloco(50, 232 / 4096, 2) + DPADAM,
    # the outer step over the sparse mean: DiLoCo's Nesterov (lr 0.7, momentum 0.9), a larger
    # plain step, no decay of the error buffer
    "sparseloco-H15-d1.56-2b-nesterov-dpadam": sparseloco(15, 1 / 64, 2) + NESTEROV + DPADAM,
    "sparseloco-H15-d1.56-2b-lr2-dpadam": sparseloco(15, 1 / 64, 2)
    + ["--sparseloco-outer-lr", "2"] + DPADAM,
    "sparseloco-H15-d1.56-2b-beta1-dpadam": sparseloco(15, 1 / 64, 2)
    + ["--sparseloco-error-decay", "1"] + DPADAM,
    # DiLoCo's outer Nesterov over CocktailSGD's sharded exchange of a random 1/s subset at 2
    # bits (no indices; the owners' re-compression keeps its own error): >= 1000x
    "diloco-H15-cocktail-r0.2-2b-dpadam": diloco_cocktail(15, 0.2) + DPADAM,     # x1129
    "diloco-H20-cocktail-r0.25-2b-dpadam": diloco_cocktail(20, 0.25) + DPADAM,   # x1204
    "diloco-H40-cocktail-r0.5-2b-dpadam": diloco_cocktail(40, 0.5) + DPADAM,     # x1205
    "diloco-H50-cocktail-r0.5-2b-dpadam": diloco_cocktail(50, 0.5) + DPADAM,     # x1506
    # the other way to >= 1000x in a 300-iteration run: fewer syncs at (near-)lossless int8 /
    # fixpoint-4 (H = 300: the replicas' int8 average once, at the end; x1182 / x1164)
    "diloco-H300-int8-avg-dpadam": diloco(300, "int8") + ["--diloco-outer-lr", "1",
                                                          "--diloco-outer-momentum", "0"] + DPADAM,
    "diloco-H150-fixpoint-4-dpadam": diloco(150, "fixpoint-4") + DPADAM,
    "diloco-H100-fixpoint-3-dpadam": diloco(100, "fixpoint-3") + DPADAM,     # x1024
    "diloco-H75-fixpoint-2-dpadam": diloco(75, "fixpoint-2") + DPADAM,       # x1129
    # the same single average, extrapolated half a step further along the mean pseudo-gradient
    "diloco-H300-int8-x1.5-dpadam": diloco(300, "int8") + ["--diloco-outer-lr", "1.5",
                                                           "--diloco-outer-momentum", "0"]
    + DPADAM,
    "diloco-H50-dpadam": diloco(50) + DPADAM,   # exact fp32 outer all-reduce: x50
    # low-rank outer exchange: rank-r PowerSGD per matrix, error feedback (formula ratios)
    "diloco-H50-psgd4-dpadam": diloco_psgd(50, 4),     # x1158
    "diloco-H50-psgd6-dpadam": diloco_psgd(50, 6),     # x804
    "diloco-H30-psgd4-dpadam": diloco_psgd(30, 4),     # x695
    "diloco-H30-psgd2-dpadam": diloco_psgd(30, 2),     # x1241
    "diloco-H40-psgd3-dpadam": diloco_psgd(40, 3),     # x1188
    "diloco-H75-psgd6-dpadam": diloco_psgd(75, 6),     # x1206
    "diloco-H100-psgd8-dpadam": diloco_psgd(100, 8),   # x1232
    # the same with a plain averaging outer step (lr 1, no momentum): Nesterov momentum over
    # error-fed low-rank updates overshoots (a 30-iteration smoke run from scratch)
    "diloco-H50-psgd4-avg-dpadam": diloco_psgd(50, 4) + AVG,       # x1158
    "diloco-H30-psgd2-avg-dpadam": diloco_psgd(30, 2) + AVG,       # x1241
    "diloco-H100-psgd8-avg-dpadam": diloco_psgd(100, 8) + AVG,     # x1232
    "diloco-H50-psgd4-m0.5-dpadam": diloco_psgd(50, 4) + ["--diloco-outer-momentum", "0.5"],
    # error feedback across few syncs: the replicas' inner steps already repair much of a
    # sync's quantisation error before the residual is sent again (-noef: beta 0, every sync
    # stands alone; -ef0.5: half of it); exact references at the same H
    "diloco-H75-dpadam": diloco(75) + DPADAM,                                          # x75
    "diloco-H75-fixpoint-2-noef-dpadam": diloco(75, "fixpoint-2") + NOEF + DPADAM,      # x1129
    "diloco-H75-fixpoint-2-ef0.5-dpadam": diloco(75, "fixpoint-2") + EF_HALF + DPADAM,  # x1129
    "diloco-H50-fixpoint-1-dpadam": diloco(50, "fixpoint-1") + DPADAM,                 # x1422
    "diloco-H50-fixpoint-1-noef-dpadam": diloco(50, "fixpoint-1") + NOEF + DPADAM,      # x1422
    "diloco-H100-fixpoint-3-noef-dpadam": diloco(100, "fixpoint-3") + NOEF + DPADAM,    # x1024
    # the frontier at <= 2%: the drift of H = 50 is +1.92%; how few bits keep it there
    "diloco-H50-fixpoint-4-dpadam": diloco(50, "fixpoint-4") + DPADAM,                 # x388
    "diloco-H50-fixpoint-4-noef-dpadam": diloco(50, "fixpoint-4") + NOEF + DPADAM,      # x388
    "diloco-H50-fixpoint-3-dpadam": diloco(50, "fixpoint-3") + DPADAM,                 # x512
    "diloco-H50-fixpoint-3-noef-dpadam": diloco(50, "fixpoint-3") + NOEF + DPADAM,      # x512
    "diloco-H50-fixpoint-3-ef0.5-dpadam": diloco(50, "fixpoint-3") + EF_HALF + DPADAM,  # x512
    "diloco-H50-fixpoint-2-dpadam": diloco(50, "fixpoint-2") + DPADAM,                 # x753
    "diloco-H50-fixpoint-2-noef-dpadam": diloco(50, "fixpoint-2") + NOEF + DPADAM,      # x753
    "diloco-H50-fixpoint-2-ef0.5-dpadam": diloco(50, "fixpoint-2") + EF_HALF + DPADAM,  # x753
    "diloco-H30-fixpoint-1-noef-dpadam": diloco(30, "fixpoint-1") + NOEF + DPADAM,      # x853
    # syncs where the learning rate is high (the quadratic synchronisation rule, Gu et al.
    # 2024): K windows of equal sum of lr^2 under the runs' schedule (SYNC_Q*)
    "diloco-Q6-dpadam": diloco(50) + SYNC_Q6 + DPADAM,                                  # x50
    "diloco-Q6h-dpadam": diloco(50) + SYNC_Q6_HAND + DPADAM,                            # x50
    "diloco-Q6-int8-dpadam": diloco(50, "int8") + SYNC_Q6 + DPADAM,                     # x197
    "diloco-Q4-fixpoint-4-noef-dpadam": diloco(75, "fixpoint-4") + SYNC_Q4 + NOEF + DPADAM,
    "diloco-Q4-dpadam": diloco(75) + SYNC_Q4 + DPADAM,                                  # x75
    "diloco-Q4-fixpoint-2-dpadam": diloco(75, "fixpoint-2") + SYNC_Q4 + DPADAM,         # x1129
    "diloco-Q4-fixpoint-2-noef-dpadam": diloco(75, "fixpoint-2") + SYNC_Q4 + NOEF + DPADAM,
    "diloco-Q3-fixpoint-3-dpadam": diloco(100, "fixpoint-3") + SYNC_Q3 + DPADAM,        # x1024
    "diloco-Q3h-fixpoint-3-dpadam": diloco(100, "fixpoint-3") + SYNC_Q3_HAND + DPADAM,  # x1024
    "diloco-Q8-fixpoint-1-noef-dpadam": diloco(38, "fixpoint-1") + SYNC_Q8 + NOEF + DPADAM,
    "diloco-Q6-fixpoint-1-noef-dpadam": diloco(50, "fixpoint-1") + SYNC_Q6 + NOEF + DPADAM,
    "diloco-Q6-fixpoint-3-noef-dpadam": diloco(50, "fixpoint-3") + SYNC_Q6 + NOEF + DPADAM,
    # the outer step scaled up by the codec's loss along the replicas' mean (one H = 50
    # capture, both phases: fixpoint-1 keeps 0.61 of it, fixpoint-2 0.86): 0.7 / 0.61, 0.7 / 0.86
    "diloco-Q6-fixpoint-1-noef-a1.15-dpadam": diloco(50, "fixpoint-1") + SYNC_Q6 + NOEF
    + outer_lr(1.15) + DPADAM,                                                          # x1422
    "diloco-Q6-fixpoint-1-noef-a1.4-dpadam": diloco(50, "fixpoint-1") + SYNC_Q6 + NOEF
    + outer_lr(1.4) + DPADAM,                                                           # x1422
    "diloco-Q6-fixpoint-1-noef-a2-dpadam": diloco(50, "fixpoint-1") + SYNC_Q6 + NOEF
    + outer_lr(2.0) + DPADAM,                                                           # x1422
    "diloco-Q6-a1-dpadam": diloco(50) + SYNC_Q6 + outer_lr(1.0) + DPADAM,               # x50
    "diloco-Q8-fixpoint-1-noef-a1.15-dpadam": diloco(38, "fixpoint-1") + SYNC_Q8 + NOEF
    + outer_lr(1.15) + DPADAM,                                                          # x1067
    "diloco-Q6-fixpoint-2-noef-a0.81-dpadam": diloco(50, "fixpoint-2") + SYNC_Q6 + NOEF
    + outer_lr(0.81) + DPADAM,                                                          # x753
    "diloco-Q6-fixpoint-2-noef-dpadam": diloco(50, "fixpoint-2") + SYNC_Q6 + NOEF + DPADAM,
    # each replica keeps its own codec residual in its weights (--diloco-residual-in-model)
    "diloco-Q6-fixpoint-1-rim-dpadam": diloco(50, "fixpoint-1") + SYNC_Q6 + RIM + DPADAM,  # x1422
    "diloco-Q6-fixpoint-2-rim-dpadam": diloco(50, "fixpoint-2") + SYNC_Q6 + RIM + DPADAM,  # x753
    # ... with the outer step scaled by the owners' loss along the mean (phase 2: 0.83) and
    # the last sync at 3 bits (5 x 1.125 + 3.125 bits per value in 300 iterations)
    "diloco-Q6-fixpoint-1-rim-a0.84-last3-dpadam": diloco(50, "fixpoint-1") + SYNC_Q6 + RIM
    + outer_lr(0.84) + LAST3 + DPADAM,                                                  # x1097
    "diloco-Q6-fixpoint-1-rim-a1.2-last3-dpadam": diloco(50, "fixpoint-1") + SYNC_Q6 + RIM
    + outer_lr(1.2) + LAST3 + DPADAM,                                                   # x1097
    # ... and the last sync the replicas' plain mean (--diloco-final-average), not a Nesterov
    # step of lr 1.2 over a 160-step window
    "diloco-Q6-fixpoint-1-rim-a1.2-avg-last3-dpadam": diloco(50, "fixpoint-1") + SYNC_Q6
    + RIM + outer_lr(1.2) + FINAL_AVG + LAST3 + DPADAM,                                # x1097
    "diloco-Q4-fixpoint-2-rim-a1-avg-last3-dpadam": diloco(75, "fixpoint-2") + SYNC_Q4
    + RIM + outer_lr(1.0) + FINAL_AVG + LAST3 + DPADAM,                                # x1010
    # ... and the owners' server errors fed back (beta 1, which -rimsef leaves to them)
    "diloco-Q6-fixpoint-1-rimsef-a1-last3-dpadam": diloco(50, "fixpoint-1") + SYNC_Q6
    + ["--diloco-residual-in-model"] + outer_lr(1.0) + LAST3 + DPADAM,                 # x1097
    "diloco-Q4-fixpoint-2-rim-a1.2-avg-last3-dpadam": diloco(75, "fixpoint-2") + SYNC_Q4
    + RIM + outer_lr(1.2) + FINAL_AVG + LAST3 + DPADAM,                                # x1010
    # MuLoCo: the same outer recipe over Muon inner steps (Adam's replica correction has no
    # Muon counterpart); allreduce-muon is Muon's own all-reduce reference
    "diloco-Q4-fixpoint-2-rim-a1.2-avg-last3-muon": diloco(75, "fixpoint-2") + SYNC_Q4
    + RIM + outer_lr(1.2) + FINAL_AVG + LAST3 + MUON,                                  # x1010
    "allreduce-muon": MUON,
    "diloco-Q4-fixpoint-2-rim-a1-last3-dpadam": diloco(75, "fixpoint-2") + SYNC_Q4
    + RIM + outer_lr(1.0) + LAST3 + DPADAM,                                            # x1010
    "diloco-Q6-fixpoint-1-noef-a1.15-last3-dpadam": diloco(50, "fixpoint-1") + SYNC_Q6 + NOEF
    + outer_lr(1.15) + LAST3 + DPADAM,                                                  # x1097
    "diloco-Q8-fixpoint-1-rim-dpadam": diloco(38, "fixpoint-1") + SYNC_Q8 + RIM + DPADAM,  # x1067
    # ... and the run's last sync, which nothing repays, at more bits (--diloco-final-compression)
    "diloco-Q4-fixpoint-2-last3-dpadam": diloco(75, "fixpoint-2") + SYNC_Q4 + LAST3   # x1010
    + DPADAM,
    "diloco-Q5-fixpoint-1-noef-last4-dpadam": diloco(60, "fixpoint-1") + SYNC_Q5 + NOEF + LAST4
    + DPADAM,                                                                           # x1113
    "diloco-Q3-fixpoint-2-last4-dpadam": diloco(100, "fixpoint-2") + SYNC_Q3 + LAST4  # x1146
    + DPADAM,
    "diloco-Q3-fixpoint-2-last5-dpadam": diloco(100, "fixpoint-2") + SYNC_Q3 + LAST5  # x1024
    + DPADAM,
    "diloco-Q3-fixpoint-2-noef-last4-dpadam": diloco(100, "fixpoint-2") + SYNC_Q3 + NOEF + LAST4
    + DPADAM,                                                                           # x1146
}


def batch_flags(name: str, global_batch: int, micro_batch: int):
    """The batch flags of a run: `isolated` is one rank with a dp=4 replica's share of the
    global batch, validated on the same samples as the others (4x the eval iterations)."""
    if name == "isolated":
        share = global_batch // 4
        return ["--global-batch-size", str(share), "--micro-batch-size",
                str(min(micro_batch, share)), "--eval-iters", "32"]
    return ["--global-batch-size", str(global_batch), "--micro-batch-size", str(micro_batch)]


def reference(run, runs):
    """The all-reduce run a run is compared with (same pp; the hetero one for hetero runs)."""
    want = ("pp2-allreduce" if run.name.startswith("pp2-") else
            "allreduce-hetero" if run.name.endswith("-hetero") else "allreduce")
    return next((r for r in runs if r.name == want), None)


def gap_text(loss, ref) -> str:
    """Relative gap of `loss` to the reference run's final validation loss, or "-"."""
    if loss is None or ref is None or not ref.final_valid:
        return "-"
    return f"{(loss - ref.final_valid) / ref.final_valid * 100:+.2f}%"


def table(runs, iters: int, global_batch: int = 32, micro_batch: int = 4,
          warm_start: int = 0, seed: int = 1234) -> str:
    start = (f"from the weights of {warm_start} iterations of all-reduce pretraining "
             f"(--finetune: fresh optimizer and schedule), " if warm_start else "from scratch, ")
    rows = [f"demo GPT (4 layers, hidden 128, seq 128), dp=4 (pp2-*: pp=2 x dp=2), micro-batch "
            f"{micro_batch}, global batch {global_batch} (isolated: one rank, batch "
            f"{global_batch // 4}), {start}{iters} iterations, Adam lr 1e-3 "
            f"cosine, same seed ({seed}) and data. "
            f"dp bytes per iteration averaged over the run's log intervals (DiLoCo: outer syncs "
            f"spread over their H steps); ratio against the gradient all-reduce of the same "
            f"iterations. Replicas' mean: validation of the mean of the replicas' weights "
            f"(parameter-syncing modes, whose replicas differ between syncs). Gap and speed-up "
            f"against the all-reduce run of the same layout "
            f"(hetero runs: against allreduce-hetero).", "",
            "| run | final val loss | gap | val loss, replicas' mean | gap | dp bytes/iter | "
            "dp ratio | ms/iter | vs all-reduce |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        ref = reference(r, runs)
        gap, mean_gap = gap_text(r.final_valid, ref), gap_text(r.final_valid_mean, ref)
        mean = "-" if r.final_valid_mean is None else f"{r.final_valid_mean:.4f}"
        timed = r.steady_ms == r.steady_ms   # nan: no timing kept (taken beside other jobs)
        speed = f"x{ref.steady_ms / r.steady_ms:.2f}" if ref and timed else "-"
        dp_b = r.bytes_per_iter.get("dp")
        ratio = r.ratio.get("dp")
        rows.append(f"| {r.name} | {r.final_valid:.4f} | {gap} | {mean} | {mean_gap} | "
                    f"{'-' if dp_b is None else f'{dp_b / 1e3:.1f} KB'} | "
                    f"{'-' if ratio is None else f'x{ratio:.1f}'} | "
                    f"{f'{r.steady_ms:.0f}' if timed else '-'} | {speed} |")
    return "\n".join(rows)


def average_dp(r: RunResult) -> None:
    """DiLoCo's bytes arrive every H steps: average bytes and ratio over the whole run."""
    sent = [b for b in r.dp_history if b is not None]
    if sent:
        r.bytes_per_iter["dp"] = sum(s for s, _ in sent) / len(r.dp_history)
        raw = sum(s * q for s, q in sent) / len(r.dp_history)
        r.ratio["dp"] = raw / r.bytes_per_iter["dp"] if r.bytes_per_iter["dp"] else float("inf")


def warm_checkpoint(out: str, iters: int, global_batch: int, micro_batch: int,
                    seed: int, port: int = 29710, extra=()) -> str:
    """The directory of `iters` iterations of all-reduce pretraining (made once, then reused)."""
    path = os.path.join(out, "warm_start")
    tracker = os.path.join(path, "latest_checkpointed_iteration.txt")
    if os.path.exists(tracker):
        with open(tracker) as f:
            if f.read().strip() == str(iters):
                print(f"warm start: reusing {path} ({iters} iterations)", flush=True)
                return path
        raise SystemExit(f"{path} holds another warm start than --warm-start {iters}; "
                         f"remove it or pick another --out")
    flags = (DEMO + ["--seed", str(seed)] + batch_flags("allreduce", global_batch, micro_batch)
             + ["--train-iters", str(iters), "--eval-interval", str(iters), "--save", path,
                "--save-interval", str(iters)] + list(extra))
    r = run_pretrain("warm-start", 4, flags, port=port)
    print(f"warm start: {iters} iterations of all-reduce, validation loss {r.final_valid:.4f}, "
          f"saved to {path}", flush=True)
    return path


def plot_frontier(runs, path: str, title: str) -> None:
    """Each run with a dp byte ratio as a point (ratio, gap to its all-reduce run); log x."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    points = []
    for r in runs:
        ref, ratio = reference(r, runs), r.ratio.get("dp")
        if ref is None or ref is r or not ratio or not ref.final_valid:
            continue
        points.append((ratio, (r.final_valid - ref.final_valid) / ref.final_valid * 100, r.name))
    if not points:
        return
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for ratio, gap, name in points:
        ax.scatter(ratio, gap, s=18)
        ax.annotate(name, (ratio, gap), fontsize=6, xytext=(3, 2), textcoords="offset points")
    ax.axhline(2.0, color="grey", lw=0.8, ls="--")      # the issues' quality bar
    ax.axvline(1000.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("dp bytes: all-reduce / mode (x fewer)")
    ax.set_ylabel("final validation loss gap to all-reduce (%)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def dp_bytes_per_log(log: str):
    """Per log line (sent bytes, ratio) of the dp channel, or None where none was sent."""
    from runlog import _BYTES, _ITER, _UNIT
    out = []
    for line in log.splitlines():
        if _ITER.search(line):
            hit = [(float(n) * _UNIT[u], float(q)) for c, n, u, q in _BYTES.findall(line)
                   if c == "dp"]
            out.append(hit[0] if hit else None)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=300, help="training iterations per run")
    p.add_argument("--runs", default=",".join(RUNS),
                   help=f"comma-separated subset of {', '.join(RUNS)}")
    p.add_argument("--out", default=os.path.join(HERE, "results"),
                   help="directory of dp_modes.md, .json and dp_modes_loss.png")
    p.add_argument("--global-batch-size", type=int, default=32,
                   help="global batch of every dp=4 run (a multiple of 4 x --micro-batch-size)")
    p.add_argument("--micro-batch-size", type=int, default=4, help="micro-batch of every run")
    p.add_argument("--warm-start", type=int, default=0, metavar="N",
                   help="start every run from the weights of N iterations of all-reduce "
                        "pretraining (saved once under --out/warm_start; 0: from scratch)")
    p.add_argument("--seed", type=int, default=1234,
                   help="--seed of every run (data order, initialisation; a reused "
                        "--warm-start keeps the seed it was made with)")
    p.add_argument("--port", type=int, default=29710,
                   help="torchrun master port of the runs (another invocation at the same "
                        "time needs another)")
    p.add_argument("--extra", default="",
                   help="flags appended to every run and to the warm start (later flags win), "
                        "given with '=': --extra=\"--distributed-backend gloo\" (4 ranks "
                        "sharing one GPU)")
    p.add_argument("--replot", action="store_true",
                   help="redraw the table and plot from dp_modes.json in --out and exit")
    p.add_argument("--merge", nargs="*", default=[],
                   help="with --replot: also take the runs of these dp_modes.json files (e.g. "
                        "from a second invocation with another --out); later files win")
    a = p.parse_args()
    if a.global_batch_size % (4 * a.micro_batch_size):
        p.error(f"--global-batch-size {a.global_batch_size} is not a multiple of 4 replicas x "
                f"--micro-batch-size {a.micro_batch_size}")
    raw = os.path.join(a.out, "dp_modes.json")
    if a.warm_start < 0:
        p.error(f"--warm-start {a.warm_start}: give a number of iterations >= 1 (0: from scratch)")
    meta = {"global_batch_size": a.global_batch_size, "micro_batch_size": a.micro_batch_size,
            "warm_start": a.warm_start, "seed": a.seed}
    if a.replot:
        iters, runs = load_runs(raw)
        meta = {**meta, **load_meta(raw)}
        for path in a.merge:
            more_iters, more = load_runs(path)
            if more_iters != iters:
                p.error(f"--merge {path}: {more_iters} iterations, {raw} has {iters}")
            names = {r.name for r in more}
            runs = [r for r in runs if r.name not in names] + more
        order = list(RUNS)
        runs.sort(key=lambda r: order.index(r.name) if r.name in order else len(order))
        if a.merge:
            save_runs(raw, iters, runs, meta)
    else:
        names = [n for n in a.runs.split(",") if n]
        unknown = [n for n in names if n not in RUNS]
        if unknown:
            p.error(f"--runs: unknown {', '.join(unknown)}; choose from {', '.join(RUNS)}")
        iters, runs = a.iters, []
        common = DEMO + ["--seed", str(a.seed), "--train-iters", str(iters),
                         "--eval-interval", str(max(iters // 6, 1))]
        os.makedirs(a.out, exist_ok=True)
        if a.warm_start:
            common += ["--load", warm_checkpoint(a.out, a.warm_start, a.global_batch_size,
                                                 a.micro_batch_size, a.seed, a.port,
                                                 a.extra.split()),
                       "--finetune"]
        for name in names:
            try:
                flags = common + batch_flags(name, a.global_batch_size, a.micro_batch_size)
                r = run_pretrain(name, NPROC.get(name, 4), flags + RUNS[name] + a.extra.split(),
                                 port=a.port)
            except RuntimeError as e:   # keep going: one broken mode must not lose the rest
                print(f"{name}: FAILED\n{str(e)[-2000:]}", flush=True)
                continue
            r.dp_history = dp_bytes_per_log(r.log)
            average_dp(r)
            runs.append(r)
            print(f"{name}: final validation loss {r.final_valid:.4f}, "
                  f"{r.steady_ms:.0f} ms/iter, dp {r.bytes_per_iter.get('dp', 0):.0f} B/iter",
                  flush=True)
            save_runs(raw, iters, runs, meta)
    text = table(runs, iters, meta["global_batch_size"], meta["micro_batch_size"],
                 meta.get("warm_start", 0), meta.get("seed", 1234))
    print("\n" + text)
    atomic_write_text(os.path.join(a.out, "dp_modes.md"), text + "\n")
    plot = os.path.join(a.out, "dp_modes_loss.png")
    warm = meta.get("warm_start", 0)
    plot_losses(runs, plot, "demo GPT, dp=4 (pp2-*: pp=2 x dp=2): validation loss per dp mode"
                + (f", from {warm} all-reduce iterations" if warm else ""), valid_only=True)
    frontier = os.path.join(a.out, "dp_modes_frontier.png")
    plot_frontier(runs, frontier, "demo GPT, dp=4: dp bytes vs validation loss per dp mode"
                  + (f", from {warm} all-reduce iterations" if warm else ""))
    print(f"table: {os.path.join(a.out, 'dp_modes.md')}\nloss curves: {plot}\n"
          f"frontier: {frontier}")


if __name__ == "__main__":
    main()
