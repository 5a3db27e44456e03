"""`flashbench roofline` and `flashbench calibrate` (`flashbench memory` is in cli/memory.py).

roofline needs no GPU (it reads configs/gpus.toml); calibrate needs one and exits with EXIT_NO_GPU (3)
without it. build_roofline is the library call behind the command.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from flashbench.errors import FlashbenchError

DEFAULT_SEQ = "1024..32768"
ROOF_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


def split_choices(text: str, what: str, allowed: tuple[str, ...]) -> list[str]:
    """A comma list of choices, lower-cased; a one-line error naming what is not understood."""
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise FlashbenchError(
            f"{what}: {', '.join(bad) or 'nothing'} not understood; expected {', '.join(allowed)}"
        )
    return items


def _warn(message: str) -> None:
    print(f"flashbench: warning: {message}", file=sys.stderr)


# ------------------------------------------------------------------------------------------ roofline


def _resolve_gpu(gpu: str, results: Path | None) -> tuple[Any, dict[str, Any] | None]:
    from flashbench import hardware

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", hardware.UnknownGpuWarning)
        try:
            spec, facts = hardware.resolve(gpu)
        except FlashbenchError:
            if gpu.strip().lower() != "auto" or results is None:
                raise
            spec, facts = _gpu_from_results(results), None
    for w in caught:
        _warn(str(w.message))
    return spec, facts


def _gpu_from_results(results: Path) -> Any:
    """--gpu auto on a machine without NVML: the GPU the results were measured on."""
    from flashbench import hardware
    from flashbench.results import read_rows

    names = {r.gpu for r in read_rows(results) if r.gpu and r.device == "cuda"}
    for name in sorted(names):
        spec = hardware.match_nvml_name(name)
        if spec is not None:
            return spec
    raise FlashbenchError(
        f"--gpu auto: no NVML here and no known GPU in {results} ({', '.join(sorted(names)) or 'no GPU rows'}); "
        "name one with --gpu"
    )


def _families(text: str) -> list[str]:
    from flashbench.models import io_model

    return split_choices(text, "--families", io_model.FAMILIES)


def build_roofline(
    gpu: str = "auto",
    seqs: list[int] | None = None,
    head_dims: tuple[int, ...] = (128,),
    dtypes: tuple[str, ...] = ("bf16",),
    modes: tuple[str, ...] = ("fwd",),
    families: tuple[str, ...] | None = None,
    batch: int = 1,
    heads: int = 16,
    kv_heads: int | None = None,
    causal: bool = False,
    results: Path | None = None,
) -> dict[str, Any]:
    """The roofline report as a JSON-ready dict: GPU, ceilings, per-case predictions, measured overlay."""
    from flashbench import hardware
    from flashbench.cases import DTYPE_BYTES
    from flashbench.models import io_model
    from flashbench.models import roofline as rl
    from flashbench.results import FLOP_CONVENTION

    spec, facts = _resolve_gpu(gpu, results)
    roofs = [r for r in hardware.ceilings(spec, facts, hardware.load_calibration(spec)) if r.bw_bytes_s]
    if not roofs:
        raise FlashbenchError(f"no bandwidth known for {spec.name}: run flashbench calibrate on it")
    roof = roofs[0]
    seqs = seqs or [1024, 2048, 4096, 8192, 16384, 32768]
    families = tuple(families or io_model.FAMILIES)
    kv = kv_heads or heads
    predictions = []
    for dtype in dtypes:
        for mode in modes:
            for d in head_dims:
                for fam in families:
                    for n in seqs:
                        p = rl.predict(
                            fam,
                            batch,
                            heads,
                            kv,
                            n,
                            n,
                            d,
                            dtype,
                            DTYPE_BYTES[dtype],
                            causal,
                            mode,
                            roof.flops_s,
                            roof.bw_bytes_s,
                        )
                        predictions.append({"dtype": dtype, "head_dim": d, "seq": n, **p.to_dict()})
    report: dict[str, Any] = {
        "gpu": {
            "key": spec.key,
            "name": spec.name,
            "derived": spec.derived,
            "note": spec.note,
            "sm_count": spec.sm_count,
            "l2_bytes": spec.l2_bytes,
            "smem_per_sm_bytes": spec.smem_per_sm_bytes,
            "memory_bytes": spec.memory_bytes,
            "sources": spec.sources,
        },
        "nvml": facts,
        "roof_used": roof.source,
        "ceilings": [
            {**c.to_dict(), "ridge": {d: c.ridge(d) for d in ROOF_DTYPES if c.ridge(d)}} for c in roofs
        ],
        "shape": {"batch": batch, "heads": heads, "kv_heads": kv, "causal": causal},
        "flop_convention": FLOP_CONVENTION,
        "predictions": predictions,
        "measured": _overlay(results, roofs) if results is not None else [],
    }
    return report


def _overlay(results: Path, roofs: list[Any]) -> list[dict[str, Any]]:
    """Measured rows against their roofline; points above it are errors, not results."""
    from flashbench.cases import DTYPE_BYTES
    from flashbench.models import io_model
    from flashbench.models import roofline as rl
    from flashbench.results import OK, read_rows

    roof = roofs[0]
    out = []
    for r in read_rows(results):
        if r.status != OK or not r.median_ms or r.device != "cuda" or r.dtype not in DTYPE_BYTES:
            continue
        fam = io_model.family_for_provider(r.provider)
        blocks = io_model.Blocks.from_config(r.kernel_config) or io_model.Blocks()
        args = (
            r.batch,
            r.heads,
            r.kv_heads,
            r.seq_q,
            r.seq_k,
            r.head_dim,
            r.dtype,
            DTYPE_BYTES[r.dtype],
            r.causal,
            r.mode,
        )
        try:
            p = rl.predict(fam, *args, roof.flops_s, roof.bw_bytes_s, blocks)
            # The guard uses the most permissive roof: the highest peak and bandwidth among all sources.
            peak = max((c.peak(p.compute_dtype) or 0.0 for c in roofs), default=0.0) or None
            bw = max(c.bw_bytes_s for c in roofs)
            guard = rl.min_time_s(p.flops, p.compulsory.bytes, peak, bw)
            a = rl.assess(r.median_ms * 1e-3, p, guard_min_time_s=guard)
        except ValueError as exc:
            out.append({"key": r.key, "provider": r.provider, "valid": False, "error": f"model: {exc}"})
            continue
        entry: dict[str, Any] = {
            "key": r.key,
            "provider": r.provider,
            "family": fam,
            "seq_q": r.seq_q,
            "seq_k": r.seq_k,
            "head_dim": r.head_dim,
            "dtype": r.dtype,
            "causal": r.causal,
            "mode": r.mode,
            "median_ms": r.median_ms,
            "throttled": r.throttled,
            "bound": a.bound,
            "valid": a.valid,
            "error": a.error,
            "achieved_tflops": a.achieved_flops_s / 1e12 if a.valid else None,
            "pct_of_roofline": a.pct_of_roofline if a.valid else None,
            "pct_of_family_no_l2_bound": a.pct_of_family_bound if a.valid else None,
            "model_bytes": p.model.bytes,
            "ncu_bytes": (r.ncu_dram_read_bytes or 0) + (r.ncu_dram_write_bytes or 0) or None,
        }
        out.append(entry)
    return out


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def render_roofline(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    gpu = report["gpu"]
    title = f"{gpu['name']}" + (" (derived from NVML)" if gpu["derived"] else "")
    t = Table(title=f"Ceilings: {title} (TF/s = dense TFLOP/s; ridge in FLOP/byte)")
    t.add_column("source")
    t.add_column("TB/s", justify="right")
    for d in ROOF_DTYPES:
        t.add_column(f"{d} TF/s (ridge)", justify="right")
    for c in report["ceilings"]:
        cells = [c["source"], _fmt(c["bw_bytes_s"] and c["bw_bytes_s"] / 1e12)]
        for d in ROOF_DTYPES:
            peak = c["flops_s"].get(d)
            cells.append("-" if not peak else f"{peak / 1e12:.1f} ({c['ridge'][d]:.0f})")
        t.add_row(*cells)
    console.print(t)
    for c in report["ceilings"]:
        if c["note"]:
            console.print(f"  {c['source']}: {c['note']}", style="dim")
    shape = report["shape"]
    console.print(
        f"Cases: batch {shape['batch']}, heads {shape['heads']} (kv {shape['kv_heads']}), "
        f"{'causal' if shape['causal'] else 'full'}; roof: {report['roof_used']}. FLOPs: {report['flop_convention']}",
        style="dim",
    )
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for e in report["predictions"]:
        groups.setdefault((e["dtype"], e["mode"], e["head_dim"]), []).append(e)
    for (dtype, mode, d), entries in groups.items():
        p = Table(title=f"{dtype} {mode}, head dim {d}: intensity (FLOP/B), bound, minimum time")
        for col in (
            "family (matmul)",
            "N",
            "AI floor",
            "AI model",
            "AI no-L2",
            "bound",
            "min ms",
            "no-L2 ms",
        ):
            p.add_column(col, justify="left" if col in ("family (matmul)", "bound") else "right")
        for e in entries:
            p.add_row(
                f"{e['family']} ({e['compute_dtype']})",
                str(e["seq"]),
                f"{e['compulsory']['ai']:.0f}",
                f"{e['model']['ai']:.1f}",
                f"{e['no_l2']['ai']:.1f}",
                e["model"]["bound"],
                f"{e['model']['min_time_s'] * 1e3:.3g}",
                f"{e['no_l2']['min_time_s'] * 1e3:.3g}",
            )
        console.print(p)
    console.print(
        "AI floor: compulsory traffic (inputs read once, outputs written once), the best any exact attention can do; "
        "AI model: the family's own traffic with L2 reuse; AI no-L2: with none.",
        style="dim",
    )
    if report["measured"]:
        m = Table(title="Measured against the roofline")
        for col in ("provider", "case", "ms", "TFLOP/s", "% of roofline", "bound", "note"):
            m.add_column(col)
        for e in report["measured"]:
            case = (
                f"{e.get('dtype', '')} {e.get('mode', '')} N={e.get('seq_q', '')} d={e.get('head_dim', '')}"
            )
            if not e["valid"]:
                m.add_row(
                    e["provider"],
                    case,
                    _fmt(e.get("median_ms"), ".4g"),
                    "-",
                    "-",
                    "-",
                    f"[red]ERROR: {e['error']}",
                )
                continue
            note = "throttled" if e["throttled"] else ""
            m.add_row(
                e["provider"],
                case,
                f"{e['median_ms']:.4g}",
                f"{e['achieved_tflops']:.1f}",
                f"{e['pct_of_roofline']:.1f}%",
                e["bound"],
                note,
            )
        console.print(m)


def roofline(
    gpu: Annotated[
        str, typer.Option(help="GPU: a name from configs/gpus.toml (h100, a100, l40s...) or 'auto' (NVML).")
    ] = "auto",
    seq: Annotated[
        str, typer.Option(help="Sequence lengths (tokens): 512..32768, 1024..8192:1024 or 1000,3000.")
    ] = DEFAULT_SEQ,
    head_dim: Annotated[str, typer.Option(help="Head dimensions, e.g. 64,128.")] = "128",
    dtype: Annotated[str, typer.Option(help="Input dtypes: fp16, bf16, fp32 (comma list).")] = "bf16",
    mode: Annotated[str, typer.Option(help="fwd, bwd, fwd+bwd (comma list).")] = "fwd",
    families: Annotated[
        str, typer.Option(help="Byte-model families: naive, sdpa-math, flash, stored-p, flash-v1.")
    ] = "naive,sdpa-math,flash,stored-p,flash-v1",
    batch: Annotated[int, typer.Option(help="Batch size of the modelled cases.")] = 1,
    heads: Annotated[int, typer.Option(help="Query heads of the modelled cases.")] = 16,
    kv_heads: Annotated[int | None, typer.Option(help="K/V heads (GQA); default = heads.")] = None,
    causal: Annotated[
        bool, typer.Option("--causal", help="Model causal attention (exact unmasked-pair FLOPs).")
    ] = False,
    results: Annotated[
        Path | None, typer.Option(help="Run directory whose measured rows to overlay.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Ceilings, ridge points and per-family intensity / bound / minimum time; overlay measured rows. No GPU needed."""
    from flashbench.cases import DTYPES, MODES
    from flashbench.config import parse_range

    report = build_roofline(
        gpu=gpu,
        seqs=parse_range(seq, "--seq"),
        head_dims=tuple(parse_range(head_dim, "--head-dim")),
        dtypes=tuple(split_choices(dtype, "--dtype", DTYPES)),
        modes=tuple(split_choices(mode, "--mode", MODES)),
        families=tuple(_families(families)),
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        causal=causal,
        results=results,
    )
    if as_json:
        print(json.dumps(report, indent=2, default=str))
    else:
        render_roofline(report)


def calibrate_cmd(
    device: Annotated[int, typer.Option(help="CUDA device index.")] = 0,
    n: Annotated[int, typer.Option(help="Matmul size n (n x n x n, 2 n^3 FLOPs).")] = 8192,
    copy_mib: Annotated[int, typer.Option(help="Copy buffer size in MiB (much larger than L2).")] = 1024,
    seconds: Annotated[float, typer.Option(help="Target GPU time per measurement, seconds.")] = 0.5,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON on stdout.")] = False,
) -> None:
    """Measure this GPU's copy bandwidth and matmul TFLOP/s; store them as the 'measured' ceiling. Exit 3 without a GPU."""
    from flashbench.calibrate import calibrate

    record = calibrate(index=device, n=n, copy_bytes=copy_mib << 20, seconds=seconds)
    if as_json:
        print(json.dumps(record, indent=2, default=str))
        return
    print(f"{record['gpu']}: copy {record['copy_bw_gb_s']:.0f} GB/s (read + write)")
    for d, r in record["details"]["matmul"].items():
        print(
            f"  {d:5s} " + (f"{r['tflops']:.1f} TFLOP/s" if "tflops" in r else f"not measured: {r['error']}")
        )
    if record["throttled"]:
        _warn("the GPU reported a throttling clock-event reason during calibration; re-run when idle")
    print(f"stored: {record.get('path')}")


def register(app: typer.Typer) -> None:
    app.command("roofline")(roofline)
    app.command("calibrate")(calibrate_cmd)
