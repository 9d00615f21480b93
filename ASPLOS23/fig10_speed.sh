#!/usr/bin/env bash
# Fig. 10: time per iteration of each scheme (same model, same data).
source "$(dirname "$0")/common.sh"
ITERS="${ITERS:-60}"
for s in baseline cb_nonlep cb_lep cb_fe cb_fe_sc; do run_scheme "$s" --train-iters "$ITERS" --eval-interval 0; done
python "$HERE/summarize.py" "$OUT" baseline cb_nonlep cb_lep cb_fe cb_fe_sc
