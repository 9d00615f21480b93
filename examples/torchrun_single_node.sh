#!/usr/bin/env bash
# One node, 8 GPUs: TP4 x PP2 x DP1.   DATA_PREFIX=... VOCAB_FILE=... MERGE_FILE=... bash examples/torchrun_single_node.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source examples/common.sh
torchrun --standalone --nproc-per-node "${GPUS_PER_NODE:-8}" pretrain_gpt.py \
  "${GPT_ARGS[@]}" "${DATA_ARGS[@]}" "${COMP_ARGS[@]}"
