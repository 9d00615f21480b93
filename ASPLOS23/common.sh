# Presets for the Optimus-CC (ASPLOS'23) experiments. Source it; then use "${MODEL_ARGS[@]}".
#   PRESET=small  (default) CPU-sized GPT on the embedded corpus: 8 processes, pp=4 x dp=2
#   PRESET=2.5B   paper's GPT-2.5B: 52 layers, hidden 1920, 24 heads, TP8 x PP4, seq 1024
#   PRESET=8.3B   paper's GPT-8.3B: 72 layers, hidden 3072, 24 heads, TP8 x PP4, seq 1024
# GPU presets need DATA_PREFIX, VOCAB_FILE, MERGE_FILE and a launcher (see slurm/ and lsf/).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PRESET="${PRESET:-small}"
ITERS="${ITERS:-}"
OUT="${OUT:-$ROOT/runs/asplos23/$PRESET}"
mkdir -p "$OUT"

case "$PRESET" in
  small)
    NPROC="${NPROC:-8}"
    MODEL_ARGS=(--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4
      --num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128
      --micro-batch-size 1 --global-batch-size 32 --train-iters "${ITERS:-300}"
      --lr 1e-3 --min-lr 1e-4 --lr-warmup-fraction 0.07 --lr-decay-style cosine
      --log-interval 10 --eval-interval 50 --eval-iters 8)
    CB_RANK=16; SC_RANK=8 ;;
  2.5B|8.3B)
    NPROC="${NPROC:-8}"
    if [ "$PRESET" = 2.5B ]; then L=52; H=1920; else L=72; H=3072; fi
    MODEL_ARGS=(--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4
      --num-layers $L --hidden-size $H --num-attention-heads 24 --seq-length 1024
      --max-position-embeddings 1024 --micro-batch-size 8 --global-batch-size 512
      --train-iters "${ITERS:-100000}" --lr 1.5e-4 --min-lr 1e-5 --lr-decay-style cosine
      --lr-warmup-fraction 0.01 --weight-decay 1e-2 --clip-grad 1.0 --fp16
      --log-interval 100 --eval-interval 1000 --eval-iters 10
      --data-path "${DATA_PREFIX:?}" --vocab-file "${VOCAB_FILE:?}" --merge-file "${MERGE_FILE:?}"
      --split 949,50,1 --save "$OUT/ckpt" --save-interval 5000)
    CB_RANK=16; SC_RANK=128 ;;
  *) echo "unknown PRESET=$PRESET (small | 2.5B | 8.3B)" >&2; exit 2 ;;
esac

# The paper's schemes (Table 2 / Fig. 9 / Table 4 names). As in the paper's own scripts, CB
# compresses only the backward sends on 1F1B's critical path (--inter-grad-comp-epilogue-only);
# "cb_all" compresses every backward send, to show what that costs in quality.
CB="--inter-grad-comp --inter-grad-comp-rank $CB_RANK --inter-grad-comp-epilogue-only"
SC="--grad-comp --grad-comp-rank $SC_RANK --grad-comp-warm-up 0.1 --selective-grad-comp --selective-grad-comp-way 3"
declare -A SCHEME=(
  [baseline]=""
  [cb_all]="--inter-grad-comp --inter-grad-comp-rank $CB_RANK"
  [cb_nonlep]="$CB"
  [cb_lep]="$CB --use-error-feedback"
  [cb_fe]="$CB --use-error-feedback --emb-comm-opt"
  [cb_fe_sc]="$CB --use-error-feedback --emb-comm-opt $SC"
)

# Launch one scheme; on a GPU cluster set LAUNCH to your launcher prefix (the slurm/lsf
# templates do), otherwise torchrun on this node.
run_scheme() {
  local name="$1"; shift
  local launch="${LAUNCH:-torchrun --standalone --nproc-per-node $NPROC}"
  echo "== $name: ${SCHEME[$name]}" >&2
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" $launch "$ROOT/pretrain_gpt.py" "${MODEL_ARGS[@]}" \
    ${SCHEME[$name]} --experiment-name "$name" "$@" 2>&1 | tee "$OUT/$name.log" | grep -E "iteration|validation|peak memory" || true
}
