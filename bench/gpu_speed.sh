#!/bin/bash
# The GPU speed measurements (docs/gpu.md), in stages that each fit one 10-minute run on one
# H100/H200:
#   tests    the CUDA tests of the fused loss, the kernels and --torch-compile (at most 150 s)
#   bench    bench/bench_gpu.py: the trainer eager and compiled against Hugging Face eager and
#            compiled, every codec against a device copy at the Fig. 14 shapes (at most 400 s;
#            what would start past 330 s is skipped and says so)
#   profile  bench/profile_gpu.py: per-kernel time of a training step (eager and compiled)
#            and of every codec at (1024, 8, 1920) bf16 (about 4 min)
# Usage, from the repository root: bench/gpu_speed.sh OUTDIR [STAGE,...]  (default: tests,bench,
# which with the set-up stays under 10 minutes)
# A .whl folder beside the tree (megatron-core's wheel, docs/gpu.md) is installed first.
OUT=${1:?usage: bench/gpu_speed.sh OUTDIR [tests,bench,profile]}
STAGES=${2:-tests,bench}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
if [ -d .whl ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
        || exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
$PY -c "import torch; print('torch', torch.__version__)" >> "$OUT/gpu.txt" 2>&1
set -o pipefail
for stage in ${STAGES//,/ }; do
    start=$(date +%s)
    case $stage in
    tests)   timeout 150 $PY -m pytest -q tests/gpu/test_compile_cuda.py \
                 tests/gpu/test_kernels_cuda.py \
                 "tests/gpu/test_training_cuda.py::test_fp32_gpu_losses_equal_cpu" \
                 2>&1 | tee "$OUT/tests.log" ;;
    bench)   timeout 400 $PY bench/bench_gpu.py --deadline-s 330 --json "$OUT/bench_gpu.json" \
                 2>&1 | tee "$OUT/bench_gpu.md" ;;
    profile) timeout 300 $PY bench/profile_gpu.py --compiled --out "$OUT/profile.md" \
                 > "$OUT/profile.log" 2>&1; tail -n 40 "$OUT/profile.log" ;;
    *)       echo "unknown stage $stage (tests, bench, profile)"; exit 2 ;;
    esac
    echo "stage $stage: exit $?, $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
done
