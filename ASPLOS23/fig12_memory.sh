#!/usr/bin/env bash
# Fig. 12: peak memory per rank of baseline, CB and CB+LEP (LEP keeps one error buffer per
# boundary). GPU: torch.cuda.max_memory_allocated; CPU: the process's peak RSS.
source "$(dirname "$0")/common.sh"
ITERS="${ITERS:-20}"
for s in baseline cb_nonlep cb_lep; do run_scheme "$s" --train-iters "$ITERS" --eval-interval 0; done
python "$HERE/summarize.py" "$OUT" baseline cb_nonlep cb_lep
