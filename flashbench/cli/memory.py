"""`flashbench memory`: what attention costs in memory for a model preset, standard against flash.

Needs no GPU (it reads configs/models.toml); `--gpu` names a GPU of configs/gpus.toml to check the totals
against its memory. build_memory is the library call behind the command.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from flashbench.cli.roofline import split_choices
from flashbench.errors import FlashbenchError


def _model_presets() -> dict[str, Any]:
    from flashbench.configfiles import config_path, read_toml

    return read_toml(config_path("models.toml"))


def build_memory(
    model: str,
    seqs: list[int],
    dtype: str = "fp16",
    batch: int = 1,
    checkpointing: bool = False,
    check_docs: bool = False,
    gpu: str = "a100",
) -> dict[str, Any]:
    """The memory planner's figures per sequence length, and optionally the documents' claims recomputed."""
    import difflib

    from flashbench.cases import DTYPE_BYTES
    from flashbench.models import memory

    presets = _model_presets()
    key = model.strip().lower()
    cfg = presets.get(key) or next((c for c in presets.values() if key in c.get("aliases", [])), None)
    if cfg is None:
        close = difflib.get_close_matches(key, list(presets), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise FlashbenchError(f"unknown model {model!r}{hint} (known: {', '.join(presets)})")
    shape = {k: cfg[k] for k in ("layers", "heads", "kv_heads", "head_dim", "hidden")}
    rows = []
    for n in seqs:
        plan = memory.plan_model_memory(
            **shape, seq=n, elem_bytes=DTYPE_BYTES[dtype], batch=batch, checkpointing=checkpointing
        )
        rows.append({"seq": n, **plan})
    out: dict[str, Any] = {
        "model": key,
        "name": cfg.get("name", key),
        "source": cfg.get("source", ""),
        **shape,
        "dtype": dtype,
        "batch": batch,
        "checkpointing": checkpointing,
        "rows": rows,
    }
    if check_docs:
        from flashbench import hardware
        from flashbench.models import roofline as rl

        spec = hardware.lookup(gpu)
        peak = spec.peak_flops("fp16")
        if not peak or not spec.bw_bytes_s:
            raise FlashbenchError(f"{spec.name} has no fp16 peak or bandwidth in configs/gpus.toml")
        out["document_checks"] = rl.document_checks(peak, spec.bw_bytes_s, spec.name)
    return out


def _bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:.0f} B"


def render_memory(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    ck = "with activation checkpointing" if report["checkpointing"] else "no activation checkpointing"
    t = Table(
        title=(
            f"{report['name']}: {report['layers']} layers x {report['heads']} heads (kv {report['kv_heads']}), "
            f"d {report['head_dim']}, {report['dtype']}, batch {report['batch']}, {ck}"
        )
    )
    for col in (
        "N",
        "S or P per head",
        "per layer",
        "per model",
        "PyTorch eager keeps (model)",
        "m, l per head (fp32)",
        "LSE per model (FA2)",
    ):
        t.add_column(col, justify="right")
    for r in report["rows"]:
        t.add_row(
            f"{r['seq']:,}",
            _bytes(r["standard_per_head"]),
            _bytes(r["standard_per_layer"]),
            _bytes(r["standard_per_model"]),
            _bytes(r["eager_per_model"]),
            _bytes(r["flash_ml_per_head"]),
            _bytes(r["flash_lse_per_model"]),
        )
    console.print(t)
    console.print(
        "standard = one N x N matrix per head and layer kept for the backward (the documents' count); "
        "PyTorch eager keeps fp32 P and its downcast ((4 + e) bytes per element); "
        "checkpointing keeps one layer's state plus each layer's input.",
        style="dim",
    )
    checks = report.get("document_checks")
    if checks:
        c = Table(title="The source documents' numbers, recomputed")
        for col in ("doc", "claim", "recomputed", "verdict"):
            c.add_column(col)
        for e in checks:
            style = "green" if e["verdict"] == "right" else "red"
            c.add_row(e["source"], e["claim"], e["recomputed"], f"[{style}]{e['verdict']}")
        console.print(c)


def memory_cmd(
    model: Annotated[
        str,
        typer.Option(help="Model preset from configs/models.toml: gpt2, llama-7b, llama3-8b, llama-70b..."),
    ] = "llama-70b",
    seq: Annotated[
        str, typer.Option(help="Sequence lengths (tokens), e.g. 131072 or 2048..131072.")
    ] = "131072",
    dtype: Annotated[
        str, typer.Option(help="Element type of the attention matrices: fp16, bf16, fp32.")
    ] = "fp16",
    batch: Annotated[int, typer.Option(help="Sequences per batch.")] = 1,
    checkpointing: Annotated[
        bool,
        typer.Option("--checkpointing", help="Activation checkpointing: one layer's state alive at a time."),
    ] = False,
    check_docs: Annotated[
        bool, typer.Option("--check-docs", help="Recompute the source documents' worked numbers.")
    ] = False,
    gpu: Annotated[
        str, typer.Option(help="GPU for --check-docs' speedup check (003 used an A100).")
    ] = "a100",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """Attention memory per head, layer and model: standard attention's N x N matrices vs FlashAttention's statistics."""
    from flashbench.cases import DTYPES
    from flashbench.config import parse_range

    report = build_memory(
        model,
        parse_range(seq, "--seq"),
        dtype=split_choices(dtype, "--dtype", DTYPES)[0],
        batch=batch,
        checkpointing=checkpointing,
        check_docs=check_docs,
        gpu=gpu,
    )
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        render_memory(report)


# ------------------------------------------------------------------------------------------ calibrate


def register(app: typer.Typer) -> None:
    app.command("memory")(memory_cmd)
