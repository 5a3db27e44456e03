"""`flashbench roofline` and `flashbench calibrate` (`flashbench memory` is in cli/memory.py).

roofline needs no GPU (it reads configs/gpus.toml; the library call is flashbench.analysis.roofline.build_roofline);
calibrate needs one and exits with EXIT_NO_GPU (3) without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from flashbench.analysis.roofline import ROOF_DTYPES, build_roofline, parse_families
from flashbench.cli.render import console as make_console
from flashbench.cli.render import word_table
from flashbench.engine.calibrate import calibrate
from flashbench.errors import FlashbenchError, warn
from flashbench.spec.cases import DTYPES, MODES, mask_label
from flashbench.spec.parse import parse_causal, parse_range, split_choices
from flashbench.spec.window import parse_window

DEFAULT_SEQ = "1024..32768"


# ------------------------------------------------------------------------------------------ roofline


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def render_roofline(report: dict[str, Any]) -> None:
    from rich.table import Table

    console = make_console()
    gpu = report["gpu"]
    title = f"{gpu['name']}" + (" (derived from NVML)" if gpu["derived"] else "")
    t = Table(title=f"Ceilings: {title} (TF/s = dense TFLOP/s; ridge in FLOP/byte)")
    t.add_column("source")
    t.add_column("TB/s", justify="right")
    for name in ROOF_DTYPES:
        t.add_column(f"{name} TF/s (ridge)", justify="right")
    for c in report["ceilings"]:
        cells = [c["source"], _fmt(c["bw_bytes_s"] and c["bw_bytes_s"] / 1e12)]
        for name in ROOF_DTYPES:
            peak = c["flops_s"].get(name)
            cells.append("-" if not peak else f"{peak / 1e12:.1f} ({c['ridge'][name]:.0f})")
        t.add_row(*cells)
    console.print(t)
    for c in report["ceilings"]:
        if c["note"]:
            console.print(f"  {c['source']}: {c['note']}", style="dim")
    shape = report["shape"]
    console.print(
        f"Cases: batch {shape['batch']}, heads {shape['heads']} (kv {shape['kv_heads']}), "
        f"{_mask_text(shape)}; roof: {report['roof_used']}. FLOPs: {report['flop_convention']}",
        style="dim",
    )
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for e in report["predictions"]:
        groups.setdefault((e["dtype"], e["mode"], e["head_dim"]), []).append(e)
    for (dtype, mode, d), entries in groups.items():
        headers = ["family (matmul)", "N", "AI floor", "AI model", "AI no-L2", "bound", "min ms", "no-L2 ms"]
        rows = [
            [
                f"{e['family']} ({e['compute_dtype']})",
                str(e["seq"]),
                f"{e['compulsory']['ai']:.0f}",
                f"{e['model']['ai']:.1f}",
                f"{e['no_l2']['ai']:.1f}",
                e["bound"],
                f"{e['model']['min_time_s'] * 1e3:.3g}",
                f"{e['no_l2']['min_time_s'] * 1e3:.3g}",
            ]
            for e in entries
        ]
        title = f"{dtype} {mode}, head dim {d}: intensity (FLOP/B), bound, minimum time"
        console.print(word_table(title, headers, rows, console.width, right=(1, 2, 3, 4, 6, 7)))
    console.print(
        "AI floor: compulsory traffic (inputs read once, outputs written once), the best any exact attention can do; "
        "AI model: the family's own traffic with L2 reuse; AI no-L2: with none.",
        style="dim",
    )
    console.print(report["bound_rule"], style="dim")
    if report["measured"]:
        headers = ["provider", "case", "ms", "TFLOP/s", "AI", "% of roofline", "bound", "note"]
        rows = []
        for e in report["measured"]:
            case = (
                f"{e.get('dtype', '')} {e.get('mode', '')} N={e.get('seq_q', '')} d={e.get('head_dim', '')}"
            )
            if not e["valid"]:
                ms = _fmt(e.get("median_ms"), ".4g")
                rows.append([e["provider"], case, ms, "-", "-", "-", "-", f"[red]ERROR: {e['error']}"])
                continue
            note = "throttled" if e["throttled"] else ""
            rows.append(
                [
                    e["provider"],
                    case,
                    f"{e['median_ms']:.4g}",
                    f"{e['achieved_tflops']:.1f}",
                    f"{e['ai']:.0f}",
                    f"{e['pct_of_roofline']:.1f}%",
                    e["bound"],
                    note,
                ]
            )
        console.print(
            word_table("Measured against the roofline", headers, rows, console.width, right=(2, 3, 4, 5))
        )


def _mask_text(shape: dict[str, Any]) -> str:
    """The modelled cases' mask in words: a window says how far each query sees (its numbers apply it)."""
    window = parse_window(shape.get("window") or "")
    if window is None:
        return mask_label(shape["causal"])
    left, right = window
    back = f"{left} keys back" if left >= 0 else "every key back"
    ahead = "none ahead" if right == 0 else f"{right} ahead" if right > 0 else "every key ahead"
    return f"sliding window {left},{right} ({back}, {ahead})"


def roofline(
    gpu: Annotated[
        str, typer.Option(help="GPU: a name from configs/gpus.toml (h100, a100, l40s...) or 'auto' (NVML).")
    ] = "auto",
    seq: Annotated[
        str, typer.Option(help="Sequence lengths (tokens): 512..32768, 1024..8192:1024 or 1000,3000.")
    ] = DEFAULT_SEQ,
    head_dim: Annotated[str, typer.Option(help="Head dimensions, e.g. 64,128.")] = "128",
    dtype: Annotated[str, typer.Option(help="Input dtypes: fp16, bf16, fp32, fp8 (comma list).")] = "bf16",
    mode: Annotated[str, typer.Option(help="fwd, bwd, fwd+bwd (comma list).")] = "fwd",
    families: Annotated[
        str, typer.Option(help="Byte-model families: naive, sdpa-math, flash, stored-p, flash-v1.")
    ] = "naive,sdpa-math,flash,stored-p,flash-v1",
    batch: Annotated[int, typer.Option(help="Batch size of the modelled cases.")] = 1,
    heads: Annotated[int, typer.Option(help="Query heads of the modelled cases.")] = 16,
    kv_heads: Annotated[int | None, typer.Option(help="K/V heads (GQA); default = heads.")] = None,
    causal: Annotated[
        str,
        typer.Option(
            help="true | false: the mask of every modelled case (causal: exact unmasked-pair FLOPs); "
            "a bare --causal: true."
        ),
    ] = "false",
    window: Annotated[
        str,
        typer.Option(
            help="A sliding window L,R for every modelled case (flash-attn's window_size; -1 = none)."
        ),
    ] = "",
    results: Annotated[
        Path | None, typer.Option(help="Run directory whose measured rows to overlay.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Ceilings, ridge points and per-family intensity / bound / minimum time; overlay measured rows. No GPU needed."""
    dtypes = tuple(split_choices(dtype, "--dtype", DTYPES))
    modes = tuple(split_choices(mode, "--mode", MODES))
    report = build_roofline(
        gpu=gpu,
        seqs=parse_range(seq, "--seq"),
        head_dims=tuple(parse_range(head_dim, "--head-dim")),
        dtypes=dtypes,
        modes=modes,
        families=tuple(parse_families(families)),
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        causal=_one_mask(causal),
        results=results,
        window=parse_window(window),
    )
    if "fp8" in dtypes and any(m != "fwd" for m in modes):
        # FA3 and the bundled kernel take fp8 forward only: say so rather than model a backward as if it ran
        warn(
            "fp8 is forward only in every provider: its bwd and fwd+bwd rows model a backward no kernel runs"
        )
    if as_json:
        print(json.dumps(report, indent=2, default=str))
    else:
        render_roofline(report)


def _one_mask(text: str) -> bool:
    masks = parse_causal(text)
    if len(masks) > 1:
        raise FlashbenchError("--causal both: roofline models one mask per call; give --causal true or false")
    return masks[0]


def calibrate_cmd(
    device: Annotated[int, typer.Option(help="CUDA device index.")] = 0,
    n: Annotated[int, typer.Option(help="Matmul size n (n x n x n, 2 n^3 FLOPs).")] = 8192,
    copy_mib: Annotated[int, typer.Option(help="Copy buffer size in MiB (much larger than L2).")] = 1024,
    seconds: Annotated[float, typer.Option(help="Target GPU time per measurement, seconds.")] = 0.5,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON on stdout.")] = False,
) -> None:
    """Measure this GPU's copy and read bandwidth, empty-kernel time and matmul TFLOP/s (clock settled first);
    store them as the 'measured' ceiling. Exit 3 without a GPU."""
    record = calibrate(index=device, n=n, copy_bytes=copy_mib << 20, seconds=seconds)
    if as_json:
        print(json.dumps(record, indent=2, default=str))
        return
    print(f"{record['gpu']}: copy {record['copy_bw_gb_s']:.0f} GB/s (read + write)")
    print(f"  read {record['read_bw_gb_s']:.0f} GB/s (a reduction: bytes read)")
    empty = record["empty_kernel_us"]
    print(f"  empty kernel {empty['eager']:.2f} us, {empty['cuda_graph']:.2f} us replayed from a CUDA graph")
    for d, r in record["details"]["matmul"].items():
        print(
            f"  {d:5s} " + (f"{r['tflops']:.1f} TFLOP/s" if "tflops" in r else f"not measured: {r['error']}")
        )
    if record.get("sm_clock_mhz"):
        print(
            f"  measured at SM clock {record['sm_clock_mhz']:.0f} MHz (max {record['max_sm_clock_mhz']} MHz)"
        )
    if record["throttled"]:
        warn(f"throttled calibration: {record['throttle_reason']}")
    print(f"stored: {record.get('path')}")


def register(app: typer.Typer) -> None:
    app.command("roofline")(roofline)
    app.command("calibrate")(calibrate_cmd)
