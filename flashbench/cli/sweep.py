"""`flashbench sweep`, `flashbench list providers|presets|gpus`, `flashbench env`: parse, one library call, render."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from flashbench.cli.render import console as make_console
from flashbench.cli.render import folding_column, name_column, render_tables


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
    causal: Annotated[str | None, typer.Option(help="true | false | both")] = None,
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
        return
    render_tables(result.rows, tokens=result.spec.tokens)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(result.counts().items()))
    print(
        f"{len(result.rows)} cases ({counts}) in {result.wall_s:.1f} s; rows in {result.run_dir}/rows.jsonl"
    )


list_app = typer.Typer(help="List providers, sweep presets or GPUs.", no_args_is_help=True)


@list_app.command("providers")
def list_providers_command(
    device: Annotated[str | None, typer.Option(help="cuda | cpu (default: cuda if a GPU is present)")] = None,
    kernel: Annotated[
        list[Path] | None, typer.Option(help="also load a user kernel file (repeatable)")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Every provider, what it supports, and whether it is available here (and why not)."""
    from flashbench.api import list_providers

    infos = list_providers(device, [str(k) for k in kernel] if kernel else ())
    if json_out:
        print(json.dumps([i.to_dict() for i in infos]))
        return
    from rich.table import Table

    table = Table(title="providers")
    name_column(table, "name", [i.name for i in infos])
    columns = (
        "available",
        "dtypes",
        "head dims",
        "causal",
        "window",
        "bwd",
        "GQA",
        "KV cache",
        "devices",
        "source",
    )
    for col in columns:
        folding_column(table, col)
    for i in infos:
        dims = "any" if i.head_dims is None else _dims(i.head_dims)
        table.add_row(
            i.name,
            "yes" if i.available else f"no: {i.reason}",
            ",".join(i.dtypes),
            dims,
            _yes(i.causal),
            _yes(i.window),
            _yes(i.backward),
            _yes(i.gqa),
            ",".join(i.kv_layouts) + (",ragged" if i.ragged else ""),
            ",".join(i.devices),
            i.source if i.source in ("builtin", "bundled") else Path(i.source).name,
        )
    make_console().print(table)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _dims(dims: tuple[int, ...]) -> str:
    if len(dims) > 6 and all(b - a == dims[1] - dims[0] for a, b in zip(dims, dims[1:], strict=False)):
        return f"{dims[0]}..{dims[-1]}:{dims[1] - dims[0]}"
    return ",".join(str(d) for d in dims)


@list_app.command("presets")
def list_presets_command() -> None:
    """The sweep presets shipped in configs/sweeps/ (use with --preset NAME)."""
    from flashbench.spec.config import preset_file, preset_names, read_preset

    for name in preset_names():
        values = read_preset(preset_file(name))
        print(f"{name:14s} {values.get('description', '')}")


@list_app.command("gpus")
def list_gpus_command() -> None:
    """GPUs known to flashbench's spec table (where present) and the GPUs on this machine."""
    from flashbench.gpu import environment

    try:
        from flashbench.gpu import hardware  # the spec table (another command group's module)

        for attr in ("list_gpus", "gpu_names", "known_gpus"):
            fn = getattr(hardware, attr, None)
            if callable(fn):
                print("spec table: " + ", ".join(str(g) for g in fn()))
                break
    except ImportError:
        pass
    present, gpus = environment.gpu_present()
    if not present:
        print("this machine: no NVIDIA GPU (NVML and nvidia-smi see none)")
        return
    for i, gpu in enumerate(gpus):
        print(f"this machine: GPU {i}: " + ", ".join(f"{k}={v}" for k, v in gpu.items()))


def env_command(
    device: Annotated[str | None, typer.Option(help="cuda | cpu (default: cuda if a GPU is present)")] = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The environment record: GPUs, driver, CUDA, torch, triton, python, flashbench version, the code's
    fingerprint (a digest of the installed flashbench and its kernels) and git sha."""
    from flashbench.api import environment_record

    record = environment_record(device)
    if json_out:
        print(json.dumps(record.to_dict(), indent=2, default=str))
        return
    keys = ("flashbench", "fingerprint", "git_sha", "git_dirty", "git_diff", "python", "platform", "device")
    for key in (*keys, "gpu", "driver", "cuda", "cudnn", "torch", "triton"):
        print(f"{key:12s} {getattr(record, key)}")
    for i, gpu in enumerate(record.gpus):
        print(f"{'gpu ' + str(i):12s} " + ", ".join(f"{k}={v}" for k, v in gpu.items()))
    if record.worker.get("error"):
        print(f"{'worker':12s} {record.worker['error']}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_command)
    app.add_typer(list_app, name="list")
    app.command("env")(env_command)
