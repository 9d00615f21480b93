#!/bin/bash
# The Subspace Networks write-scale sweep (docs/subspace.md) on a machine with 16 CPU cores
# (CUDA hidden, so the CPU code runs as on any CPU machine): 300-iteration subspace runs at
# several --subspace-write-scale side by side, one bench_subspace.py invocation (2 processes,
# tp 1 x pp 2) per run. Results: bench/results/subspace_write_scale/.
# Usage, from the repository root: [ROUND=1|2] bench/gpu_subspace_scale.sh OUTDIR BUDGET_S
OUTD=$1; BUDGET=$2
export OMP_NUM_THREADS=1 MEGATRON_CC_CACHE=$PWD/.cache CUDA_VISIBLE_DEVICES=""
PY=${PY:-python3}
t0=$(date +%s); port=29800
run() {   # name, run label, extra flags
  port=$((port + 10))
  timeout $BUDGET $PY bench/bench_subspace.py --iters 300 --layout 1,2 --nproc 2 \
    --port $port --runs $2 --out $OUTD/$1 --extra "$3" > $OUTD/$1.log 2>&1 &
}
case ${ROUND:-1} in
1)
run none none ""
run none_s2 none "--seed 4321"
run k10b4_a1 sub-k10-b4 ""
run k10b4_a0.7 sub-k10-b4 "--subspace-write-scale 0.7"
run k10b4_a0.5 sub-k10-b4 "--subspace-write-scale 0.5"
run k10b4_a0.35 sub-k10-b4 "--subspace-write-scale 0.35"
run k10b4_a0.5_s2 sub-k10-b4 "--subspace-write-scale 0.5 --seed 4321"
run k8b4_a0.5 sub-k8-b4 "--subspace-write-scale 0.5" ;;
2)
run k10b4_a0.35_s2 sub-k10-b4 "--subspace-write-scale 0.35 --seed 4321"
run k10b4_a0.28 sub-k10-b4 "--subspace-write-scale 0.28"
run k10b4_a0.28_s2 sub-k10-b4 "--subspace-write-scale 0.28 --seed 4321"
run k10b4_a0.2 sub-k10-b4 "--subspace-write-scale 0.2"
run k8b4_a0.28 sub-k8-b4 "--subspace-write-scale 0.28"
run none_s3 none "--seed 5555"
run k10b4_a0.35_s3 sub-k10-b4 "--subspace-write-scale 0.35 --seed 5555"
run k10b4_a1_s3 sub-k10-b4 "--seed 5555" ;;
esac
wait
echo "all done after $(( $(date +%s) - t0 )) s" >> $OUTD/times.txt
(cd $OUTD && tar czf res.tgz *.json *.md *.log)
