#!/usr/bin/env bash
# How a sweep scales over the GPUs of one host: the same sweep on one GPU, on all with --gpus all (with the
# compile-once step, and without it: FLASHBENCH_PRECOMPILE=0), and as one --shard slice per GPU run side by side
# (as a scheduler would run them) merged with `flashbench merge`. GPUS=N uses the first N (default: every GPU).
# Each run (and each shard) starts cold: its own empty TRITON_CACHE_DIR and FLASHBENCH_HOME, made anew each time
# the script runs, so no run reuses another's (or an earlier invocation's) compiled kernels or autotune picks;
# every run pays its own compiles and tuning, and the wall times compare like for like. Needs two GPUs or more; run
# directories, logs and $OUT/multi_gpu.txt (per run: wall, speed-up, first-call compile time summed over workers
# and per worker, the compile-once step's wall time and builds; per case: each run's median over the one-GPU
# run's) are packed into $OUT/multi_gpu.tgz. About 9 minutes on 2 x H100 (one GPU takes 190 s of it): the
# multi-GPU table of docs/benchmarks.md. STEPS picks the runs (default "one all-nopre all shards"); a step replaces
# only its own run under RUNS, so the one-GPU run may be an earlier invocation's on the same machine (a sweep too
# long for one sitting: STEPS=one first, then STEPS=all, GPUS=2 STEPS=all against it).
#
#   bash benchmarks/multi_gpu_scaling.sh
#   STEPS="one all" GPUS=4 bash benchmarks/multi_gpu_scaling.sh
#
# The table ends with how evenly the shapes were dealt: per multi-GPU run, when each worker began its last case
# (from the run's start); and a replay over 2..N workers against the one-GPU run's own times (each shape's measured
# time, its cases' timestamps, compiles left out) of the partition rule (engine/shard.py: --shard slices) and of
# --gpus's hand-out (costliest first, each shape to the worker free first): per worker the summed time, the worst
# over the best and the speed-up that makespan allows. STEPS=none measures nothing
# and prints the table of the runs already in RUNS, on any machine (no GPU needed): how a change to the cost model
# would have dealt a measured sweep, e.g. `STEPS=none GPUS=4 RUNS=DIR bash benchmarks/multi_gpu_scaling.sh`.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}
RUNS=${RUNS:-/root/flashbench-runs}
mkdir -p "$OUT" "$RUNS"
STEPS=" ${STEPS:-one all-nopre all shards} "
log() { echo "== $(date +%T) $*" | tee -a "$RUNS/multi_gpu.log"; }
if [[ $STEPS != " none " ]]; then
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "Running pip as" || true
    nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,power.draw --format=csv | tee -a "$RUNS/multi_gpu.log"
fi
# The ci preset (48 cases: triton, sdpa-flash and sdpa-cudnn; bf16, d = 128, N = 1024..8192, causal both, fwd and
# fwd+bwd): about 2 minutes on one H100 from cold caches. SWEEP_ARGS replaces it (one string, word-split).
read -r -a SWEEP <<<"${SWEEP_ARGS:---preset ci}"
LIMIT=${RUN_LIMIT_S:-240}
NGPU=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((NGPU - 1)))}

cold() {  # cold NAME: empty the Triton cache and flashbench home of run NAME
    rm -rf "$RUNS/cold-$1"
    mkdir -p "$RUNS/cold-$1/triton" "$RUNS/cold-$1/home"
}

timed() {  # timed NAME CMD...: run cold, record wall seconds
    local name=$1
    shift
    cold "$name"
    local t0=$SECONDS
    TRITON_CACHE_DIR="$RUNS/cold-$name/triton" FLASHBENCH_HOME="$RUNS/cold-$name/home" timeout "$LIMIT" "$@" \
        >"$RUNS/$name.log" 2>&1
    local rc=$?
    log "$name: rc=$rc wall=$((SECONDS - t0)) s"
    tail -1 "$RUNS/$name.log" | tee -a "$RUNS/multi_gpu.log"
}

for step in $STEPS; do  # a step replaces only its own run: the one-GPU run may come from an earlier invocation
    if [[ $step == none ]]; then continue; fi
    if [[ $step == shards ]]; then rm -rf "$RUNS/merged" "$RUNS"/shard*; else rm -rf "${RUNS:?}/$step"; fi
done
if [[ $STEPS == *" one "* ]]; then
    log "one GPU"
    timed one flashbench sweep "${SWEEP[@]}" --gpus 0 --out "$RUNS/one" --force
fi
if [[ $STEPS == *" all-nopre "* ]]; then
    log "$NGPU GPUs (--gpus all), without the compile-once step"
    timed all-nopre env FLASHBENCH_PRECOMPILE=0 flashbench sweep "${SWEEP[@]}" --gpus all --out "$RUNS/all-nopre" --force
fi
if [[ $STEPS == *" all "* ]]; then
    log "$NGPU GPUs (--gpus all)"
    timed all flashbench sweep "${SWEEP[@]}" --gpus all --out "$RUNS/all" --force
fi
if [[ $STEPS == *" shards "* ]]; then
    log "$NGPU shards side by side, one per GPU, then merge"
    SHARDS=()
    for i in $(seq 1 "$NGPU"); do cold "shard$i"; SHARDS+=("$RUNS/shard$i"); done
    t0=$SECONDS
    for i in $(seq 1 "$NGPU"); do
        CUDA_VISIBLE_DEVICES=$((i - 1)) TRITON_CACHE_DIR="$RUNS/cold-shard$i/triton" \
            FLASHBENCH_HOME="$RUNS/cold-shard$i/home" timeout "$LIMIT" flashbench sweep "${SWEEP[@]}" \
            --shard "$i/$NGPU" --out "$RUNS/shard$i" --force >"$RUNS/shard$i.log" 2>&1 &
    done
    wait
    log "shards: wall=$((SECONDS - t0)) s"
    flashbench merge "${SHARDS[@]}" --out "$RUNS/merged" --force 2>&1 | tee -a "$RUNS/multi_gpu.log"
fi
python3 - "$RUNS" "$NGPU" <<'PY' | tee "$OUT/multi_gpu.txt" "$RUNS/multi_gpu.txt"
import statistics, sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from flashbench.engine.shard import costliest_first, slice_of_shapes
from flashbench.results.env import read_env
from flashbench.results.rows import read_rows
runs = Path(sys.argv[1])


def case_times(name):
    """Each row's seconds (a row's timestamp is its case's start: it lasts until the same worker's next row
    starts, the last one until the run finished), compiles left out; and when each worker began its last case."""
    env, rows = read_env(runs / name), read_rows(runs / name, latest_only=False)
    start, end = (datetime.fromisoformat(t).timestamp() for t in (env.started, env.finished))
    took, finish, by_worker = [], {}, defaultdict(list)
    for row in rows:
        by_worker[row.gpu_index].append(row)
    for gpu, mine in sorted(by_worker.items(), key=lambda kv: str(kv[0])):
        mine.sort(key=lambda r: r.timestamp)
        ends = [r.timestamp for r in mine[1:]] + [end]
        took += [(r, t - r.timestamp - (r.compile_ms or 0.0) / 1e3) for r, t in zip(mine, ends)]
        finish[gpu] = mine[-1].timestamp - start
    return env, took, finish


one = {r.key: r.median_ms for r in read_rows(runs / "one") if r.median_ms}
base = read_env(runs / "one").wall_s or 0.0
for name in ("one", "all-nopre", "all", *(f"shard{i}" for i in range(1, int(sys.argv[2]) + 1))):
    if not (runs / name / "env.json").is_file():
        continue
    env = read_env(runs / name)
    pre = env.precompile or {}
    step = pre.get("skipped") or (
        f"{pre.get('wall_s')} s beside the workers (record {pre.get('record_s')} s), {pre.get('builds')} builds,"
        f" {pre.get('jobs')} processes, {pre.get('elsewhere')} left to workers, waits {pre.get('workers_waited_s')}")
    wall = env.wall_s or 0.0
    print(f"{name}: wall {wall:.1f} s ({base / wall if wall else 0:.2f}x), compile summed {env.compile_s_total} s,"
          f" per worker {env.compile_s_by_worker}, compile-once step: {step}")
for name in ("all-nopre", "all", "merged"):
    if not (runs / name / "rows.jsonl").is_file():
        continue
    ratios = [r.median_ms / one[r.key] for r in read_rows(runs / name) if r.median_ms and r.key in one]
    if ratios:
        print(f"{name}: per case vs one: median {statistics.median(ratios):.3f}, {min(ratios):.3f}..{max(ratios):.3f}"
              f" ({len(ratios)} cases)")
for name in ("all-nopre", "all"):
    if (runs / name / "env.json").is_file():
        _, _, finish = case_times(name)
        times = " ".join(f"{gpu}: {t:.1f}" for gpu, t in finish.items())
        print(f"{name}: each worker began its last case at (s from the start) {times};"
              f" worst/best {max(finish.values()) / min(finish.values()):.2f}")
if (runs / "one" / "env.json").is_file():
    env, took, _ = case_times("one")
    shape_s = defaultdict(float)
    for row, t in took:
        shape_s[row.case.shape_key] += t
    total = sum(shape_s.values())
    for count in range(2, max(2, int(sys.argv[2])) + 1):
        where = slice_of_shapes([row.case for row, _ in took], count, env.spec)
        slices = [0.0] * count
        for key, t in shape_s.items():
            slices[where[key]] += t
        taken = [0.0] * count  # --gpus: costliest first, each shape to the GPU that is free first
        for key, _ in costliest_first([row.case for row, _ in took], env.spec):
            taken[min(range(count), key=lambda i: (taken[i], i))] += shape_s[key]
        for what, load in (("--shard slices", slices), ("--gpus", taken)):
            print(f"replay of {what} over {count} (the one-GPU run's times, compiles left out, today's rule):"
                  f" {' '.join(f'{x:.1f}' for x in load)} s; worst/best {max(load) / min(load):.2f},"
                  f" makespan {max(load):.1f} s = {max(load) / (total / count):.3f} x an even split,"
                  f" {total / max(load):.2f}x of {total:.1f} s")
PY
[[ $STEPS == " none " ]] && exit 0
# shellcheck disable=SC2046  # the runs this invocation made, word-split on purpose
tar czf "$OUT/multi_gpu.tgz" -C "$RUNS" multi_gpu.txt $(cd "$RUNS" && ls -d one all-nopre all merged shard* ./*.log 2>/dev/null)
log "done"
