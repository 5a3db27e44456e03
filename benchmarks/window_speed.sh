#!/usr/bin/env bash
# The sliding-window target, side by side in one run: a causal window of 4096 keys against full causal at
# N = 32k (bf16, d = 128, 16 heads, batch 1), the bundled kernel and compiled FlexAttention, forward, shape by
# shape (`--preset window`, configs/sweeps/window.toml); then the table of docs/benchmarks.md: each provider's
# speed-up from the window (against the 4.27x fewer unmasked pairs) and the bundled kernel's time over Flex's.
#
#   bash benchmarks/window_speed.sh [RUN_DIR]        # ~3 min on an H100, most of it FlexAttention's compiles
set -euo pipefail
RUN=${1:-${OUT:-results}/window-speed}
flashbench sweep --preset window --out "$RUN" --force
python3 benchmarks/tables.py window "$RUN"
