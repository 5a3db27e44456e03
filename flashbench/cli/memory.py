"""`flashbench memory`: what attention costs in memory for a model preset, standard against flash.

Needs no GPU (it reads configs/models.toml); the library call is flashbench.analysis.memory_plan.build_memory.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from flashbench.analysis.memory_plan import build_memory
from flashbench.errors import FlashbenchError, plural
from flashbench.spec.cases import DTYPES
from flashbench.spec.parse import parse_range, split_choices


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
    kv = Table(
        title=(
            f"KV cache for serving: {plural(report['batch'], 'sequence')} x N tokens, {report['layers']} layers x "
            f"{report['kv_heads']} KV heads x d {report['head_dim']}, {report['dtype']}"
        )
    )
    for col in ("N", "contiguous", f"paged ({report['page_size']}-token pages)", "of which unused"):
        kv.add_column(col, justify="right")
    for r in report["rows"]:
        kv.add_row(
            f"{r['seq']:,}",
            _bytes(r["kv_cache_contiguous"]),
            _bytes(r["kv_cache_paged"]),
            _bytes(r["kv_cache_paged_unused"]),
        )
    console.print(kv)
    console.print(
        "KV cache = 2 (K, V) x layers x KV heads x d x bytes per token; paged: every sequence's last page is "
        "half empty on average ((page - 1) / 2 unused tokens).",
        style="dim",
    )
    console.print(
        "standard = one N x N matrix per head and layer kept for the backward (the documents' count); "
        "PyTorch eager keeps fp32 P and its downcast ((4 + e) bytes per element); "
        "checkpointing keeps one layer's state plus each layer's input.",
        style="dim",
    )


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
    page_size: Annotated[
        int, typer.Option("--page-size", help="Tokens per page of a paged KV cache (a power of two).")
    ] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """Attention memory per head, layer and model (standard N x N matrices vs FlashAttention's statistics) and the
    KV cache a serving engine holds for --batch sequences of N tokens (contiguous and paged)."""
    report = build_memory(
        model,
        parse_range(seq, "--seq"),
        dtype=split_choices(dtype, "--dtype", DTYPES)[0],
        batch=batch,
        checkpointing=checkpointing,
        page_size=_page_size(page_size),
    )
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        render_memory(report)


def _page_size(value: int) -> int:
    if value < 1 or value & (value - 1):
        raise FlashbenchError(f"--page-size: {value} is not a power of two (e.g. 16, 64, 256)")
    return value


def register(app: typer.Typer) -> None:
    app.command("memory")(memory_cmd)
