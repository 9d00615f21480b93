#!/usr/bin/env bash
# Fig. 11: cosine between the LEP error and the change of the last stage's input activation.
# The log line carries 'orth cos(E, dx)', 'mean |E|' and 'mean |dx|' at every log interval.
source "$(dirname "$0")/common.sh"
run_scheme cb_lep --check-orth-error-acti
grep -o "orth cos(E, dx): [^|]*| mean |E|: [^|]*| mean |dx|: [^|]*" "$OUT/cb_lep.log"
