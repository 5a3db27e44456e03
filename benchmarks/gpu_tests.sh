#!/usr/bin/env bash
# The kernel test suite on a GPU machine, split over JOBS pytest processes side by side (the suite's time is
# Triton compiles, which use one core each). Logs go to $OUT/$NAME-<i>.log; the last lines printed are each
# shard's pytest summary and the overall exit status.
#
#   JOBS=8 bash benchmarks/gpu_tests.sh [pytest -k expression]
#   TESTS="tests/test_flash_ws.py" NAME=pytest-ws bash benchmarks/gpu_tests.sh   # other test files
set -uo pipefail
OUT=${OUT:-$PWD/out}
JOBS=${JOBS:-8}
TESTS=${TESTS:-tests/test_kernels.py tests/test_kernels_api.py}
NAME=${NAME:-pytest-kernels}
mkdir -p "$OUT"
status=0
pids=()
for ((i = 0; i < JOBS; i++)); do
    # shellcheck disable=SC2086  # TESTS: a list of files, word-split on purpose
    FLASHBENCH_TEST_SHARD="$i/$JOBS" timeout "${TEST_TIMEOUT_S:-900}" python3 -m pytest -q -rfE --tb=short \
        -p no:cacheprovider $TESTS ${1:+-k "$1"} >"$OUT/$NAME-$i.log" 2>&1 &
    pids+=($!)
done
for ((i = 0; i < JOBS; i++)); do
    wait "${pids[$i]}" || status=1
    echo "$NAME shard $i/$JOBS: $(tail -1 "$OUT/$NAME-$i.log")"
done
grep -h "^FAILED\|^ERROR" "$OUT/$NAME"-*.log || true
echo "$NAME exit status: $status"
exit $status
