"""Where one flash_decode call's time goes, program by program: each program's start, the end of its key loop, its
partial stored, its counter moved and its end (the combine, for the last split of a group), read from %globaltimer,
and the SM it ran on (%smid). A probe, not a timing of record (that is `flashbench sweep`'s work).

    python3 tools/decode_timeline.py --kv-dtype fp8 --shape 4,32,8,32768 --shape 1,32,8,8192 [--reps 15] [--config JSON]

It compiles a copy of kernels/decode.py with the timer reads added (`instrumented_source`; the copy is written
beside it in kernels/, as _decode_timeline.py, and removed after), checks each call's output against flash_decode's bit
for bit, and times calls as a sweep does (the L2 emptied by a read before each, the GPU held by a spin kernel while
the host enqueues). Per shape, from the call whose span is the median: span (first start to last end), the
programs' loop times (min, median, max), the loop ends (median, max) and the last program's tail split into
storing its partial, moving the counter and combining. The timer ticks in steps of about 0.26 us on an H100.
JSON rows to $OUT/decode_timeline.json (else results/).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

from flashbench.errors import FlashbenchError
from flashbench.spec.parse import parse_decode_shape

ROOT = pathlib.Path(__file__).resolve().parent.parent
COPY = ROOT / "kernels" / "_decode_timeline.py"
WORDS = 8  # int64 words per program: start, loop end, end, smid, partial stored, counter moved

TIMERS = '''@triton.jit
def _clock(x):
    """%globaltimer (ns), after x: x ties the read to the value it waits for."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid(x):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _decode('''

# (anchor in kernels/decode.py, what replaces it): each anchor must occur exactly once.
EDITS = (
    ("@triton.jit\ndef _decode(", TIMERS),
    (
        "(FP8_TILES)\n):",
        "(FP8_TILES)\n    Times,\n):",
    ),
    ("    pid_bh = tl.program_id(2)\n", "    pid_bh = tl.program_id(2)\n    t_start = _clock(pid_s)\n"),
    (
        "    seen = l_i > 0.0\n",
        "    t_loop = _clock(pid_s + (tl.max(tl.max(acc, 1), 0) != tl.max(tl.max(acc, 1), 0)).to(tl.int32))\n"
        "    seen = l_i > 0.0\n",
    ),
    (
        "        counter = Counter + pid_bh * tl.num_programs(1) + pid_m\n"
        '        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits - 1:',
        "        t_stored = _clock(pid_s)\n"
        "        counter = Counter + pid_bh * tl.num_programs(1) + pid_m\n"
        '        moved = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")\n'
        "        t_moved = _clock(moved)\n"
        "        if moved == splits - 1:",
    ),
    (
        "            tl.store(counter, 0)  # every other split has counted: a plain store, no round trip\n",
        "            tl.store(counter, 0)  # every other split has counted: a plain store, no round trip\n"
        "    t_end = _clock(pid_s)\n"
        f"    word = ((pid_bh * tl.num_programs(1) + pid_m) * tl.num_programs(0) + pid_s).to(tl.int64) * {WORDS}\n"
        "    tl.store(Times + word, t_start)\n"
        "    tl.store(Times + word + 1, t_loop)\n"
        "    tl.store(Times + word + 2, t_end)\n"
        "    tl.store(Times + word + 3, _smid(pid_s).to(tl.int64))\n"
        "    if not DIRECT:\n"
        "        tl.store(Times + word + 4, t_stored)\n"
        "        tl.store(Times + word + 5, t_moved)\n",
    ),
    (
        'streams, cfg.get("FULL_BLOCKS", 0),\n    )',
        'streams, cfg.get("FULL_BLOCKS", 0), _TIMES[0],\n    )',
    ),
    ("_LAST_LAUNCH: list[Any] = [None]\n", "_LAST_LAUNCH: list[Any] = [None]\n_TIMES: list[Any] = [None]\n"),
)


def instrumented_source(source: str) -> str:
    """kernels/decode.py's source with the timer reads and the Times argument added; ValueError naming the first
    anchor that is not in it exactly once (the kernel changed under the probe)."""
    for anchor, replacement in EDITS:
        if source.count(anchor) != 1:
            raise ValueError(
                f"decode_timeline: kernels/decode.py no longer has this line once: {anchor.splitlines()[0]!r}"
            )
        source = source.replace(anchor, replacement)
    return source


def summary(times, programs: int, splits: int) -> dict[str, float]:
    """One call's numbers in us from its [programs, WORDS] timer words."""
    t = times[:programs].double()
    start, loop, end = t[:, 0], t[:, 1], t[:, 2]
    base = float(start.min())
    loops = sorted(((loop - start) / 1e3).tolist())
    loop_end = (loop - base) / 1e3  # each program's loop end, us from the first start
    ends = sorted(loop_end.tolist())
    row = {
        "span_us": (float(end.max()) - base) / 1e3,
        "start_max_us": (float(start.max()) - base) / 1e3,
        "loop_min_us": loops[0],
        "loop_median_us": statistics.median(loops),
        "loop_max_us": loops[-1],
        "loop_end_median_us": statistics.median(ends),
        "loop_end_max_us": ends[-1],
    }
    last = int(end.argmax())
    if splits > 1:
        row["tail_store_us"] = float(t[last, 4] - t[last, 1]) / 1e3
        row["tail_counter_us"] = float(t[last, 5] - t[last, 4]) / 1e3
        row["tail_combine_us"] = float(t[last, 2] - t[last, 5]) / 1e3
    else:
        row["tail_store_us"] = float(t[last, 2] - t[last, 1]) / 1e3
    sm = t[:, 3].long()
    row["programs_per_sm"] = sorted(set(sm.bincount().tolist()) - {0})
    # Each SM's last loop end: how far apart the SMs finish (a slow SM's programs end last).
    by_sm = loop_end.new_zeros(int(sm.max()) + 1).scatter_reduce(0, sm, loop_end, "amax")
    sm_ends = sorted(by_sm[sm.unique()].tolist())
    row["sm_loop_end_us"] = [sm_ends[0], statistics.median(sm_ends), sm_ends[-1]]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", required=True, metavar="B,H,HKV,N[,PAGE]")
    ap.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--config", default=None, help="flash_decode's config= as JSON, e.g. '{\"BLOCK_N\": 32}'")
    args = ap.parse_args(argv)
    try:
        shapes = [(spec, parse_decode_shape(spec)) for spec in args.shape]
    except FlashbenchError as err:
        print(f"decode_timeline: {err}", file=sys.stderr)
        return err.exit_code

    import torch

    from flashbench.engine import kv_cache, timing
    from flashbench.engine.blocking import LaunchBlocker

    COPY.write_text(instrumented_source((ROOT / "kernels" / "decode.py").read_text()))
    try:
        from flashbench.kernels import _decode_timeline as probe  # type: ignore[attr-defined]
        from flashbench.kernels import decode
    finally:
        COPY.unlink()
    dev = torch.device("cuda")
    flush, blocker = timing.L2Flusher(dev, "read"), LaunchBlocker()
    rows = []
    for spec, (B, H, Hkv, N, page) in shapes:
        q, k, v, kw = kv_cache.probe_inputs(B, H, Hkv, N, page, args.kv_dtype, dev)
        if args.config:
            kw["config"] = json.loads(args.config)
        expected = decode.flash_decode(q, k, v, validate=False, **kw)
        launch = decode.last_decode_config()
        programs = launch["num_splits"] * launch["row_blocks"] * B * Hkv
        probe._TIMES[0] = torch.zeros(programs * WORDS, dtype=torch.int64, device=dev)
        if not torch.equal(probe.flash_decode(q, k, v, validate=False, **kw), expected):
            print(f"{spec}: the instrumented kernel's output differs from flash_decode's", file=sys.stderr)
            return 1
        calls = []
        for _ in range(args.reps):
            flush()
            blocker.hold()
            probe.flash_decode(q, k, v, validate=False, **kw)
            blocker.release()
            torch.cuda.synchronize()
            calls.append(summary(probe._TIMES[0].view(programs, WORDS).cpu(), programs, launch["num_splits"]))
        row = sorted(calls, key=lambda r: r["span_us"])[len(calls) // 2]
        row = {"shape": spec, "kv_dtype": args.kv_dtype, "programs": programs, "launch": launch, **row}
        rows.append(row)
        print(json.dumps({key: round(val, 2) if isinstance(val, float) else val for key, val in row.items()}))
    out = pathlib.Path(os.environ.get("OUT", ROOT / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_timeline.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
