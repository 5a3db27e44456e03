#!/usr/bin/env bash
# Nsight Compute validation of the byte model on the GPU machine (see benchmarks/ncu_bytes.py).
# Usage: benchmarks/ncu_bytes.sh [extra args for `ncu_bytes.py drive`]
# Writes ncu_bytes.json / ncu_bytes.csv / per-case ncu logs to $OUT (or results/ncu_bytes/).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v ncu >/dev/null || { echo "ncu not found on PATH" >&2; exit 3; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 benchmarks/ncu_bytes.py drive "$@"
