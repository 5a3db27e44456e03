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
import functools
import inspect
import operator
import os
import sys
import time
import types
import typing
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import flashbench
from flashbench.engine import parallel, precompile, runner
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
from flashbench.spec.config import SPEC_OPTIONS, SPEC_TYPES, SweepSpec, load_spec
from flashbench.spec.options import RUN_OPTIONS, Option
from flashbench.spec.parse import parse_device
from flashbench.spec.plan import PlannedCase, check_defined, plan, resolve_providers
from flashbench.spec.resume import check_resumable, check_same_gpu, check_same_sweep, stored_spec

if TYPE_CHECKING:
    import pandas as pd


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


def _takes(option: Option) -> Any:
    """What a keyword takes: the CLI's text, or the Python value of the field (a sequence for a tuple field)."""
    if option.cli is bool:
        return bool if option.default is not None else bool | None
    hint = SPEC_TYPES.get(option.field or "", option.cli)
    kinds: list[Any] = [str]
    for kind in typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,):
        if typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            kinds += [item, typing.cast(Any, Sequence)[item]]
        elif kind is not type(None):
            kinds.append(kind)
    return functools.reduce(operator.or_, dict.fromkeys(kinds)) | None


def sweep(**options: Any) -> SweepResult:
    """Plan and run a sweep; rows are appended to `out`/rows.jsonl as each case ends (see module docstring).

    The keywords are the sweep's options (spec/config.py, the same as `flashbench sweep`'s flags; the signature
    lists them): the spec's, each None for "the preset's value", and the run's (preset, config, out, resume,
    force, progress, shard, gpus). `shard="i/n"` (1-based) runs one slice of the planned cases
    (flashbench.engine.shard: by shape); `gpus="all"` or "0,1" runs one worker per device, each on its share of
    the shapes (with device="cpu": that many CPU workers).
    Raises FlashbenchError (exit_code 2 for bad input, 3 when device="cuda" finds no GPU).
    """
    started = time.monotonic()
    run = {o.name: options.pop(o.name, o.default) for o in RUN_OPTIONS}
    out, resume, force = run["out"], run["resume"], run["force"]
    if resume and force:
        raise FlashbenchError(
            "--resume and --force exclude each other: --resume continues the run in --out, --force starts it over"
        )
    if resume:
        check_resumable(out)
    shard = shards.parse_shard(run["shard"])
    if options.get("kernels"):
        given = options["kernels"]
        options["kernels"] = check_paths(
            [str(k) for k in ([given] if isinstance(given, (str, Path)) else given)]
        )
    spec = resolve_spec(preset=run["preset"], config=run["config"], out=out, resume=resume, overrides=options)
    check_defined(spec)
    kernels = check_paths(list(spec.kernels)) if spec.kernels else ()
    builtin.load()
    if not kernels:  # user files' names are known only once a worker loaded them
        resolve_providers(spec.providers, registry.names())
    run_dir = Path(out) if out is not None else default_run_dir(spec)
    if resume and (run_dir / ENV_FILE).is_file():  # a resumed shard stays the same shard
        shard = _same_shard(run_dir, shard)
    if run_dir.is_dir() and any(run_dir.iterdir()) and not (resume or force):
        raise FlashbenchError(
            f"run directory {run_dir} is not empty: add --resume to continue it or --force to start over"
        )
    check_writable_dir(run_dir, "--out")  # before the worker's start-up, not after it
    if spec.device == "cuda" and not environment.gpu_present()[0]:
        raise FlashbenchError(
            "no NVIDIA GPU found (NVML and nvidia-smi see none); use --device cpu to run on the CPU",
            exit_code=EXIT_NO_GPU,
        )
    devices = shards.parse_gpus(run["gpus"], spec.device, _gpu_count(run["gpus"], spec.device))
    session = _Session(spec, kernels, run_dir, shard, devices, resume, force, bool(run["progress"]), started)
    return session.run()


# The keywords, made from the options (spec/config.py): help(flashbench.sweep) lists each with its help.
sweep.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=_takes(o))
        for o in (*SPEC_OPTIONS, *RUN_OPTIONS)
    ],
    return_annotation=SweepResult,
)
sweep.__doc__ = f"{sweep.__doc__}\n    Keywords:\n" + "\n".join(
    f"        {o.name}: {o.help}" for o in (*SPEC_OPTIONS, *RUN_OPTIONS)
)


def _same_shard(run_dir: Path, asked: tuple[int, int] | None) -> tuple[int, int] | None:
    """The shard a resumed run continues: the one it was started as (another one asked for is refused)."""
    stored = shards.parse_shard(read_env(run_dir).shard)
    if asked is None:
        return stored
    if stored is not None and stored != asked:
        raise FlashbenchError(
            f"{run_dir} is shard {shards.format_shard(stored)}; cannot resume it as "
            f"--shard {shards.format_shard(asked)}"
        )
    return asked


@dataclass
class _Session:
    """One sweep session once its input is checked: start a worker, plan, write env.json, run, finish."""

    spec: SweepSpec
    kernels: tuple[str, ...]
    run_dir: Path
    shard: tuple[int, int] | None
    devices: list[str] | None
    resume: bool
    force: bool
    progress: bool
    started: float
    env: Environment | None = None
    earlier_wall: float = 0.0  # a resumed run's earlier sessions (kill -9 loses a session's wall time)

    def run(self) -> SweepResult:
        spec, devices = self.spec, self.devices
        show: Progress | None = None
        worker: runner.Worker | None  # None once run_cases has closed it
        step: precompile.Step | None = None
        first = devices[0] if devices else None
        worker = runner.Worker(spec.device, self.kernels, None, visible=first)
        # The other GPUs' workers and the compile-once step's record process start now too: their start-ups
        # (imports, CUDA contexts) overlap the first worker's and the planning.
        others = [runner.Worker(spec.device, self.kernels, None, visible=d) for d in (devices or [])[1:]]
        begun = precompile.begin(spec.device, self.kernels, first)
        try:
            worker.wait_ready()
            infos = {d["name"]: ProviderInfo.from_dict(d) for d in worker.providers}
            facts = worker.facts
            memory = facts.get("total_memory_bytes") if spec.device == "cuda" else _host_memory_bytes()
            planned = plan(spec, infos, memory)
            names = resolve_providers(spec.providers, list(infos))
            sweep_planned = len(planned)
            if self.shard is not None:
                planned = shards.select(planned, self.shard, settings=spec.to_dict())
            previous = (
                read_env(self.run_dir) if self.resume else None
            )  # check_resumable: resume has an env.json
            if previous is not None:
                check_same_gpu(self.run_dir, previous, str(facts.get("gpu", "")))
                done = runner.finished_rows(self.run_dir)
                if previous.finished and all(p.case.key in done for p in planned):
                    # nothing would run: leave the finished run as it is, env.json included
                    _note(
                        f"flashbench: {self.run_dir} is finished; nothing to resume, nothing written",
                        self.progress,
                    )
                    rows = [done[p.case.key] for p in planned]
                    begun.stop()
                    return SweepResult(self.run_dir, spec, rows, time.monotonic() - self.started, previous)
            runner.prepare_run_dir(self.run_dir, self.resume, self.force)
            self._write_env(facts, names, len(planned), sweep_planned, previous)
            ncu = self._ncu()
            step = self._precompile(planned, infos, begun)
            show = Progress(len(planned), enabled=self.progress)
            run: dict[str, Any] = dict(
                device=spec.device,
                kernels=self.kernels,
                opts=runner.options(spec),
                timeout_s=spec.timeout_s,
                worker=worker,
                gpu=str(facts.get("gpu", "")),
                on_row=show.advance,
                ncu=ncu,
                ready=step.ready,  # cases whose builds are still compiling wait their turn (runner.Deal)
            )
            # the step's record runs on the first GPU: that GPU's worker starts once it is done, the others at once
            if devices:
                rows = parallel.run_parallel(
                    planned, self.run_dir, devices=devices, others=others, first_after=step.recorded, **run
                )
            else:
                while not step.recorded.wait(0.2):  # a timed wait keeps Ctrl-C deliverable
                    pass
                rows = runner.run_cases(planned, self.run_dir, **run)
            worker = None  # run_cases closed it
        except BaseException as exc:
            begun.stop()  # the sweep stops: so does the step beside it (start() runs `begun`)
            if isinstance(exc, KeyboardInterrupt) and self.env is not None:
                self._record(
                    interrupted=True
                )  # Ctrl-C (or `timeout -s INT`): keep the wall time of this session
            raise
        finally:
            if show is not None:
                show.close()
            for w in [worker, *others]:  # run_cases closes those it ran (closing twice is harmless)
                if w is not None:
                    w.close()
        assert step is not None  # started before any row ran
        self._precompile_done(step.join(), rows)
        compile_s = sum((r.compile_ms or 0.0) for r in rows) / 1e3
        by_worker: dict[str, float] = {}
        for r in rows:
            if r.compile_ms:
                name = "default" if r.gpu_index is None else str(r.gpu_index)
                by_worker[name] = by_worker.get(name, 0.0) + r.compile_ms / 1e3
        finished = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        counts = dict(Counter(r.status for r in rows))
        wall = self._record(
            finished=finished,
            status_counts=counts,
            compile_s_total=round(compile_s, 3),
            compile_s_by_worker={k: round(v, 3) for k, v in sorted(by_worker.items())},
        )
        return SweepResult(self.run_dir, spec, rows, wall, self.env or Environment())

    def _write_env(
        self,
        facts: dict[str, Any],
        names: list[str],
        planned: int,
        sweep_planned: int,
        previous: Environment | None,
    ) -> None:
        """env.json as the session starts: the machine, the spec, what is planned (and a resumed run's past)."""
        spec, devices = self.spec, self.devices
        env = replace(
            environment.collect(spec.device, facts, self.kernels),
            spec=spec.to_dict(),
            preset=spec.name,
            planned_cases=planned,
            run_dir=str(self.run_dir),
            sweep_id=shards.sweep_id(spec.to_dict(), names, flashbench.__version__),
            shard=shards.format_shard(self.shard) if self.shard else None,
            sweep_planned_cases=sweep_planned,
            # a worker pinned by UUID (GPU-..., MIG-...) has no NVML index here: devices_used lists the others
            devices_used=[int(d) for d in devices if d.isdigit()] if devices else None,
        )
        if previous is not None:
            env.previous_runs = [*previous.previous_runs, previous.started]
            if env.calibration is None and previous.gpu == env.gpu:
                # a session on a machine without a stored calibration keeps the run's measured ceiling
                env.calibration = previous.calibration
            self.earlier_wall = float(previous.wall_s_total or previous.wall_s or 0.0)
        self.env = env
        write_env(self.run_dir, env)

    def _record(self, **fields: Any) -> float:
        """env.json with this session's wall time (and `fields`); the wall time."""
        assert self.env is not None  # written as the session started
        wall = time.monotonic() - self.started
        fields.setdefault("interrupted", False)
        total = round(self.earlier_wall + wall, 3)
        self.env = replace(self.env, wall_s=round(wall, 3), wall_s_total=total, **fields)
        write_env(self.run_dir, self.env)
        return wall

    def _precompile(
        self, planned: list[PlannedCase], infos: dict[str, ProviderInfo], begun: precompile.Step
    ) -> precompile.Step:
        """Start compiling once per host (engine/precompile.py), beside the workers, the bundled kernels' builds of
        the cases still to run (`begun`: precompile.begin's step); the running step."""
        done = runner.finished_rows(self.run_dir)
        bundled = {name for name, info in infos.items() if info.source == "bundled"}
        cases = [
            p.case
            for p in planned
            if p.status is None and p.case.key not in done and p.case.provider in bundled
        ]
        visible = self.devices[0] if self.devices else None
        return precompile.start(
            cases,
            device=self.spec.device,
            kernels=self.kernels,
            visible=visible,
            timeout_s=self.spec.timeout_s,
            workers=len(self.devices) if self.devices else 1,
            step=begun,
        )

    def _precompile_done(self, rec: precompile.Record, rows: list[Row]) -> None:
        """The step's record, with the time each worker's first calls waited for a build compiled elsewhere, into
        env.json."""
        if rec.skipped is None:
            for r in rows:
                if r.compile_wait_ms:
                    name = "default" if r.gpu_index is None else str(r.gpu_index)
                    rec.workers_waited_s[name] = rec.workers_waited_s.get(name, 0.0) + r.compile_wait_ms / 1e3
            rec.workers_waited_s = {k: round(v, 3) for k, v in sorted(rec.workers_waited_s.items())}
            _note(
                f"flashbench: compiled {rec.compiled} of {rec.builds} kernel builds ({rec.cases} cases) in "
                f"{rec.wall_s:.1f} s on {rec.jobs} processes beside the workers"
                + (f", {rec.elsewhere} compiled by the workers" if rec.elsewhere else "")
                + (f", {rec.failed} failed" if rec.failed else ""),
                self.progress,
            )
        assert self.env is not None  # written as the session started
        self.env = replace(self.env, precompile=rec.to_dict())
        write_env(self.run_dir, self.env)

    def _ncu(self) -> Any:
        """With --ncu, the per-case Nsight Compute measurement, or None (said why, where it cannot run)."""
        if not self.spec.ncu:
            return None
        from flashbench.engine import ncu as ncu_mod

        if self.spec.device != "cuda":
            _note("flashbench: --ncu needs --device cuda; ignored", self.progress)
        elif self.devices:  # ncu profiles in its own process, not pinned to a worker's GPU
            _note("flashbench: --ncu is not supported with --gpus; ignored", self.progress)
        elif ncu_mod.ncu_path() is None:
            _note("flashbench: ncu (Nsight Compute) not found on PATH; --ncu ignored", self.progress)
        else:
            kernels, timeout_s = self.kernels, self.spec.timeout_s
            return lambda case: ncu_mod.measure(case, kernels, timeout_s)
        return None


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
