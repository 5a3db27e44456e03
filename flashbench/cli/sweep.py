"""`flashbench sweep`: parse, one library call, render (`list` and `env` are in cli/listing.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from flashbench.cli.render import render_tables
from flashbench.errors import plural


def sweep_command(
    seq: Annotated[
        str | None, typer.Option(help="sequence lengths N (tokens): 512..32768, 1024..8192:1024, 1000,3000")
    ] = None,
    seq_q: Annotated[
        str | None,
        typer.Option(
            "--seq-q", help="query tokens per sequence (decode: 1); default = --seq, the training shape"
        ),
    ] = None,
    kv_layout: Annotated[
        str | None, typer.Option("--kv-layout", help="KV cache: contiguous | paged | contiguous,paged")
    ] = None,
    page_size: Annotated[
        str | None,
        typer.Option("--page-size", help="tokens per page of a paged KV cache (powers of two; 16)"),
    ] = None,
    seqlens: Annotated[
        str | None,
        typer.Option(help="KV lengths per sequence: uniform (all N) | random (ragged, drawn in [N/2, N])"),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="the draw of --seqlens random (default 0)")] = None,
    window: Annotated[
        str | None,
        typer.Option(
            help="sliding window L,R in keys before,after each query (-1: no limit; causal: R = 0), e.g. 4096,0; "
            "several: '-1,-1;4096,0' (-1,-1 = none)"
        ),
    ] = None,
    batch: Annotated[str | None, typer.Option(help="batch sizes (instead of --tokens)")] = None,
    tokens: Annotated[int | None, typer.Option(help="tokens per batch: batch = max(1, T // N)")] = None,
    heads: Annotated[str | None, typer.Option(help="query heads")] = None,
    hidden: Annotated[
        int | None,
        typer.Option(help="model width: heads = hidden // head_dim per head dim (instead of --heads)"),
    ] = None,
    kv_heads: Annotated[
        str | None, typer.Option("--kv-heads", help="key/value heads (GQA); default = heads")
    ] = None,
    head_dim: Annotated[str | None, typer.Option("--head-dim", help="head dimensions d, e.g. 64,128")] = None,
    dtype: Annotated[
        str | None, typer.Option(help="fp16,bf16,fp32,fp8 (fp8: float8_e4m3fn inputs, forward only)")
    ] = None,
    causal: Annotated[str | None, typer.Option(help="true | false | both (a bare --causal: true)")] = None,
    mode: Annotated[str | None, typer.Option(help="fwd,bwd,fwd+bwd")] = None,
    providers: Annotated[
        str | None, typer.Option(help="comma list, or 'all' (see `flashbench list providers`)")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="a sweep TOML file; flags override it")] = None,
    preset: Annotated[
        str | None, typer.Option(help="a preset from configs/sweeps (`flashbench list presets`)")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="run directory (default results/<YYYYmmdd-HHMMSS>-<preset>/)")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="skip finished cases, retry crash/timeout")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="start over in a non-empty run directory")] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="print the rows as JSON on stdout (no table)")
    ] = False,
    cuda_graph: Annotated[
        bool | None, typer.Option("--cuda-graph/--no-cuda-graph", help="time CUDA-graph replays")
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="cuda | cpu (cpu: Triton interpreter, CPU times)")
    ] = None,
    order: Annotated[
        str | None,
        typer.Option(
            help="provider (each provider's cases together) | case (per shape, all providers back to back)"
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="per-case timeout in seconds, compile included")
    ] = None,
    kernel: Annotated[
        list[Path] | None, typer.Option(help="a Python file registering providers (repeatable)")
    ] = None,
    ncu: Annotated[
        bool | None, typer.Option("--ncu/--no-ncu", help="also record DRAM bytes with Nsight Compute")
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="run slice i of n (1-based, e.g. 2/4), split by shape; combine with `flashbench merge`"
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="all | 0,1: one worker per GPU, shapes spread over them (--device cpu: N CPU workers)"
        ),
    ] = None,
) -> None:
    """Measure attention providers over a sweep of shapes; rows go to <out>/rows.jsonl as each case ends."""
    from flashbench.api import sweep

    result = sweep(
        preset=preset,
        config=config,
        seq=seq,
        seq_q=seq_q,
        kv_layout=kv_layout,
        page_size=page_size,
        seqlens=seqlens,
        seed=seed,
        window=window,
        batch=batch,
        tokens=tokens,
        heads=heads,
        hidden=hidden,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        causal=causal,
        mode=mode,
        providers=providers,
        device=device,
        order=order,
        timeout=timeout,
        cuda_graph=cuda_graph,
        ncu=ncu,
        kernels=[str(k) for k in kernel] if kernel else None,
        out=out,
        resume=resume,
        force=force,
        progress=True,
        shard=shard,
        gpus=gpus,
    )
    if json_out:
        payload = {
            "run_dir": str(result.run_dir),
            "wall_s": round(result.wall_s, 3),
            "counts": result.counts(),
            "rows": [r.to_dict() for r in result.rows],
        }
        sys.stdout.write(json.dumps(payload, default=str) + "\n")
        _say_if_unread(f"{plural(len(result.rows), 'case')} in {result.wall_s:.1f} s", result.run_dir)
        return
    render_tables(result.rows, tokens=result.spec.tokens)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(result.counts().items()))
    summary = f"{plural(len(result.rows), 'case')} ({counts}) in {result.wall_s:.1f} s"
    print(f"{summary}; rows in {result.run_dir}/rows.jsonl")
    _say_if_unread(summary, result.run_dir)


def _say_if_unread(summary: str, run_dir: Path) -> None:
    """Where stdout's reader left early (`| head`, cli.app.ReaderSafe), say on stderr that the sweep did not stop."""
    if getattr(sys.stdout, "lost", False):
        print(
            f"flashbench: stdout closed early; the sweep ran to its end: {summary}; rows in {run_dir}/rows.jsonl",
            file=sys.stderr,
        )


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_command)
