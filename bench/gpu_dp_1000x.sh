#!/bin/bash
# DiLoCo at about 1000x fewer dp bytes on one GPU machine (docs/data_parallel.md): one warm
# start, then four bench/bench_dp_modes.py invocations side by side (one GPU, 4 gloo ranks
# each), all within BUDGET_S seconds. Logs, times.txt and res.tgz (the results) go to OUTDIR;
# the runs work in /tmp/w27.
# Usage, from the repository root: [ROUND=1|2|3] bench/gpu_dp_1000x.sh OUTDIR WARM ITERS BUDGET_S
#   ROUND 1: low-rank and fixpoint DiLoCo at ~1000x, the exact H50 reference
#            (bench/results/dp_modes_warm_b128_1000x_h100/)
#   ROUND 2: error feedback across few syncs (--diloco-error-decay 0 / 0.5 / 1)
#            (bench/results/dp_modes_warm_b128_errdecay_h200/)
#   ROUND 3: the frontier at <= 2%, fixpoint-4 / -3 / -2 at H = 50
#            (bench/results/dp_modes_warm_b128_frontier_h200/)
OUTD=$1; WARM=$2; ITERS=$3; BUDGET=$4
W=/tmp/w27; rm -rf $W; mkdir -p $W/A $W/B $W/C $W/D
export OMP_NUM_THREADS=1 MEGATRON_CC_CACHE=$PWD/.cache
PY=${PY:-python3}
COMMON="--warm-start $WARM --iters $ITERS --global-batch-size 128 --micro-batch-size 8"
EX="--extra=--distributed-backend gloo"
case ${ROUND:-1} in
1) A=allreduce,diloco-H50-psgd4-avg-dpadam,diloco-H100-fixpoint-3-dpadam
   B=diloco-H50-dpadam,diloco-H50-psgd4-dpadam,diloco-H75-fixpoint-2-dpadam
   C=diloco-H100-psgd8-avg-dpadam,diloco-H30-psgd2-avg-dpadam,diloco-H50-psgd4-m0.5-dpadam
   D=allreduce,diloco-H50-psgd4-avg-dpadam,diloco-H100-psgd8-avg-dpadam ;;
2) A=allreduce,diloco-H50-dpadam,diloco-H75-dpadam
   B=diloco-H75-fixpoint-2-dpadam,diloco-H75-fixpoint-2-noef-dpadam,diloco-H75-fixpoint-2-ef0.5-dpadam
   C=diloco-H50-fixpoint-1-dpadam,diloco-H50-fixpoint-1-noef-dpadam,diloco-H100-fixpoint-3-noef-dpadam
   D=allreduce,diloco-H75-fixpoint-2-noef-dpadam,diloco-H50-fixpoint-1-noef-dpadam ;;
3) A=allreduce,diloco-H50-fixpoint-3-noef-dpadam,diloco-H50-fixpoint-2-noef-dpadam
   B=diloco-H50-fixpoint-4-noef-dpadam,diloco-H50-fixpoint-3-dpadam,diloco-H50-fixpoint-2-dpadam
   C=diloco-H50-fixpoint-2-ef0.5-dpadam,diloco-H50-fixpoint-3-ef0.5-dpadam,diloco-H30-fixpoint-1-noef-dpadam
   D=allreduce,diloco-H50-fixpoint-3-noef-dpadam,diloco-H50-fixpoint-2-noef-dpadam ;;
esac
t0=$(date +%s)
timeout $BUDGET $PY bench/bench_dp_modes.py $COMMON "$EX" --out $W/A --port 29710 \
  --runs $A > $OUTD/A.log 2>&1 &
while [ ! -f $W/A/warm_start/latest_checkpointed_iteration.txt ]; do
  sleep 2; [ $(( $(date +%s) - t0 )) -gt $BUDGET ] && break; done
sleep 3
echo "warm start after $(( $(date +%s) - t0 )) s" >> $OUTD/times.txt
for X in B C D; do ln -s $W/A/warm_start $W/$X/warm_start; done
left=$(( BUDGET - ($(date +%s) - t0) ))
timeout $left $PY bench/bench_dp_modes.py $COMMON "$EX" --out $W/B --port 29730 \
  --runs $B > $OUTD/B.log 2>&1 &
timeout $left $PY bench/bench_dp_modes.py $COMMON "$EX" --out $W/C --port 29750 \
  --runs $C > $OUTD/C.log 2>&1 &
timeout $left $PY bench/bench_dp_modes.py $COMMON "$EX" --out $W/D --port 29770 --seed 4321 \
  --runs $D > $OUTD/D.log 2>&1 &
wait
echo "all done after $(( $(date +%s) - t0 )) s" >> $OUTD/times.txt
cd $W && tar czf $OUTD/res.tgz */dp_modes.json */dp_modes.md */*.png 2>/dev/null
ls -la $OUTD
