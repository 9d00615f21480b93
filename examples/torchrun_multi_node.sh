#!/usr/bin/env bash
# N nodes x 8 GPUs with c10d rendezvous. Run the same command on every node:
#   NNODES=4 MASTER_ADDR=node0 DATA_PREFIX=... VOCAB_FILE=... MERGE_FILE=... bash examples/torchrun_multi_node.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source examples/common.sh
torchrun --nnodes "${NNODES:?}" --nproc-per-node "${GPUS_PER_NODE:-8}" \
  --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:?}:${MASTER_PORT:-29500}" \
  --rdzv-id "${JOB_ID:-megatron-cc}" pretrain_gpt.py \
  "${GPT_ARGS[@]}" "${DATA_ARGS[@]}" "${COMP_ARGS[@]}"
