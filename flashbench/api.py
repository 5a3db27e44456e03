"""`flashbench.sweep(...)`: the sweep as a library call (the CLI's `flashbench sweep` is a thin wrapper).

    import flashbench
    result = flashbench.sweep(preset="quick", providers="triton,sdpa-flash", out="results/quick")
    frame = result.frame()          # pandas DataFrame, one row per case
    result = flashbench.sweep(device="cpu", seq="32..128", providers="naive,triton")   # no GPU needed
    result = flashbench.sweep(preset="decode", kv_layout="paged", page_size=64)        # decode over a KV cache

Arguments take the CLI's syntax (strings like "512..32768") or Python values (ints, lists, bools).
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import flashbench
from flashbench.engine import parallel, runner
from flashbench.engine import shard as shards
from flashbench.engine.progress import Progress
from flashbench.errors import EXIT_NO_GPU, FlashbenchError
from flashbench.gpu import environment
from flashbench.providers import builtin, registry
from flashbench.providers.registry import ProviderInfo
from flashbench.providers.user import check_paths
from flashbench.results.env import ENV_FILE, Environment, read_env, write_env
from flashbench.results.paths import check_writable_dir
from flashbench.results.rows import Row, load
from flashbench.spec.config import SweepSpec, load_spec, parse_device
from flashbench.spec.plan import check_defined, plan, resolve_providers
from flashbench.spec.resume import check_resumable, check_same_gpu, check_same_sweep, stored_spec

if TYPE_CHECKING:
    import pandas as pd

# What a sweep argument takes: the CLI's text ("512..32768", "64,128", "bf16,fp16") or Python values.
Ints = str | int | Sequence[int] | None
Choices = str | Sequence[str] | None


@dataclass
class SweepResult:
    run_dir: Path
    spec: SweepSpec
    rows: list[Row]
    wall_s: float
    env: Environment = field(default_factory=Environment)

    def frame(self) -> pd.DataFrame:
        return load(self.run_dir)

    def counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.rows))


def default_run_dir(spec: SweepSpec) -> Path:
    return Path("results") / f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{spec.name}"


def resolve_spec(
    *,
    preset: str | None = None,
    config: str | Path | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    overrides: dict[str, Any] | None = None,
) -> SweepSpec:
    """The spec a sweep would run: built-in defaults <- preset/config <- flags; with --resume the run's stored
    spec, which the flags may only repeat (spec/resume.py: another sweep is refused, exit 2)."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if resume and out is not None and (Path(out) / ENV_FILE).is_file():
        stored = stored_spec(read_env(out), out)
        asked = load_spec(preset=preset, config=config, overrides=overrides, base=stored)
        check_same_sweep(out, stored, asked)
        return asked
    if preset is None and config is None:
        device = overrides.get("device", "cuda")
        preset = "cpu" if str(device).lower() == "cpu" else "default"
    return load_spec(preset=preset, config=config, overrides=overrides)


def sweep(
    *,
    preset: str | None = None,
    config: str | Path | None = None,
    seq: Ints = None,
    seq_q: Ints = None,
    kv_layout: Choices = None,
    page_size: Ints = None,
    seqlens: Choices = None,
    seed: int | None = None,
    window: str | Sequence[Any] | None = None,
    batch: Ints = None,
    tokens: Ints = None,
    heads: Ints = None,
    hidden: Ints = None,
    kv_heads: Ints = None,
    head_dim: Ints = None,
    dtype: Choices = None,
    causal: str | bool | Sequence[bool] | None = None,
    mode: Choices = None,
    providers: Choices = None,
    device: str | None = None,
    order: str | None = None,
    timeout: float | None = None,
    cuda_graph: bool | None = None,
    ncu: bool | None = None,
    kernels: list[str] | tuple[str, ...] | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    progress: bool = False,
    shard: str | tuple[int, int] | None = None,
    gpus: str | list[int] | None = None,
    **measure: Any,
) -> SweepResult:
    """Plan and run a sweep; rows are appended to `out`/rows.jsonl as each case ends (see module docstring).

    `shard="i/n"` (1-based) runs one slice of the planned cases (flashbench.engine.shard: by shape); `gpus="all"` or
    "0,1" runs one worker per device, each on its share of the shapes (with device="cpu": that many CPU
    workers). `measure` may set warmup_ms, rep_ms, min_samples, max_samples, ref_flops_limit.
    Raises FlashbenchError (exit_code 2 for bad input, 3 when device="cuda" finds no GPU).
    """
    started = time.monotonic()
    if resume and force:
        raise FlashbenchError(
            "--resume and --force exclude each other: --resume continues the run in --out, --force starts it over"
        )
    if resume:
        check_resumable(out)
    shard_t = shards.parse_shard(shard)
    overrides = {
        "seq": seq,
        "seq_q": seq_q,
        "kv_layout": kv_layout,
        "page_size": page_size,
        "seqlens": seqlens,
        "seed": seed,
        "window": window,
        "batch": batch,
        "tokens": tokens,
        "heads": heads,
        "hidden": hidden,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "dtype": dtype,
        "causal": causal,
        "mode": mode,
        "providers": providers,
        "device": device,
        "order": order,
        "timeout_s": timeout,
        "cuda_graph": cuda_graph,
        "ncu": ncu,
        "kernels": check_paths(list(kernels)) if kernels else None,
        **measure,
    }
    spec = resolve_spec(preset=preset, config=config, out=out, resume=resume, overrides=overrides)
    check_defined(spec)
    kernels_t = check_paths(list(spec.kernels)) if spec.kernels else ()
    builtin.load()
    if not kernels_t:  # user files' names are known only once a worker loaded them
        resolve_providers(spec.providers, registry.names())
    run_dir = Path(out) if out is not None else default_run_dir(spec)
    if resume and (run_dir / ENV_FILE).is_file():  # a resumed shard stays the same shard
        stored = shards.parse_shard(read_env(run_dir).shard)
        if shard_t is None:
            shard_t = stored
        elif stored is not None and stored != shard_t:
            raise FlashbenchError(
                f"{run_dir} is shard {shards.format_shard(stored)}; cannot resume it as "
                f"--shard {shards.format_shard(shard_t)}"
            )
    if run_dir.is_dir() and any(run_dir.iterdir()) and not (resume or force):
        raise FlashbenchError(
            f"run directory {run_dir} is not empty: add --resume to continue it or --force to start over"
        )
    check_writable_dir(run_dir, "--out")  # before the worker's start-up, not after it
    if spec.device == "cuda":
        present, _ = environment.gpu_present()
        if not present:
            raise FlashbenchError(
                "no NVIDIA GPU found (NVML and nvidia-smi see none); use --device cpu to run on the CPU",
                exit_code=EXIT_NO_GPU,
            )
    devices = shards.parse_gpus(gpus, spec.device, _gpu_count(gpus, spec.device))
    show: Progress | None = None
    env: Environment | None = None
    earlier_wall = 0.0  # a resumed run's earlier sessions (kill -9 loses a session's wall time)
    worker: runner.Worker | None  # None once run_cases has closed it
    worker = runner.Worker(spec.device, kernels_t, None, visible=devices[0] if devices else None)
    try:
        worker.wait_ready()
        infos = {d["name"]: ProviderInfo.from_dict(d) for d in worker.providers}
        facts = worker.facts
        memory = facts.get("total_memory_bytes") if spec.device == "cuda" else _host_memory_bytes()
        planned = plan(spec, infos, memory)
        names = resolve_providers(spec.providers, list(infos))
        sweep_planned = len(planned)
        if shard_t is not None:
            planned = shards.select(planned, shard_t)
        previous = read_env(run_dir) if resume else None  # check_resumable: resume has an env.json
        if previous is not None:
            check_same_gpu(run_dir, previous, str(facts.get("gpu", "")))
            done = runner.finished_rows(run_dir)
            if previous.finished and all(p.case.key in done for p in planned):
                # nothing would run: leave the finished run as it is, env.json included
                _note(f"flashbench: {run_dir} is finished; nothing to resume, nothing written", progress)
                rows = [done[p.case.key] for p in planned]
                return SweepResult(run_dir, spec, rows, time.monotonic() - started, previous)
        runner.prepare_run_dir(run_dir, resume, force)
        env = replace(
            environment.collect(spec.device, facts, kernels_t),
            spec=spec.to_dict(),
            preset=spec.name,
            planned_cases=len(planned),
            run_dir=str(run_dir),
            sweep_id=shards.sweep_id(spec.to_dict(), names, flashbench.__version__),
            shard=shards.format_shard(shard_t) if shard_t else None,
            sweep_planned_cases=sweep_planned,
            devices_used=[int(d) for d in devices] if devices else None,
        )
        if previous is not None:
            env.previous_runs = [*previous.previous_runs, previous.started]
            if env.calibration is None and previous.gpu == env.gpu:
                # a session on a machine without a stored calibration keeps the run's measured ceiling
                env.calibration = previous.calibration
            earlier_wall = float(previous.wall_s_total or previous.wall_s or 0.0)
        write_env(run_dir, env)
        ncu_fn = None
        if spec.ncu:
            from flashbench.engine import ncu as ncu_mod

            if spec.device != "cuda":
                _note("flashbench: --ncu needs --device cuda; ignored", progress)
            elif devices:  # ncu profiles in its own process, not pinned to a worker's GPU
                _note("flashbench: --ncu is not supported with --gpus; ignored", progress)
            elif ncu_mod.ncu_path() is None:
                _note("flashbench: ncu (Nsight Compute) not found on PATH; --ncu ignored", progress)
            else:
                ncu_fn = lambda case: ncu_mod.measure(case, kernels_t, spec.timeout_s)  # noqa: E731
        show = Progress(len(planned), enabled=progress)
        run: dict[str, Any] = dict(
            device=spec.device,
            kernels=kernels_t,
            opts=runner.options(spec),
            timeout_s=spec.timeout_s,
            worker=worker,
            gpu=str(facts.get("gpu", "")),
            on_row=show.advance,
            ncu=ncu_fn,
        )
        if devices:
            rows = parallel.run_parallel(planned, run_dir, devices=devices, **run)
        else:
            rows = runner.run_cases(planned, run_dir, **run)
        worker = None  # run_cases closed it
    except KeyboardInterrupt:
        if env is not None:  # Ctrl-C (or `timeout -s INT`): keep the wall time of this session
            wall = time.monotonic() - started
            env = replace(
                env, interrupted=True, wall_s=round(wall, 3), wall_s_total=round(earlier_wall + wall, 3)
            )
            write_env(run_dir, env)
        raise
    finally:
        if show is not None:
            show.close()
        if worker is not None:
            worker.close()
    wall = time.monotonic() - started
    counts = dict(Counter(r.status for r in rows))
    compile_s = sum((r.compile_ms or 0.0) for r in rows) / 1e3
    env = replace(
        env,
        finished=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        interrupted=False,
        wall_s=round(wall, 3),
        wall_s_total=round(earlier_wall + wall, 3),
        status_counts=counts,
        compile_s_total=round(compile_s, 3),
    )
    write_env(run_dir, env)
    return SweepResult(run_dir, spec, rows, wall, env)


def _gpu_count(gpus: Any, device: str) -> int:
    """How many GPUs NVML (or nvidia-smi) sees, asked only where --gpus needs it."""
    return len(environment.gpu_present()[1]) if gpus is not None and device == "cuda" else 0


def _host_memory_bytes() -> int | None:
    """The host's physical memory: what a CPU sweep's cases must fit in (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _note(message: str, enabled: bool) -> None:
    if enabled:
        print(message, file=sys.stderr, flush=True)


def list_providers(
    device: str | None = None, kernels: list[str] | tuple[str, ...] = ()
) -> list[ProviderInfo]:
    """Every provider with its availability on `device` here (asks a worker; default: cuda if a GPU is present).

    A provider that does not run on that device is unavailable, with the devices it runs on as the reason
    ("cuda only (no GPU here)"): installed is not the same as usable.
    """
    gpu = environment.gpu_present()[0]
    device = parse_device(device) if device is not None else "cuda" if gpu else "cpu"
    worker = runner.describe(device, check_paths(list(kernels)) if kernels else ())
    infos = [ProviderInfo.from_dict(d) for d in worker.providers]
    return [i if not i.available or device in i.devices else _elsewhere(i, device, gpu) for i in infos]


def _elsewhere(info: ProviderInfo, device: str, gpu: bool) -> ProviderInfo:
    why = "no GPU here" if "cuda" in info.devices and not gpu else f"listed for --device {device}"
    reason = f"{' and '.join(info.devices)} only ({why})"
    return ProviderInfo.from_dict({**info.to_dict(), "available": False, "reason": reason})


def environment_record(device: str | None = None) -> Environment:
    """The environment record (what env.json holds), with torch's view from a short-lived worker."""
    if device is None:
        device = "cuda" if environment.gpu_present()[0] else "cpu"
    device = parse_device(device)
    try:
        facts = runner.describe(device, ()).facts
    except FlashbenchError as exc:
        facts = {"error": str(exc)}
    return environment.collect(device, facts)
