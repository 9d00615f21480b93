#!/bin/bash
# Issue 27 on a GPU machine (the device tool): warm start once, then four bench invocations
# side by side (one GPU, 4 gloo ranks each), all within BUDGET_S seconds.
# Usage, from the repository root: bench/gpu_dp_1000x.sh OUTDIR WARM ITERS BUDGET_S
OUTD=$1; WARM=$2; ITERS=$3; BUDGET=$4
W=/tmp/w27; rm -rf $W; mkdir -p $W/A $W/B $W/C $W/D
export OMP_NUM_THREADS=1 MEGATRON_CC_CACHE=$PWD/.cache
PY=${PY:-python3}
COMMON="--warm-start $WARM --iters $ITERS --global-batch-size 128 --micro-batch-size 8"
EX="--extra=--distributed-backend gloo"
t0=$(date +%s)
timeout $BUDGET $PY bench/bench_dp_modes.py $COMMON "$EX" --out $W/A --port 29710 \
  --runs allreduce,diloco-H50-psgd4-avg-dpadam,diloco-H100-fixpoint-3-dpadam > $OUTD/A.log 2>&1 &
while [ ! -f $W/A/warm_start/latest_checkpointed_iteration.txt ]; do
  sleep 2; [ $(( $(date +%s) - t0 )) -gt $BUDGET ] && break; done
sleep 3
echo "warm start after $(( $(date +%s) - t0 )) s" >> $OUTD/times.txt
for X in B C D; do ln -s $W/A/warm_start $W/$X/warm_start; done
left=$(( BUDGET - ($(date +%s) - t0) ))
timeout $left $PY bench/bench_dp_modes.py $COMMON "$EX" --out $W/B --port 29730 \
  --runs diloco-H50-dpadam,diloco-H50-psgd4-dpadam,diloco-H75-fixpoint-2-dpadam > $OUTD/B.log 2>&1 &
timeout $left $PY bench/bench_dp_modes.py $COMMON "$EX" --out $W/C --port 29750 \
  --runs diloco-H100-psgd8-avg-dpadam,diloco-H30-psgd2-avg-dpadam,diloco-H50-psgd4-m0.5-dpadam > $OUTD/C.log 2>&1 &
timeout $left $PY bench/bench_dp_modes.py $COMMON "$EX" --out $W/D --port 29770 --seed 4321 \
  --runs allreduce,diloco-H50-psgd4-avg-dpadam,diloco-H100-psgd8-avg-dpadam > $OUTD/D.log 2>&1 &
wait
echo "all done after $(( $(date +%s) - t0 )) s" >> $OUTD/times.txt
cd $W && tar czf $OUTD/res.tgz */dp_modes.json */dp_modes.md */*.png 2>/dev/null
ls -la $OUTD
