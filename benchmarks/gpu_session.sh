#!/usr/bin/env bash
# The GPU evidence for issues 2, 3, 4 and 6, in stages that each fit one 10-minute device call.
#
#   bash benchmarks/gpu_session.sh a   # kernel tests on CUDA, ci preset twice (A/A) + forced worse config,
#                                      # fidelity check, then the default sweep started in the background
#   bash benchmarks/gpu_session.sh b   # wait for the default sweep, pack it; Nsight Compute byte check
#
# Run directories live in $RUNS on the GPU machine (kept between calls while the machine stays warm);
# logs and tarballs go to $OUT. Nothing here changes clocks or power settings.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}
RUNS=${RUNS:-/root/flashbench-runs}
mkdir -p "$OUT" "$RUNS"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "Running pip as" || true
log() { echo "== $(date +%T) $*" | tee -a "$OUT/stage.log"; }

# Providers in the order they run (provider-major): flex last, its per-shape compiles are the slowest.
DEFAULT_PROVIDERS=triton,triton-stored-p,triton-v1,sdpa-flash,sdpa-cudnn,sdpa-efficient,sdpa,sdpa-math,naive,flex,flash-attn,flash-attn-3
WORSE='{"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}'

case "${1:-a}" in
a)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv >>"$OUT/stage.log"
    log "kernel tests on CUDA (GPU-only shapes, API, the rest of test_kernels.py)"
    timeout 170 python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_kernels_api.py \
        tests/test_kernels.py -k "gpu or non_contiguous or forced or last_config or deterministic" \
        >"$OUT/pytest_gpu.log" 2>&1
    tail -15 "$OUT/pytest_gpu.log" | tee -a "$OUT/stage.log"
    for run in aa-run1 aa-run2; do
        log "ci preset -> $run"
        timeout 130 flashbench sweep --preset ci --out "$RUNS/$run" --force >>"$OUT/stage.log" 2>"$RUNS/$run.err"
        echo "rc=$?" >>"$OUT/stage.log"
    done
    log "ci preset, triton forced to a worse config $WORSE -> aa-worse"
    FLASHBENCH_TRITON_CONFIG="$WORSE" timeout 100 flashbench sweep --preset ci --providers triton,sdpa-flash \
        --out "$RUNS/aa-worse" --force >>"$OUT/stage.log" 2>"$RUNS/aa-worse.err"
    log "fidelity: flashbench median vs do_bench median"
    timeout 100 python3 benchmarks/fidelity.py >>"$OUT/stage.log" 2>&1
    tar czf "$OUT/aa.tgz" -C "$RUNS" aa-run1 aa-run2 aa-worse aa-run1.err aa-run2.err aa-worse.err
    log "default sweep started in the background"
    setsid nohup flashbench sweep --preset default --providers "$DEFAULT_PROVIDERS" --out "$RUNS/default" \
        --force >"$RUNS/default.log" 2>&1 </dev/null &
    sleep 2
    ;;
b)
    log "waiting for the default sweep"
    while pgrep -f "preset default" >/dev/null && [ "$SECONDS" -lt "${WAIT_S:-420}" ]; do sleep 5; done
    if pgrep -f "preset default" >/dev/null; then log "default sweep still running"; fi
    tail -5 "$RUNS/default.log" | tee -a "$OUT/stage.log"
    tar czf "$OUT/default.tgz" -C "$RUNS" default default.log
    ;;
ncu)
    log "Nsight Compute: modelled vs measured DRAM bytes"
    timeout "${NCU_S:-400}" python3 benchmarks/ncu_bytes.py drive --impls naive,sdpa-flash,bundled \
        --seq 1024,4096,8192 --modes fwd >>"$OUT/stage.log" 2>&1
    ;;
esac
log "stage ${1:-a} done"
