#!/usr/bin/env bash
# Table 2 / Fig. 9 / Table 4: pretraining loss & validation perplexity for every scheme.
#   bash ASPLOS23/tbl2_fig9_tbl4.sh            (small CPU preset, ~5 min per scheme)
#   PRESET=2.5B bash ASPLOS23/tbl2_fig9_tbl4.sh (GPU cluster; see slurm/ lsf/)
source "$(dirname "$0")/common.sh"
for s in baseline cb_all cb_nonlep cb_lep cb_fe cb_fe_sc; do run_scheme "$s"; done
python "$HERE/summarize.py" "$OUT" baseline cb_all cb_nonlep cb_lep cb_fe cb_fe_sc
