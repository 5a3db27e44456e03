#!/usr/bin/env bash
# Session 7's GPU evidence (issue 7, the last cell: d = 64 causal N = 2048 forward), one device call per stage.
#
#   bash benchmarks/gpu_s7.sh ab      # A/B in one process (benchmarks/ws_quick.py): the tl forward with the
#                                     # causal diagonal in half-width blocks vs full-width, the Gluon forward
#                                     # persistent with the snake walk, SDPA; then the GPU tests of both changes
#   bash benchmarks/gpu_s7.sh tests   # the kernel suite and test_flash_ws.py on CUDA, sharded
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
# Run pytest over `JOBS` processes (FLASHBENCH_TEST_SHARD, tests/conftest.py); $1 log name, the rest pytest args.
shards() {
    local name=$1 status=0 pids=()
    shift
    for ((i = 0; i < JOBS; i++)); do
        FLASHBENCH_TEST_SHARD="$i/$JOBS" timeout "${TEST_TIMEOUT_S:-400}" python3 -m pytest -q -rfE --tb=short \
            -p no:cacheprovider "$@" >"$OUT/$name-$i.log" 2>&1 &
        pids+=($!)
    done
    for ((i = 0; i < JOBS; i++)); do
        wait "${pids[$i]}" || status=1
        echo "$name shard $i/$JOBS: $(tail -1 "$OUT/$name-$i.log")" | tee -a "$OUT/stage.log"
    done
    grep -h "^FAILED\|^ERROR" "$OUT/$name"-*.log | tee -a "$OUT/stage.log"
    return $status
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
    JOBS=${JOBS:-12} shards pytest-new tests/test_flash_ws.py tests/test_kernels.py \
        -k "snake or half_width or forced_gluon or d64_dispatch or causal_block_order or descriptors_agree"
    ;;
tests)
    JOBS=${JOBS:-12} shards pytest-ws tests/test_flash_ws.py
    JOBS=${JOBS:-12} shards pytest-kernels tests/test_kernels.py tests/test_kernels_api.py -k "not gpu_large"
    ;;
esac
log "stage ${1:-ab} done"
