#!/usr/bin/env bash
# Fig. 14: compress/decompress throughput of the CB PowerSGD codec at the 2.5B, 8.3B and 175B
# message shapes for ranks 8..40, next to a memory copy of the same tensor (same run).
#   bash ASPLOS23/fig14_codec.sh           small message sizes (CPU)
#   FULL=1 bash ASPLOS23/fig14_codec.sh    the paper's full shapes
HERE="$(cd "$(dirname "$0")" && pwd)"
python "$(dirname "$HERE")/bench/bench_codecs.py" --codecs lowrank-r8,lowrank-r16,lowrank-r24,lowrank-r32,lowrank-r40 ${FULL:+--full}
