#!/usr/bin/env bash
# Per-task wrapper for srun/jsrun: map the scheduler's task ids onto torch.distributed's
# env:// variables, then run python with the given arguments.
export RANK="${SLURM_PROCID:-${PMIX_RANK:-${OMPI_COMM_WORLD_RANK:-0}}}"
export LOCAL_RANK="${SLURM_LOCALID:-${OMPI_COMM_WORLD_LOCAL_RANK:-$((RANK % ${GPUS_PER_NODE:-8}))}}"
exec python "$@"
