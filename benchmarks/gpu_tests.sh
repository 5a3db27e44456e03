#!/usr/bin/env bash
# The kernel test suite on a GPU machine, split over JOBS pytest processes side by side (the suite's time is
# Triton compiles, which use one core each). Logs go to $OUT/pytest-kernels-<i>.log; the last lines printed
# are each shard's pytest summary and the overall exit status.
#
#   JOBS=8 bash benchmarks/gpu_tests.sh [pytest -k expression]
set -uo pipefail
OUT=${OUT:-$PWD/out}
JOBS=${JOBS:-8}
mkdir -p "$OUT"
status=0
pids=()
for ((i = 0; i < JOBS; i++)); do
    FLASHBENCH_TEST_SHARD="$i/$JOBS" timeout "${TEST_TIMEOUT_S:-480}" python3 -m pytest -q -rfE --tb=short \
        -p no:cacheprovider tests/test_kernels.py tests/test_kernels_api.py ${1:+-k "$1"} \
        >"$OUT/pytest-kernels-$i.log" 2>&1 &
    pids+=($!)
done
for ((i = 0; i < JOBS; i++)); do
    wait "${pids[$i]}" || status=1
    echo "shard $i/$JOBS: $(tail -1 "$OUT/pytest-kernels-$i.log")"
done
grep -h "^FAILED\|^ERROR" "$OUT"/pytest-kernels-*.log || true
echo "kernel tests exit status: $status"
exit $status
