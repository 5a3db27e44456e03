#!/usr/bin/env bash
# The bundled kernel against SDPA flash and cuDNN on one GPU: the speed table of docs/benchmarks.md.
#
#   FLASHBENCH_HOME=$(mktemp -d) bash benchmarks/speed_sweep.sh [RUN_DIR]   # default RUN_DIR: results/speed
#   SWEEP_ARGS="--cuda-graph" bash benchmarks/speed_sweep.sh results/speed-graph
#
# Steps: `flashbench calibrate` (the measured ceiling, stored in every row's env.json); `flashbench sweep
# --preset speed` (every provider of a shape back to back; compile and autotune time kept out of the samples);
# then the table (benchmarks/tables.py speed).
# A fresh FLASHBENCH_HOME starts with an empty autotune cache, as a new machine would. On one H100 (2026-11-27):
# 8.4 minutes for d = 64 and 128 (SWEEP_ARGS="--head-dim 64,128"), 3.5 more for d = 256; `--gpus all` shares it
# over a host's GPUs. Nothing here changes clocks or power settings.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-results/speed}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu \
    --format=csv
flashbench calibrate
# shellcheck disable=SC2086  # SWEEP_ARGS: extra sweep flags, word-split on purpose
flashbench sweep --preset speed --out "$RUN" --force ${SWEEP_ARGS:-}
python3 benchmarks/tables.py speed "$RUN"
