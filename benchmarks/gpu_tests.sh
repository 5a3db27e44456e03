#!/usr/bin/env bash
# The test suite on a GPU machine, split over JOBS pytest processes side by side (its time is Triton compiles, which
# use one core each). Each process takes whole compile groups (tests/tiers.py: a test module and the parameters that
# select a kernel build), so a kernel variant compiles in one process, not in every one. Triton's cache
# (~/.triton/cache) and the tests' autotune picks (FLASHBENCH_TEST_HOME, default ~/.cache/flashbench-tests) outlive
# the run: a second run on the same machine compiles and tunes only what changed.
# Logs go to $OUT/$NAME-<i>.log, the tests that failed to $OUT/$NAME-failing.txt as they end, and their tracebacks
# to $OUT/$NAME-<i>-tracebacks.txt as they fail (tests/conftest.py; a shard killed at its limit never prints its
# summary); the last lines printed are each shard's pytest summary and the overall exit status.
#
#   bash benchmarks/gpu_tests.sh                          # the smoke tier of the whole suite, 8 processes
#   FULL=1 JOBS=15 bash benchmarks/gpu_tests.sh           # the full matrix (tests/tiers.py), 15 processes
#   TESTS="tests/test_flash_ws.py" NAME=pytest-ws bash benchmarks/gpu_tests.sh 'forward'   # a -k expression
set -uo pipefail
OUT=${OUT:-$PWD/out}
JOBS=${JOBS:-8}
TESTS=${TESTS:-tests}
NAME=${NAME:-pytest}
FULL=${FULL:-0}
mkdir -p "$OUT"
status=0
pids=()
start=$(date +%s)
: >"$OUT/$NAME-failing.txt"
rm -f "$OUT/$NAME"-[0-9]*-tracebacks.txt
for ((i = 0; i < JOBS; i++)); do
    # At the time limit pytest gets SIGINT, not SIGTERM: it stops and still prints its summary, the failures so far
    # named (-rfE), where a terminated shard would leave only its progress dots. -v names each test as it ends, and
    # its FAILED / ERROR lines go to $NAME-failing.txt at once: a shard killed outright (the machine's own limit)
    # still leaves the names of what failed before.
    # shellcheck disable=SC2086  # TESTS: a list of files, word-split on purpose
    FLASHBENCH_FULL_TESTS=$FULL FLASHBENCH_TEST_SHARD="$i/$JOBS" \
        FLASHBENCH_TEST_FAILURES="$OUT/$NAME-$i-tracebacks.txt" \
        timeout --signal=INT --kill-after=60 "${TEST_TIMEOUT_S:-1800}" \
        python3 -m pytest -v -rfE --tb=short --durations=20 -p no:cacheprovider $TESTS ${1:+-k "$1"} 2>&1 |
        tee "$OUT/$NAME-$i.log" |
        { grep --line-buffered -E '::.* (FAILED|ERROR)( |$)' || true; } >>"$OUT/$NAME-failing.txt" &
    pids+=($!)
done
for ((i = 0; i < JOBS; i++)); do
    wait "${pids[$i]}"
    rc=$?
    # 5: pytest selected no test in this shard (more shards than compile groups), not a failure
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi
    cut=""
    if [ "$rc" -eq 124 ]; then cut=" (cut at the ${TEST_TIMEOUT_S:-1800} s limit)"; fi
    echo "$NAME shard $i/$JOBS$cut: $(tail -1 "$OUT/$NAME-$i.log")"
done
grep -h "^FAILED\|^ERROR" "$OUT/$NAME"-[0-9]*.log || true
if [ -s "$OUT/$NAME-failing.txt" ]; then
    echo "$NAME: $(wc -l <"$OUT/$NAME-failing.txt") failed as they ran (a cut shard's too): $OUT/$NAME-failing.txt," \
        "their tracebacks in $OUT/$NAME-<shard>-tracebacks.txt"
fi
echo "$NAME: $JOBS shards in $(($(date +%s) - start)) s; exit status: $status"
exit $status
