#!/usr/bin/env bash
# Session 7's GPU evidence (issue 7, the last cell: d = 64 causal N = 2048 forward), one device call per stage.
#
#   bash benchmarks/gpu_s7.sh ab      # A/B in one process (benchmarks/ws_quick.py): the tl forward with the
#                                     # causal diagonal in half-width blocks vs full-width, the Gluon forward
#                                     # persistent with the snake walk, SDPA; then the GPU tests of both changes
#   bash benchmarks/gpu_s7.sh tests   # the kernel suite and test_flash_ws.py on CUDA, sharded
#   bash benchmarks/gpu_s7.sh host    # session 8's leaner eager launch path (written on a day no GPU was lent,
#                                     # not yet run): the GPU tests of the launch path, then the host time per
#                                     # call (launch_overhead.py; sessions 3-4: 94-239 us per forward)
# Session 8's plan for the next GPU: `host`, then `tests`, then the speed sweep
# (FLASHBENCH_HOME=$(mktemp -d) STAGE_A_S=420 bash benchmarks/gpu_speed.sh a).
#
# Logs and JSON go to $OUT. Nothing here changes clocks or power settings.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "Running pip as" || true
log() { echo "== $(date +%T) $*" | tee -a "$OUT/stage.log"; }
clocks() {
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
        --format=csv,noheader | tee -a "$OUT/stage.log"
}
case "${1:-ab}" in
ab)
    clocks
    log "A/B d=64 (ws_quick speed, 2 rounds)"
    FLASHBENCH_HOME=$(mktemp -d) timeout 330 python3 benchmarks/ws_quick.py speed --rounds 2 --dims 64 \
        --seqs "${SEQS:-2048,4096,8192,16384}" --providers "${PROVIDERS:-triton,triton-fulldiag,ws3,ws3p,ws3p-snake,ws3p-snake-h16,ws3p-snake-h64,ws3p-s3-snake-h16,ws2p-snake-h16,sdpa-flash,sdpa-cudnn}" \
        2>&1 | tee "$OUT/ab.log"
    clocks
    log "GPU tests of the changes (snake walk, half-width diagonal)"
    TESTS="tests/test_flash_ws.py tests/test_kernels.py" NAME=pytest-new JOBS=${JOBS:-12} \
        bash benchmarks/gpu_tests.sh \
        "snake or half_width or forced_gluon or d64_dispatch or causal_block_order or descriptors_agree" |
        tee -a "$OUT/stage.log"
    ;;
tests)
    TESTS=tests/test_flash_ws.py NAME=pytest-ws JOBS=${JOBS:-12} bash benchmarks/gpu_tests.sh | tee -a "$OUT/stage.log"
    JOBS=${JOBS:-12} bash benchmarks/gpu_tests.sh "not gpu_large" | tee -a "$OUT/stage.log"
    ;;
host)
    log "GPU tests of the launch path (descriptors, TMA, dispatch, gradients)"
    TESTS="tests/test_kernels.py tests/test_kernels_api.py" NAME=pytest-host JOBS=${JOBS:-12} \
        bash benchmarks/gpu_tests.sh "descriptor or tma or half_width or dispatch or grad or gqa" |
        tee -a "$OUT/stage.log"
    log "host time per call"
    FLASHBENCH_HOME=$(mktemp -d) timeout 300 python3 benchmarks/launch_overhead.py 2>&1 | tee "$OUT/launch_overhead.txt"
    ;;
esac
log "stage ${1:-ab} done"
