#!/usr/bin/env bash
# Session 8's GPU plan (issue 7; written on a day no GPU was lent, so not yet run). One device call per stage.
#
#   bash benchmarks/gpu_s8.sh host    # the leaner eager launch path on CUDA: the GPU tests that exercise host
#                                     # descriptors, dispatch and autograd, then the host time per call
#                                     # (benchmarks/launch_overhead.py; sessions 3-4 measured 94-239 us per forward)
#   bash benchmarks/gpu_s7.sh tests   # the whole kernel suite on CUDA, sharded
#   FLASHBENCH_HOME=$(mktemp -d) STAGE_A_S=420 bash benchmarks/gpu_speed.sh a    # the speed sweep (issue 7's table)
#
# Logs go to $OUT. Nothing here changes clocks or power settings.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "Running pip as" || true
log() { echo "== $(date +%T) $*" | tee -a "$OUT/stage.log"; }
case "${1:-host}" in
host)
    log "GPU tests of the launch path (descriptors, TMA, dispatch, gradients)"
    TESTS="tests/test_kernels.py tests/test_kernels_api.py" NAME=pytest-host JOBS=${JOBS:-12} \
        bash benchmarks/gpu_tests.sh "descriptor or tma or half_width or dispatch or grad or gqa" |
        tee -a "$OUT/stage.log"
    log "host time per call"
    FLASHBENCH_HOME=$(mktemp -d) timeout 300 python3 benchmarks/launch_overhead.py 2>&1 | tee "$OUT/launch_overhead.txt"
    ;;
esac
log "stage ${1:-host} done"
