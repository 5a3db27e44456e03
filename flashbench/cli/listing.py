"""`flashbench list providers|presets|gpus` and `flashbench env`: parse, one library call, render.

The providers table fits 80 columns (render.word_table: a cell wraps between words, never inside one), the
features are one column of words, and why a provider is unavailable is a line under the table rather than a
cell (a reason of 60 characters in a cell 5 wide ran over 15 lines).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flashbench.cli.render import console as make_console
from flashbench.cli.render import word_table
from flashbench.providers.registry import ProviderInfo

list_app = typer.Typer(help="List providers, sweep presets or GPUs.", no_args_is_help=True)

BUILT_IN = ("builtin", "bundled")


@list_app.command("providers")
def list_providers_command(
    device: Annotated[str | None, typer.Option(help="cuda | cpu (default: cuda if a GPU is present)")] = None,
    kernel: Annotated[
        list[Path] | None, typer.Option(help="also load a user kernel file (repeatable)")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the providers as JSON (no table)")] = False,
) -> None:
    """Every provider, what it supports, and whether it is available here (and why not)."""
    from flashbench.api import list_providers

    infos = list_providers(device, [str(k) for k in kernel] if kernel else ())
    if json_out:
        print(json.dumps([i.to_dict() for i in infos]))
        return
    render_providers(infos)


def render_providers(infos: list[ProviderInfo]) -> None:
    """The providers table, then one wrapped line per unavailable provider saying why."""
    from rich.markup import escape
    from rich.table import Table

    console = make_console()
    user_files = any(i.source not in BUILT_IN for i in infos)
    headers = ["name", "usable here", "dtypes", "head dims", "takes", "KV cache", "devices"]
    rows = [
        [
            i.name,
            "yes" if i.available else "no",
            " ".join(i.dtypes),
            "any" if i.head_dims is None else _dims(i.head_dims),
            _takes(i),
            " ".join(i.kv_layouts) + (" ragged" if i.ragged else ""),
            " ".join(i.devices),
        ]
        + ([i.source if i.source in BUILT_IN else Path(i.source).name] if user_files else [])
        for i in infos
    ]
    if user_files:  # bundled vs builtin says little; which file a provider came from is worth a column
        headers.append("source")
    table = word_table("providers", headers, [[escape(cell) for cell in row] for row in rows], console.width)
    console.print(table)
    missing = [i for i in infos if not i.available]
    if missing:
        why = Table.grid(padding=(0, 2))
        why.add_column(no_wrap=True)
        why.add_column(overflow="fold")
        for i in missing:
            why.add_row(i.name, escape(i.reason or "unavailable"))  # "[Errno 2]" is text, not markup
        console.print("Not available here:")
        console.print(why)


def _takes(info: ProviderInfo) -> str:
    features = (
        ("causal", info.causal),
        ("window", info.window),
        ("bwd", info.backward),
        ("GQA", info.gqa),
        ("MLA", info.latent == "also"),  # MLA cases (--head-dim-v) beside the ordinary ones
        ("MLA-only", info.latent == "only"),
    )
    return " ".join(word for word, ok in features if ok) or "-"


def _dims(dims: tuple[int, ...]) -> str:
    if len(dims) > 6 and all(b - a == dims[1] - dims[0] for a, b in zip(dims, dims[1:], strict=False)):
        return f"{dims[0]}..{dims[-1]}:{dims[1] - dims[0]}"
    return " ".join(str(d) for d in dims)


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
    app.add_typer(list_app, name="list")
    app.command("env")(env_command)
