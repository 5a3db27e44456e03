#!/usr/bin/env bash
# Does the regression gate hold on this GPU? Two same-code runs must not fail each other (A/A, both ways), a
# slowdown of the threshold injected into the bundled rows must fail on >= 90% of the cases whose noise allows it
# and 10% on all of them (benchmarks/gate_check.py), and a run with the bundled forward forced to a worse tile must
# fail. This is how tests/fixtures/aa-run1, aa-run2 and aa-worse were made (H200), and what to rerun before
# trusting a new runner or a new baseline.
#
#   bash benchmarks/gate_aa.sh [DIR]             # sweeps DIR/aa-run1, aa-run2, aa-worse (default DIR: results/gate-aa)
#   bash benchmarks/gate_aa.sh --runs RUN RUN... # no sweep: check runs of the same code made earlier
#
# PRESET (default ci) is the sweep's preset, THRESHOLD (default 0.03) the slowdown to catch. About 6 minutes on
# an H200 with the ci preset. Exit status: 0 when every target holds (and the worse run fails), 1 otherwise,
# 2 when a sweep or the check could not run.
set -uo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-ci}
THRESHOLD=${THRESHOLD:-0.03}
if [ "${1:-}" = "--runs" ]; then
    shift
    python benchmarks/gate_check.py "$@" --threshold "$THRESHOLD"
    exit $?
fi
DIR=${1:-results/gate-aa}
WORSE='{"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}'
mkdir -p "$DIR"
for run in aa-run1 aa-run2; do
    flashbench sweep --preset "$PRESET" --out "$DIR/$run" --force || exit 2
done
FLASHBENCH_TRITON_CONFIG="$WORSE" flashbench sweep --preset "$PRESET" --providers triton,sdpa-flash \
    --out "$DIR/aa-worse" --force || exit 2
status=0
python benchmarks/gate_check.py "$DIR/aa-run1" "$DIR/aa-run2" --threshold "$THRESHOLD"
case $? in 0) ;; 1) status=1 ;; *) exit 2 ;; esac
if flashbench gate --baseline "$DIR/aa-run1" --current "$DIR/aa-worse" --threshold "$THRESHOLD"; then
    echo "gate_aa: the worse config passed the gate" >&2
    status=1
fi
echo "gate_aa: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
