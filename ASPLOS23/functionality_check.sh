#!/usr/bin/env bash
# Quick check that every Optimus-CC feature runs together on a small GPT (about a minute).
source "$(dirname "$0")/common.sh"
ITERS=20 run_scheme cb_fe_sc --train-iters 20 --eval-interval 20 --check-orth-error-acti --check-comp-ratio
