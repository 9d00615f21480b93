# The same job for every launcher: a GPT-2-medium-sized model, TP4 x PP2 x DP(rest).
# Source this, then launch pretrain_gpt.py with "${GPT_ARGS[@]}" "${DATA_ARGS[@]}" "${COMP_ARGS[@]}".
GPT_ARGS=(
  --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2
  --num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
  --micro-batch-size 8 --global-batch-size 512 --train-iters 100000
  --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-fraction 0.01
  --weight-decay 0.1 --clip-grad 1.0 --bf16
  --log-interval 10 --eval-interval 1000 --eval-iters 20
  --save "${CKPT_DIR:-checkpoints/gpt}" --load "${CKPT_DIR:-checkpoints/gpt}" --save-interval 1000
  --tensorboard-dir "${TB_DIR:-runs/gpt}"
)
DATA_ARGS=(
  --data-path "${DATA_PREFIX:?set DATA_PREFIX to the .bin/.idx prefix from tools/preprocess_data.py}"
  --vocab-file "${VOCAB_FILE:?set VOCAB_FILE}" --merge-file "${MERGE_FILE:?set MERGE_FILE}"
  --split 969,30,1
)
# Compression for slow links; empty = uncompressed Megatron. See docs/running.md ("Launching on
# a cluster") and README.md's feature table for the flags, docs/planning.md for choosing them.
COMP_ARGS=(${COMP_ARGS:-})
