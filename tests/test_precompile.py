"""Compile once per host (flashbench/engine/precompile.py): the distinct builds, the compile pool that gives each
build to one process, the autotuner's recording mode, the skip on CPU; and, on a GPU, that a worker's first call
finds every recorded build in the Triton cache."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from flashbench.kernels import autotune, common, flash_v2, launch
from tiers import interpreter_sweep

from flashbench.cli.app import main
from flashbench.engine import build_lock, compile_worker, precompile, runner
from flashbench.results.env import read_env
from flashbench.results.rows import read_rows
from flashbench.spec.cases import Case
from flashbench.spec.plan import PlannedCase

SMALL = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 2, "num_stages": 1}
BIG = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}


def _build(qualname: str, spec: str, module: str = "m") -> dict:
    return {"module": module, "qualname": qualname, "spec": spec}


def test_distinct_keeps_one_build_per_kernel_and_specialization_in_first_met_order():
    recorded = [
        _build("fwd", "s1"),
        _build("fwd", "s2"),
        _build("fwd", "s1"),  # another case, the same build
        _build("bwd", "s1"),  # the same specialization text, another kernel
        _build("fwd", "s1", module="other"),
    ]
    builds = precompile.distinct(recorded)
    assert [(b["module"], b["qualname"], b["spec"]) for b in builds] == [
        ("m", "fwd", "s1"),
        ("m", "fwd", "s2"),
        ("m", "bwd", "s1"),
        ("other", "fwd", "s1"),
    ]
    assert [b["id"] for b in builds] == [0, 1, 2, 3]


def test_skip_reasons_cpu_switch_and_nothing_to_compile(monkeypatch):
    case = Case("triton", 1, 2, 2, 64, 64, 16, "fp16", causal=False, mode="fwd")
    monkeypatch.delenv(precompile.ENV_SWITCH, raising=False)
    assert precompile.skip_reason("cuda", [case]) is None
    assert "interpreter" in (precompile.skip_reason("cpu", [case]) or "")
    assert precompile.skip_reason("cuda", []) == "no case of a bundled kernel to run"
    monkeypatch.setenv(precompile.ENV_SWITCH, "0")
    assert precompile.skip_reason("cuda", [case]) == "FLASHBENCH_PRECOMPILE=0"
    rec = precompile.run([case], device="cuda", kernels=(), visible=None, timeout_s=5)
    assert rec.skipped == "FLASHBENCH_PRECOMPILE=0" and rec.builds == 0 and rec.jobs == 0


def test_jobs_one_per_core_capped_by_builds_or_set(monkeypatch):
    monkeypatch.delenv(precompile.ENV_JOBS, raising=False)
    cores = len(os.sched_getaffinity(0))
    assert precompile.jobs_for(1000) == cores
    assert precompile.jobs_for(1) == 1
    monkeypatch.setenv(precompile.ENV_JOBS, "3")
    assert precompile.jobs_for(1000) == 3 and precompile.jobs_for(2) == 2


# A stand-in for the compile process (the real one needs a GPU): it "compiles" a build by writing its id and its
# own pid to a log, fails the build named "bad", never answers for "hang", and finds "taken" locked by another.
_FAKE = textwrap.dedent(
    """
    import json, os, sys, time
    log = sys.argv[1]
    for line in sys.stdin:
        build = json.loads(line)
        if build["qualname"] == "hang":
            time.sleep(600)
        if build["qualname"] == "taken":
            print(json.dumps({"id": build["id"], "compile_s": 0.0, "error": None, "elsewhere": True}), flush=True)
            continue
        with open(log, "a") as fh:
            fh.write(f"{build['id']} {os.getpid()}\\n")
        time.sleep(0.2)
        error = "PTXASError: boom" if build["qualname"] == "bad" else None
        print(json.dumps({"id": build["id"], "compile_s": 0.2, "error": error}), flush=True)
    """
)


def _pool(tmp_path: Path, names: list[str], jobs: int, timeout_s: float) -> tuple[precompile.Record, list]:
    log = tmp_path / "compiled.log"
    builds = precompile.distinct(_build(name, f"spec-{i}") for i, name in enumerate(names))
    rec = precompile.Record(builds=len(builds), jobs=jobs)

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", _FAKE, str(log)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,
        )

    precompile.compile_pool(builds, jobs, timeout_s, start, rec)
    lines = [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []
    return rec, lines


def test_pool_gives_every_build_to_exactly_one_process_and_runs_them_side_by_side(tmp_path):
    rec, lines = _pool(tmp_path, [f"k{i}" for i in range(8)], jobs=3, timeout_s=30)
    ids = sorted(int(i) for i, _ in lines)
    assert ids == list(range(8))  # each build compiled once
    assert len({pid for _, pid in lines}) == 3  # by three processes
    assert (rec.compiled, rec.failed) == (8, 0)
    assert rec.compile_s_sum == pytest.approx(8 * 0.2)


def test_pool_counts_a_failed_build_and_replaces_a_process_that_hangs(tmp_path):
    rec, lines = _pool(tmp_path, ["bad", "hang", "k2", "k3", "k4", "taken"], jobs=2, timeout_s=3)
    assert sorted(int(i) for i, _ in lines) == [0, 2, 3, 4]  # the hung build never finished; the rest did
    assert (rec.compiled, rec.failed, rec.elsewhere) == (3, 2, 1)
    assert any("PTXASError" in e for e in rec.errors)
    assert any("no answer within 3 s" in e for e in rec.errors)


@pytest.fixture
def _tuning_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("FLASHBENCH_AUTOTUNE_CACHE", raising=False)
    monkeypatch.setenv("FLASHBENCH_AUTOTUNE", "1")
    monkeypatch.setattr(flash_v2, "FWD_SPACE", ((32, 32, 4, 1), (16, 32, 2, 1)))
    monkeypatch.setattr(
        launch, "interpreting", lambda: False
    )  # the kernels still run through the interpreter
    monkeypatch.setattr(launch, "_max_shared_mem", lambda: 232448)
    monkeypatch.setattr(launch, "_device_name", lambda index: "test GPU")
    autotune.forget()
    flash_v2._PLANS.plans.clear()
    yield tmp_path
    autotune.forget()
    flash_v2._PLANS.plans.clear()


def _forward_configs(monkeypatch) -> list[dict]:
    """attention_forward once on a small fp16 input; the configs its launches ran with."""
    ran: list[dict] = []
    real = launch._run_config

    def counting(kernel, grid, args, constexprs, config):
        ran.append(dict(config))
        real(kernel, grid, args, constexprs, config)

    monkeypatch.setattr(launch, "_run_config", counting)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=gen).half() for _ in range(3))
    q, k, v, scale = common.check_inputs("flash_attn", q, k, v, True, None)
    flash_v2.attention_forward(q, k, v, True, scale)
    flash_v2._PLANS.plans.clear()
    return ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="drives the CPU interpreter")
def test_recording_launches_every_autotune_candidate_once_and_times_none(_tuning_home, monkeypatch):
    def no_timing(fns):
        raise AssertionError("recording must not time the candidates")

    monkeypatch.setattr(autotune, "_rotated_ms", no_timing)
    monkeypatch.setattr(launch, "RECORD_ONLY", True)
    assert _forward_configs(monkeypatch) == [BIG, SMALL]  # the space's order, each once
    assert not list(autotune.cache_dir().glob("fwd_v2-*.json"))  # no pick written
    assert autotune._MEMORY == {}  # nor kept


@pytest.mark.skipif(torch.cuda.is_available(), reason="drives the CPU interpreter")
def test_recording_launches_only_the_pick_the_autotune_cache_holds(_tuning_home, monkeypatch):
    monkeypatch.setattr(
        autotune, "_rotated_ms", lambda fns: [[1.0 if fn.args[0] == SMALL else 2.0] * 3 for fn in fns]
    )
    _forward_configs(monkeypatch)  # tunes: SMALL wins, on disk
    autotune.forget()
    monkeypatch.setattr(launch, "RECORD_ONLY", True)
    assert _forward_configs(monkeypatch) == [SMALL]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_first_call_after_precompile_finds_every_build_in_the_triton_cache(tmp_path):
    """record + compile a forward and a backward case into an empty Triton cache, then run the cases' first calls
    in a fresh process: Triton's compilation listener sees only cache hits."""
    cases = [
        Case("triton", 1, 4, 4, 1024, 1024, 64, "bf16", causal=True, mode="fwd"),
        Case("triton", 2, 4, 2, 512, 512, 128, "fp16", causal=False, mode="bwd"),
    ]
    env = {
        **os.environ,
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "FLASHBENCH_HOME": str(tmp_path / "home"),
        "FLASHBENCH_PRECOMPILE": "1",  # conftest turns the step off for every other test
    }
    script = textwrap.dedent(
        """
        import json, os, sys
        from flashbench.engine import precompile
        from flashbench.spec.cases import Case
        cases = [Case.from_dict(c) for c in json.loads(sys.argv[1])]
        rec = precompile.run(cases, device="cuda", kernels=(), visible=None, timeout_s=600)
        print(json.dumps(rec.to_dict()))
        """
    )
    payload = json.dumps([c.to_dict() for c in cases])
    done = subprocess.run(
        [sys.executable, "-c", script, payload], env=env, capture_output=True, text=True, check=True
    )
    rec = json.loads(done.stdout.strip().splitlines()[-1])
    assert rec["skipped"] is None and rec["builds"] > 0, rec
    assert rec["compiled"] == rec["builds"] and rec["failed"] == 0, rec
    first_calls = textwrap.dedent(
        """
        import contextlib, json, sys
        from triton import knobs
        from flashbench.engine.measure import prepare
        from flashbench.engine import build_lock
        from flashbench.providers import builtin
        from flashbench.spec.cases import Case
        builtin.load()
        build_lock.install()  # as a worker: a compile takes its build's lock, keyed as the step keyed it
        hits = []
        knobs.compilation.listener = lambda **kw: hits.append(bool(kw["cache_hit"]))
        for data in json.loads(sys.argv[1]):
            with contextlib.ExitStack() as stack:
                prepare(Case.from_dict(data), "cuda", stack).full()
        print(json.dumps(hits))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", first_calls, payload], env=env, capture_output=True, text=True, check=True
    )
    hits = json.loads(done.stdout.strip().splitlines()[-1])
    assert hits and all(hits), f"{hits.count(False)} of {len(hits)} builds compiled again"
    locks = list((tmp_path / "triton" / build_lock.FOLDER).glob("*.lock"))
    assert len(locks) == rec["builds"]  # the first calls locked the very builds the step recorded, no others


# Two processes meet one build at once (a barrier of files lines them up), each through the hooks Triton calls
# around a compile (build_lock.before_compile / after_compile): the "compile" writes an artifact into the cache
# unless it is there already. Without the lock both would find no artifact and both would compile.
_COMPILER = textwrap.dedent(
    """
    import json, os, sys, time, types
    from pathlib import Path
    from flashbench.engine import build_lock
    cache, name = Path(sys.argv[1]), sys.argv[2]
    def _attn_fwd(): pass
    kw = {"fn": types.SimpleNamespace(jit_function=types.SimpleNamespace(fn=_attn_fwd)),
          "compile": {"specialization_data": '{"name": "_attn_fwd", "key": "fp16"}'}}
    build_lock.install()
    (cache / f"ready-{name}").touch()
    while len(list(cache.glob("ready-*"))) < 2:
        time.sleep(0.01)
    build_lock.before_compile(**kw)
    artifact = cache / "attn_fwd.cubin"
    if artifact.exists():
        outcome = "cache hit"
    else:
        time.sleep(1.0)
        artifact.write_text(name)
        outcome = "compiled"
    build_lock.after_compile(**kw)
    print(json.dumps({"outcome": outcome, "waited_s": build_lock.waited_s()}))
    """
)


def test_two_processes_asking_for_one_build_compile_it_once_the_other_waits_and_finds_it(tmp_path):
    cache = tmp_path / "triton"
    cache.mkdir()
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _COMPILER, str(cache), name], env=env, stdout=subprocess.PIPE, text=True
        )
        for name in ("a", "b")
    ]
    answers = sorted((json.loads(p.communicate(timeout=120)[0]) for p in procs), key=lambda a: a["outcome"])
    assert [a["outcome"] for a in answers] == ["cache hit", "compiled"]
    hit, compiled = answers
    assert hit["waited_s"] > 0.5 and compiled["waited_s"] < 0.5  # the second waited out the first's compile
    assert len(list((cache / build_lock.FOLDER).glob("*.lock"))) == 1  # one lock file for the one build


def test_compile_process_leaves_a_build_whose_lock_is_held_and_frees_the_lock_of_one_that_failed(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    held = _build("_attn_fwd", "spec-held", module="flashbench_no_such_module")
    failed = _build("_attn_fwd", "spec-free", module="flashbench_no_such_module")
    holder = build_lock.BuildLock(build_lock.path_for(held["module"], held["qualname"], held["spec"]))
    assert holder.try_acquire()  # a worker compiling it
    stdin = io.StringIO("".join(json.dumps({**b, "id": i}) + "\n" for i, b in enumerate((held, failed))))
    proto = io.StringIO()
    compile_worker.compile_builds(stdin, proto)
    holder.release()
    first, second = (json.loads(line) for line in proto.getvalue().splitlines())
    assert first == {"id": 0, "compile_s": 0.0, "error": None, "elsewhere": True}
    assert second["id"] == 1 and "ModuleNotFoundError" in second["error"]
    again = build_lock.BuildLock(build_lock.path_for(failed["module"], failed["qualname"], failed["spec"]))
    assert again.try_acquire()  # released although the compile raised
    again.release()


# The step's processes stubbed: the record answers each case with one build after a second; the compile process finishes
# only once the worker on the second device has written a row (or after 120 s): a step the workers waited for
# would hold the sweep those 120 s and end before any row.
_STEP = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    mode, log, rows = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    def note(what):
        with open(log, "a") as fh:
            fh.write(f"{what} {time.time()}\\n")
    def until_the_second_gpu_wrote_a_row():
        deadline = time.time() + 120
        def second_gpu_row():
            lines = rows.read_text().splitlines() if rows.exists() else []
            return any(json.loads(ln).get("gpu_index") == 1 for ln in lines if ln.endswith("}"))
        while time.time() < deadline and not second_gpu_row():
            time.sleep(0.05)
    if mode == "record":
        cases = json.loads(sys.stdin.read())
        until_the_second_gpu_wrote_a_row()  # the other GPU measures while the first one records
        note("recorded")  # before the last answer: the step kills the process on reading it
        for case in cases:
            build = {"module": "m", "qualname": "k", "spec": "s"}
            print(json.dumps({"case": case["provider"], "builds": [build], "error": None}), flush=True)
    else:
        for line in sys.stdin:
            until_the_second_gpu_wrote_a_row()
            note("compiled")
            print(json.dumps({"id": json.loads(line)["id"], "compile_s": 0.1, "error": None}), flush=True)
    """
)


@interpreter_sweep  # its workers run the bundled forward through the interpreter (--device cpu)
def test_workers_start_beside_the_step_and_the_first_gpu_once_the_record_is_done(tmp_path, monkeypatch):
    out, log = tmp_path / "run", tmp_path / "step.log"

    def fake_start(cmd: list[str], visible: str | None) -> subprocess.Popen[str]:
        mode = "record" if "record" in cmd else "compile"
        script = [sys.executable, "-c", _STEP, mode, str(log), str(out / "rows.jsonl")]
        return subprocess.Popen(script, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    monkeypatch.setattr(precompile, "_start", fake_start)
    monkeypatch.setattr(precompile, "skip_reason", lambda device, cases: None)  # run it beside CPU workers
    tiny = ["--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "32", "--dtype", "fp16"]
    args = ["sweep", "--config", str(Path(__file__).with_name("fast_measure.toml")), *tiny, "--mode", "fwd"]
    # three shapes: the second GPU takes the first at once, the first GPU one of the others once the record is done
    args += ["--providers", "triton,naive", "--seq", "16,32,64", "--causal", "false", "--gpus", "0,1"]
    assert main([*args, "--out", str(out)]) == 0
    times = dict(line.split() for line in log.read_text().splitlines())
    rows = read_rows(out)
    assert {r.gpu_index for r in rows} == {0, 1} and all(r.status == "ok" for r in rows)
    second_gpu_first_row = min(r.timestamp for r in rows if r.gpu_index == 1)
    assert second_gpu_first_row < float(times["recorded"])  # a worker measured while the first GPU recorded
    assert second_gpu_first_row < float(times["compiled"])  # and while the step compiled
    assert min(r.timestamp for r in rows if r.gpu_index == 0) > float(times["recorded"])
    rec = read_env(out).precompile
    assert rec is not None and rec["overlapped"] and (rec["builds"], rec["compiled"]) == (1, 1), rec
    assert rec["wall_s"] < 100  # the compile did not wait out its 120 s


def _planned(provider: str, n: int) -> PlannedCase:
    return PlannedCase(Case(provider, 1, 2, 2, n, n, 64, "bf16", causal=False, mode="fwd"))


def test_cases_whose_builds_still_compile_go_after_those_that_would_not_wait():
    """--order provider: the bundled provider's cases wait while their builds compile, the others measure; once a
    build is done its cases come back in the plan's order."""
    plan = [_planned("triton", 64), _planned("triton", 128), _planned("naive", 64), _planned("naive", 128)]
    compiled: set[int] = set()
    order = []
    for item in runner.Deal.in_order(plan).cases(lambda c: c.provider != "triton" or c.seq_q in compiled):
        order.append((item.case.provider, item.case.seq_q))
        if len(order) == 1:
            compiled.add(128)  # N = 128's build ends while the first case measures
    assert order == [("naive", 64), ("triton", 128), ("naive", 128), ("triton", 64)]
    assert [p.case.key for p in runner.Deal.in_order(plan).cases(None)] == [p.case.key for p in plan]
    assert [p.case.key for p in runner.Deal.in_order(plan).cases(lambda c: False)] == [
        p.case.key for p in plan
    ]


def test_a_shapes_providers_stay_back_to_back_when_their_turn_moves():
    """--order case: a shape's providers are one group; the shape that would wait goes after the next that would
    not, whole."""
    plan = [_planned("triton", 64), _planned("naive", 64), _planned("naive", 128), _planned("triton", 128)]
    ready = {64: False, 128: True}
    order = [
        (p.case.provider, p.case.seq_q) for p in runner.Deal.in_order(plan).cases(lambda c: ready[c.seq_q])
    ]
    assert order == [("naive", 128), ("triton", 128), ("triton", 64), ("naive", 64)]


def test_step_says_a_case_is_ready_once_every_build_it_recorded_has_ended():
    step = precompile.Step(precompile.Record())
    a, b, other = _planned("triton", 64).case, _planned("triton", 128).case, _planned("naive", 64).case
    step._cases = {a.key, b.key}
    assert step.ready(other) and not step.ready(a)  # not the step's / not recorded yet
    builds = step._recorded(
        [(a.key, [_build("fwd", "s1"), _build("bwd", "s1")]), (b.key, [_build("fwd", "s1")])]
    )
    assert [x["id"] for x in builds] == [0, 1]
    step._ended_one(0)
    assert step.ready(b) and not step.ready(a)
    step._ended_one(1)
    assert step.ready(a)
    later = precompile.Step(precompile.Record())
    later._cases = {a.key}
    later.over.set()  # stopped, skipped or done: nothing to wait for
    assert later.ready(a)
