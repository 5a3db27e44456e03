"""flash_decode against the SDPA backends on one GPU, in one process: checks, times, tunes (bf16 q, Nq = 1).

Per shape (head dim, batch, query heads, KV heads, context, page size): builds a full-length KV cache, checks
flash_decode against float64 attention (err <= 2 * err(SDPA math in bf16) + 1e-3; then that the cached launch
path gives the same bits), then times it (heuristic splits) and the SDPA backends as a sweep does (median,
L2 evicted by a read before each sample, launch blocking), eagerly and as a CUDA graph of one call (device
time, no host launch path). TB/s = bytes of K and V read / time (GQA: the Hkv heads, as stored). SDPA runs with enable_gqa=True; a
backend that refuses it gets K/V expanded to Hq heads (marked "x"; TB/s still over the stored bytes). Also the
host time of one flash_decode call (validate=False, no sync) in a loop. --tune then sweeps num_splits at the
default tile and the tiles of TUNE_CONFIGS at the heuristic's num_splits, shape by shape, within the budget.
--read-floor first times a kernel that only reads, over given sizes (what a decode of that many bytes cannot beat).
--kv-dtype fp8 reads each shape's cache in e4m3 with one scale per (sequence, KV head) instead, checks it against
float64 attention over the values it stands for, and times it beside flash_decode over the bf16 cache it was made
from (x bf16: the bf16 call's time over the e4m3 call's; no SDPA backend takes an e4m3 cache); --tune then tunes
the e4m3 call.

    python3 benchmarks/decode_speed.py [--tune] [--budget-s 330]   # JSON to $OUT/decode_speed.json
    python3 benchmarks/decode_speed.py --kv-dtype fp8 --shape 16,32,8,8192 --shape 16,32,8,8192,16 --tune --grid \
        --tiles '128,8,5;64,4,6' --splits 1,2,3,4 --max-waves 4

Not the benchmark of record (that is `flashbench sweep` once decode cases land); its numbers decide the
kernel's configs and split heuristic (kernels/decode.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import time

import torch
import triton
import triton.language as tl
from flashbench.kernels import KernelUnsupported, flash_decode
from flashbench.kernels import decode as decode_module
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from flashbench.engine import fp8, kv_cache, timing
from flashbench.engine.blocking import LaunchBlocker
from flashbench.errors import FlashbenchError
from flashbench.spec.parse import parse_decode_shape

SDPA = {
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# --tune: num_splits swept at the default tile, then these tiles (BLOCK_N, num_warps, num_stages) at the
# heuristic's num_splits.
TUNE_CONFIGS = [(64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (128, 8, 3)]
TUNE_SPLITS = [1, 2, 4, 8, 12, 16, 24, 32, 64]
# --grid: every tile of GRID_TILES at every split of GRID_SPLITS (the small-batch shapes, where splits and tile
# interact: a tile's shared memory sets how many programs share an SM).
GRID_TILES = [
    (32, 4, 3),
    (32, 4, 4),
    (64, 4, 2),
    (64, 4, 3),
    (64, 4, 4),
    (64, 8, 3),
    (128, 4, 3),
    (128, 4, 4),
]
GRID_SPLITS = [8, 12, 16, 20, 24, 32, 48, 64]
# A tile's fields in order (TUNE_CONFIGS, GRID_TILES, --tiles); the last, FULL_BLOCKS, may be left out (the default
# tile's then)
TILE_KEYS = ("BLOCK_N", "num_warps", "num_stages", "FULL_BLOCKS")
ROUNDS = [1]  # --rounds: the grid's points timed this many times, in turn


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    kv_heads: int
    context: int
    page: int | None = None  # None: contiguous cache
    head_dim: int = 128
    fp8: bool = False  # the cache in e4m3 (one byte per element) with scales, else bf16

    @property
    def kv_bytes(self) -> int:
        return (
            2 * self.batch * self.kv_heads * self.context * self.head_dim * (1 if self.fp8 else 2)
        )  # K and V

    def label(self) -> str:
        kind = "mha" if self.heads == self.kv_heads else f"gqa{self.heads}/{self.kv_heads}"
        layout = f"page{self.page}" if self.page else "contig"
        return f"d{self.head_dim} {kind} b{self.batch} n{self.context // 1024}k {layout}{' e4m3' if self.fp8 else ''}"


SHAPES = [
    Shape(1, 32, 8, 8192),
    Shape(1, 32, 8, 32768),
    Shape(4, 32, 8, 8192),
    Shape(1, 32, 32, 8192),
    Shape(4, 32, 8, 32768),
    Shape(16, 32, 8, 8192),
    Shape(4, 32, 32, 8192),
    Shape(64, 32, 8, 8192),
    Shape(16, 32, 32, 8192),
    Shape(1, 32, 8, 131072),
    Shape(1, 32, 8, 32768, page=16),
    Shape(1, 32, 8, 32768, page=256),
    Shape(16, 32, 8, 8192, page=16),
    Shape(16, 32, 8, 8192, page=64),
    Shape(4, 32, 32, 8192, page=16),
    Shape(1, 32, 8, 8192, page=16),
    Shape(4, 32, 8, 8192, page=64),
    Shape(1, 32, 32, 8192, page=16),
    Shape(1, 32, 8, 32768, head_dim=64),
    Shape(16, 32, 8, 8192, head_dim=64),
    Shape(1, 32, 8, 32768, head_dim=256),
    Shape(16, 32, 8, 8192, head_dim=256),
    Shape(1, 32, 8, 16384),
    Shape(32, 32, 8, 1024),
    Shape(32, 32, 8, 1024, page=16),
]


def build(s: Shape, gen: torch.Generator):
    """q and contiguous bf16 k/v; the bf16 cache flash_decode reads (k/v, or the sweep's page pool and its table,
    engine/kv_cache.page); and for an e4m3 shape the e4m3 cache in the same layout (the same table), its scales and
    the real values it stands for (contiguous, float64: the reference's k and v)."""
    q = torch.randn((s.batch, s.heads, 1, s.head_dim), device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (
        torch.randn(
            (s.batch, s.kv_heads, s.context, s.head_dim), device="cuda", dtype=torch.bfloat16, generator=gen
        )
        for _ in range(2)
    )
    lengths = (s.context,) * s.batch

    def layout(a: torch.Tensor, b: torch.Tensor) -> tuple:
        return (a, b, None) if s.page is None else kv_cache.page(a, b, lengths, s.page)

    e4m3 = None
    if s.fp8:
        k8, v8, scales = kv_cache.quantize(k, v)
        real = tuple(
            fp8.dequantize(t, sc).double() for t, sc in ((k8, scales["k_scale"]), (v8, scales["v_scale"]))
        )
        e4m3 = (*layout(k8, v8), scales, real)
    return q, k, v, layout(k, v), e4m3


def sdpa_call(backend, q, k, v):
    def call():
        with sdpa_kernel(backend):
            return sdpa(q, k, v, enable_gqa=k.shape[1] != q.shape[1])

    return call


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


_TIMER: dict[str, object] = {}
GRID = [False]
MAX_WAVES = [float("inf")]  # --grid: leave out split counts that make more programs than this many per SM


def default_launch() -> tuple[dict[str, int], int]:
    """The tile and split count of the last flash_decode call, one made without a forced config or split count."""
    launch = decode_module.last_decode_config()
    assert launch is not None
    return {key: launch[key] for key in TILE_KEYS if key in launch}, launch["num_splits"]


def bench(fn) -> float:
    """Median ms of `fn` as a sweep times it: L2 evicted by a read before each sample (a write flush would leave
    the L2 dirty and add its write-back to these short calls: benchmarks/l2_flush.py), launch blocking, a short
    warm-up (the clock of a memory-bound call hardly moves)."""
    if not _TIMER:
        _TIMER.update(flush=timing.L2Flusher(torch.cuda.current_device(), "read"), blocker=LaunchBlocker())
    regime = timing.Regime(warmup_ms=100, warmup_max_ms=300, rep_ms=60, rep_max_ms=200)
    took = timing.measure_cuda(fn, flush=_TIMER["flush"], regime=regime, blocker=_TIMER["blocker"])
    return statistics.median(took.samples_ms)


def clocks() -> dict[str, int]:
    try:
        import pynvml  # deferred: only for the clock record

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, 0), "mem_mhz": pynvml.nvmlDeviceGetClockInfo(h, 2)}
    except Exception as exc:  # noqa: BLE001 - the record notes why no clock was read
        return {"error": str(exc)}


def graph_ms(fn) -> float:
    """do_bench median of a CUDA graph of one call: device time without the host's launch path."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # warm-up on the capture stream (compiles, allocates the stream's scratch)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    return bench(graph.replay)


def tune(s: Shape, ours, base: dict, rows: list[dict], until: float) -> None:
    """num_splits swept at the default config, then TUNE_CONFIGS at the heuristic's num_splits."""
    summary = next(r for r in rows if r["provider"] == "summary" and r["shape"] == s.label())
    default, pick = summary["default_tile"], summary["heuristic_splits"]
    points = [(default, n) for n in TUNE_SPLITS if n == 1 or s.context // n >= default["BLOCK_N"]]
    points += [(dict(zip(TILE_KEYS, tile, strict=False)), pick) for tile in TUNE_CONFIGS]
    if GRID[0]:
        points = [
            (dict(zip(TILE_KEYS, tile, strict=False)), n)
            for tile in GRID_TILES
            for n in GRID_SPLITS
            if s.context // n >= tile[0]
            and s.batch * s.kv_heads * n
            <= MAX_WAVES[0] * torch.cuda.get_device_properties(0).multi_processor_count
        ]
    for round_ in range(ROUNDS[0]):  # every point once a round, the rounds in turn
        for cfg, splits in points:
            if time.time() > until:
                break
            point = {**base, "provider": "tune", "config": cfg, "splits": splits, "round": round_}
            try:
                ms = bench(ours(splits, cfg))
            except KernelUnsupported as exc:  # a tile that does not fit this GPU: recorded
                rows.append({**point, "error": str(exc)[:200]})
                continue
            rows.append({**point, "ms": ms})
    tuned = [r for r in rows if r["provider"] == "tune" and r["shape"] == s.label() and "ms" in r]
    if tuned:
        best = min(tuned, key=lambda r: r["ms"])
        print(f"{s.label():30s} tuned best {tuple(best['config'].values())} s{best['splits']}: "
              f"{best['ms'] * 1e3:.1f} us {s.kv_bytes / best['ms'] / 1e9:.2f} TB/s", flush=True)  # fmt: skip


def measure(s: Shape, gen: torch.Generator, rows: list[dict], tune_until: float | None) -> None:
    """Check and time one shape (eager and as a CUDA graph) beside SDPA; with tune_until, tune instead."""
    q, k, v, (kc, vc, table), e4m3 = build(s, gen)
    base = {"shape": s.label(), **dataclasses.asdict(s)}
    lens = torch.full((s.batch,), s.context, dtype=torch.int32, device="cuda")

    def bf16_call(splits=None, config=None):
        return lambda: flash_decode(q, kc, vc, lens, table, num_splits=splits, validate=False, config=config)

    ours = bf16_call
    if e4m3 is not None:
        kc8, vc8, _, scales, real = e4m3

        def ours(splits=None, config=None):
            return lambda: flash_decode(
                q, kc8, vc8, lens, table, num_splits=splits, validate=False, config=config, **scales
            )

    if tune_until is not None:
        tune(s, ours, base, rows, tune_until)
        return
    if e4m3 is not None:
        # Correctness against float64 attention over the values the e4m3 cache stands for; then the e4m3 call
        # and the bf16 call over the cache it was quantized from, back to back.
        ref = sdpa_call(SDPBackend.MATH, q.double(), *real)()
        lowp = rel_err(sdpa_call(SDPBackend.MATH, q, *(t.to(q.dtype) for t in real))(), ref)
        checked = flash_decode(q, kc8, vc8, lens, table, **scales)
        tile, heuristic = default_launch()
        err = rel_err(checked, ref)
        del ref, real, e4m3  # the float64 cache (8.6 GB at MHA batch 16) is not held through the timing
        # the cached compiled kernel (no validation) gives the same bits
        same = torch.equal(ours()(), checked)
        ms8, ms16 = bench(ours()), bench(bf16_call())
        g8, g16 = graph_ms(ours()), graph_ms(bf16_call())
        line = (
            f"{s.label():36s} {s.kv_bytes / 1e6:7.1f} MB ok={err <= 2 * lowp + 1e-3}/{same} err={err:.1e}/{lowp:.1e} "
            f"s={heuristic:3d} e4m3 {ms8 * 1e3:6.1f} us {s.kv_bytes / ms8 / 1e9:4.2f} TB/s (graph {g8 * 1e3:6.1f}) "
            f"| bf16 {ms16 * 1e3:6.1f} us (graph {g16 * 1e3:6.1f}) | x{ms16 / ms8:4.2f} bf16"
        )
        print(line, flush=True)
        rows.append({**base, "provider": "summary", "ok": err <= 2 * lowp + 1e-3, "same_bits": same, "err": err,
                     "lowp_err": lowp, "heuristic_splits": heuristic, "default_tile": tile, "e4m3_ms": ms8,
                     "bf16_ms": ms16, "e4m3_graph_ms": g8, "bf16_graph_ms": g16, "line": line,
                     "clocks": clocks()})  # fmt: skip
        return
    # Correctness on this shape: the checked call (validation on, Triton's JIT launch) against float64.
    ref = sdpa_call(SDPBackend.MATH, q.double(), k.double(), v.double())()
    lowp = rel_err(sdpa_call(SDPBackend.MATH, q, k, v)(), ref)
    checked = flash_decode(q, kc, vc, lens, table)
    tile, heuristic = default_launch()
    err = rel_err(checked, ref)
    ok = err <= 2 * lowp + 1e-3
    del ref
    timed = {"flash_decode": ours(), **{name: sdpa_call(b, q, k, v) for name, b in SDPA.items()}}
    results, graphs = {}, {}
    for name, fn in timed.items():
        try:
            ms = bench(fn)
        except RuntimeError as exc:  # a backend that refuses GQA: expanded K/V
            group = s.heads // s.kv_heads
            kx, vx = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            try:
                fn, name = sdpa_call(SDPA[name], q, kx, vx), name + " x"
                ms = bench(fn)
            except RuntimeError:
                rows.append({**base, "provider": name, "error": str(exc).splitlines()[0][:200]})
                continue
        results[name] = ms
        if name != "math" and not name.endswith(" x"):
            try:
                graphs[name] = graph_ms(fn)
            except RuntimeError as exc:
                rows.append({**base, "provider": name + " graph", "error": str(exc).splitlines()[0][:200]})
        row = {**base, "provider": name, "ms": ms, "tbps": s.kv_bytes / ms / 1e9}
        rows.append({**row, "graph_ms": graphs.get(name)})
    same = torch.equal(ours()(), checked)  # the cached compiled kernel (no validation) gives the same bits
    call = ours()
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    h0 = time.perf_counter()
    for _ in range(50):
        call()
    host_us = (time.perf_counter() - h0) / 50 * 1e6
    torch.cuda.synchronize()
    sdpa_ms, sdpa_name = min((ms, n) for n, ms in results.items() if n != "flash_decode")
    ours_ms, tb = results["flash_decode"], lambda ms: s.kv_bytes / ms / 1e9
    cudnn = next((ms for n, ms in results.items() if n.startswith("sdpa-cudnn")), float("nan"))
    g_ours = graphs.get("flash_decode", float("nan"))
    g_sdpa = min((ms for n, ms in graphs.items() if n != "flash_decode"), default=float("nan"))
    line = (
        f"{s.label():30s} {s.kv_bytes / 1e6:7.1f} MB ok={ok}/{same} err={err:.1e}/{lowp:.1e} s={heuristic:3d} "
        f"ours {ours_ms * 1e3:6.1f} us {tb(ours_ms):4.2f} TB/s (graph {tb(g_ours):4.2f}) host {host_us:5.1f} us | "
        f"{sdpa_name} {tb(sdpa_ms):4.2f} (best graph {tb(g_sdpa):4.2f}) | x{sdpa_ms / ours_ms:4.2f} best "
        f"x{cudnn / ours_ms:4.2f} cudnn"
    )
    print(line, flush=True)
    rows.append({**base, "provider": "summary", "ok": ok, "same_bits": same, "err": err, "lowp_err": lowp,
                 "heuristic_splits": heuristic, "default_tile": tile, "host_us": host_us, "line": line,
                 "clocks": clocks()})  # fmt: skip


@triton.jit
def _read(X, Out, n, BLOCK: tl.constexpr):
    """Sum x over a grid-strided walk: a kernel that only reads (its output is one float per program)."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        acc += tl.load(X + start + offs, mask=start + offs < n, other=0.0).to(tl.float32)
    tl.store(Out + tl.program_id(0), tl.sum(acc, 0))


READ_PROGRAMS_PER_SM = (1, 2, 4, 8)
READ_BLOCKS = (4096, 16384)


def read_floor(sizes_mb: list[float], rows: list[dict]) -> None:
    """What any kernel pays to read n bytes once: the fastest _read over READ_PROGRAMS_PER_SM x READ_BLOCKS,
    replayed from a CUDA graph with the read flush before each sample. Beside it, its own floor: the bytes at the
    read bandwidth _read reaches at the largest size (so that size sits at 1.00 by construction), plus a one-element
    kernel's graph replay timed here. A decode row's floor is the calibration's instead (flashbench calibrate's read
    bandwidth and empty kernel, models/roofline.decode_floor_s)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    one = torch.zeros(1, device="cuda")
    empty_ms = graph_ms(lambda: one.add_(1))
    out = torch.empty(max(READ_PROGRAMS_PER_SM) * sms, device="cuda")
    best: dict[float, tuple[float, int, int]] = {}
    for mb in sizes_mb:
        x = torch.ones(int(mb * 1e6) // 2, dtype=torch.bfloat16, device="cuda")
        for k in READ_PROGRAMS_PER_SM:
            for block in READ_BLOCKS:
                ms = graph_ms(
                    functools.partial(_read[(k * sms,)], x, out, x.numel(), BLOCK=block, num_warps=8)
                )
                best[mb] = min(best.get(mb, (ms, k, block)), (ms, k, block))
    top = max(best)  # GB/s (bytes / ms / 1e6) at the largest size, its empty-kernel time taken off
    bw = top * 1e6 / (best[top][0] - empty_ms) / 1e6
    for mb, (ms, k, block) in sorted(best.items()):
        floor_ms = mb * 1e6 / bw / 1e9 * 1e3 + empty_ms
        line = (
            f"read {mb:7.1f} MB: {ms * 1e3:6.1f} us ({k} programs per SM, BLOCK {block}); its own floor "
            f"{floor_ms * 1e3:6.1f} us (read {bw:.0f} GB/s at {top:.0f} MB + empty graph "
            f"{empty_ms * 1e3:.2f} us): x{ms / floor_ms:.2f}"
        )
        print(line, flush=True)
        rows.append({"provider": "read", "mb": mb, "ms": ms, "floor_ms": floor_ms, "read_gb_s": bw,
                     "empty_graph_ms": empty_ms, "programs_per_sm": k, "block": block, "line": line})  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tune", action="store_true", help="then time every (config, num_splits) pair per shape")
    ap.add_argument(
        "--budget-s", type=float, default=330.0, help="stop tuning this many seconds after the start"
    )
    ap.add_argument("--grid", action="store_true", help="with --tune: every GRID_TILES x GRID_SPLITS pair")
    ap.add_argument(
        "--tiles",
        default="",
        help="--grid's tiles instead of GRID_TILES: 'BLOCK_N,warps,stages[,full_blocks];...'",
    )
    ap.add_argument("--rounds", type=int, default=1, help="--grid: time every point this many times, in turn")
    ap.add_argument("--splits", default="", help="--grid's split counts instead of GRID_SPLITS: '16,32'")
    ap.add_argument("--shapes", default="", help="comma-separated indices into SHAPES (default: all)")
    ap.add_argument(
        "--shape",
        action="append",
        default=[],
        help="a shape of its own, batch,heads,kv_heads,N[,page] (repeatable)",
    )
    ap.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16", help="fp8: the cache in e4m3")
    ap.add_argument(
        "--max-waves", type=float, default=float("inf"), help="--grid: at most this many programs per SM"
    )
    ap.add_argument(
        "--read-floor",
        default="",
        help="first, a read-only kernel's time over these sizes in MB under a CUDA graph: '34,67,1074'",
    )
    args = ap.parse_args()
    try:
        mine = [parse_decode_shape(text) for text in args.shape]
    except FlashbenchError as err:
        print(f"decode_speed: {err}", file=sys.stderr)
        return err.exit_code
    GRID[0] = args.grid
    MAX_WAVES[0] = args.max_waves
    ROUNDS[0] = args.rounds
    if args.tiles:
        GRID_TILES[:] = [tuple(int(x) for x in t.split(",")) for t in args.tiles.split(";")]
    if args.splits:
        GRID_SPLITS[:] = [int(x) for x in args.splits.split(",")]
    t0, gen = time.time(), torch.Generator(device="cuda").manual_seed(0)
    path = os.path.join(os.environ.get("OUT", "."), "decode_speed.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rows: list[dict] = []
    record = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    record["clocks_start"] = clocks()
    one = torch.zeros(1, device="cuda")
    # a one-element kernel: what any call costs at least
    record["floor_us"] = bench(lambda: one.add_(1)) * 1e3
    print(f"floor (one-element kernel between the events): {record['floor_us']:.1f} us", flush=True)
    if args.read_floor:
        read_floor([float(x) for x in args.read_floor.split(",")], rows)
    # --shapes picks from SHAPES by index; --shape alone gives only its own shapes; neither: all of SHAPES
    if args.shapes:
        picks = [SHAPES[int(i)] for i in args.shapes.split(",")]
    else:
        picks = [] if args.shape else list(SHAPES)
    picks += [Shape(b, h, hkv, n, page=page) for b, h, hkv, n, page in mine]
    picks = [dataclasses.replace(p, fp8=args.kv_dtype == "fp8") for p in picks]
    for tune in [False, True] if args.tune else [False]:
        for i, s in enumerate(picks):
            # Tuning: each remaining shape gets an equal share of the time left.
            until = time.time() + (t0 + args.budget_s - time.time()) / (len(picks) - i) if tune else None
            measure(s, gen, rows, until)
            torch.cuda.empty_cache()
            with open(path, "w") as fh:
                json.dump({**record, "rows": rows}, fh, indent=1)
    record["clocks_end"] = clocks()
    with open(path, "w") as fh:
        json.dump({**record, "rows": rows}, fh, indent=1)
    print(f"done in {time.time() - t0:.0f} s; {sum(r['provider'] == 'tune' for r in rows)} tuned points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
