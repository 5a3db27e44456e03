#!/usr/bin/env bash
# Does the regression gate hold on this GPU? Two same-code runs of the `ci` preset must pass the gate in both
# directions (A/A), and a run with the bundled forward forced to a worse tile must fail it. This is how
# tests/fixtures/aa-run1, aa-run2 and aa-worse were made (H200), and what to rerun before trusting a new
# runner or a new baseline.
#
#   bash benchmarks/gate_aa.sh [DIR]      # default DIR: results/gate-aa; runs DIR/aa-run1, aa-run2, aa-worse
#
# About 6 minutes on an H200. Exit status: 0 when the A/A pair passes both ways and the worse run fails.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-results/gate-aa}
WORSE='{"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}'
mkdir -p "$DIR"
for run in aa-run1 aa-run2; do
    flashbench sweep --preset ci --out "$DIR/$run" --force || exit 2
done
FLASHBENCH_TRITON_CONFIG="$WORSE" flashbench sweep --preset ci --providers triton,sdpa-flash \
    --out "$DIR/aa-worse" --force || exit 2
status=0
flashbench gate --baseline "$DIR/aa-run1" --current "$DIR/aa-run2" || status=1
flashbench gate --baseline "$DIR/aa-run2" --current "$DIR/aa-run1" || status=1
if flashbench gate --baseline "$DIR/aa-run1" --current "$DIR/aa-worse"; then
    echo "gate_aa: the worse config passed the gate" >&2
    status=1
fi
echo "gate_aa: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
