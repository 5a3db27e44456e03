"""The scripts the docs cite (benchmarks/, tools/): each exists, starts, and is cited somewhere; and every other
path or `flashbench.x.y` name a doc page or the code cites exists.

"Starts" is the most a CPU machine can check of a GPU script: its imports resolve and its command line parses
(`--help` exits 0; a shell script passes `bash -n`). All Python scripts run in one subprocess, so torch and
Triton are imported once. The studies in benchmarks/studies/ are provider files and sweep configs, not scripts:
tests/test_studies.py loads and runs them.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = re.compile(r"\b((?:benchmarks|tools)/(?:[\w-]+/)*[\w.-]+\.(?:py|sh|toml))\b")
STUDIES = "benchmarks/studies/"
# Other files a page names, and the library's dotted names (`flashbench.engine.timing.time_cuda`).
PATH = re.compile(
    r"(?<![\w/.-])((?:flashbench|kernels|configs|tests|examples)/(?:[\w-]+/)*[\w.-]*\w\.(?:py|toml|md))"
)
DOTTED = re.compile(r"(?<![\w/.])flashbench(?:\.\w+)+")
# Pages a user reads; CHANGELOG.md is history and may name scripts that are gone.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks/README.md"]
DOCS.append(ROOT / "tools/README.md")
CODE = [
    p
    for folder in ("flashbench", "kernels", "benchmarks", "tools", "tests")
    for p in (ROOT / folder).rglob("*")
]

# Runs each script as __main__ with --help; prints {script: exit code or the exception}.
STARTER = """
import contextlib, io, json, runpy, sys
codes = {}
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(path, run_name="__main__")
        codes[path] = "returned without exiting"
    except SystemExit as exc:
        codes[path] = exc.code or 0
    except BaseException as exc:
        codes[path] = f"{type(exc).__name__}: {exc}"
print(json.dumps(codes))
"""


def cited(files: list[Path]) -> dict[str, list[str]]:
    """Script path -> the files that name it."""
    out: dict[str, list[str]] = {}
    for f in files:
        if f.is_file() and f.suffix in (".md", ".py", ".sh", ".toml"):
            for name in SCRIPT.findall(f.read_text(encoding="utf-8")):
                out.setdefault(name, []).append(str(f.relative_to(ROOT)))
    return out


def test_every_script_the_docs_or_the_code_cite_exists():
    missing = {s: where for s, where in cited(DOCS + CODE).items() if not (ROOT / s).is_file()}
    assert not missing, f"cited but gone: {missing}"


def test_every_script_in_benchmarks_and_tools_is_cited_by_a_doc():
    docs = cited(DOCS)
    shipped = [
        p
        for folder in ("benchmarks", "tools")
        for p in sorted((ROOT / folder).rglob("*"))
        if p.suffix in (".py", ".sh", ".toml") and "__pycache__" not in p.parts
    ]
    uncited = [str(p.relative_to(ROOT)) for p in shipped if str(p.relative_to(ROOT)) not in docs]
    assert not uncited, f"no doc cites {uncited}: document them or delete them"


def test_every_script_the_docs_cite_starts():
    scripts = sorted(s for s in cited(DOCS) if not s.startswith(STUDIES))
    shell = [s for s in scripts if s.endswith(".sh")]
    python = [s for s in scripts if s.endswith(".py")]
    assert shell and python
    for s in shell:
        run = subprocess.run(["bash", "-n", s], cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 0, f"{s}: {run.stderr}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", STARTER, *python],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    codes = json.loads(run.stdout.strip().splitlines()[-1])
    assert codes == dict.fromkeys(python, 0), {s: c for s, c in codes.items() if c != 0}


def _resolves(dotted: str) -> bool:
    """`flashbench.a.b.c`: its longest importable prefix is a module and the rest are attributes of it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            obj = importlib.import_module(name)
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                return False
            return True
    return False


def test_every_file_and_flashbench_name_the_docs_and_the_code_cite_exists():
    """The docs and the code's docstrings and comments (tests/ names made-up paths on purpose)."""
    code = [p for p in CODE if p.suffix in (".py", ".sh", ".toml") and p.parts[len(ROOT.parts)] != "tests"]
    missing: dict[str, list[str]] = {}
    for page in DOCS + code:
        text = page.read_text(encoding="utf-8")
        gone = [p for p in set(PATH.findall(text)) if not (ROOT / p).exists()]
        gone += [name for name in set(DOTTED.findall(text)) if not _resolves(name)]
        for name in gone:
            missing.setdefault(name, []).append(str(page.relative_to(ROOT)))
    assert not missing, f"cited but gone: {missing}"


def test_the_docs_reference_check_finds_a_stale_module_and_a_missing_file():
    text = "see `flashbench.timing.time_cuda` and kernels/schedule_ab.py, not `flashbench.engine.timing.time_cuda`"
    assert [n for n in DOTTED.findall(text) if not _resolves(n)] == ["flashbench.timing.time_cuda"]
    assert PATH.findall(text) == ["kernels/schedule_ab.py"] and not (ROOT / "kernels/schedule_ab.py").exists()
    assert SCRIPT.findall("run benchmarks/studies/backward.toml") == ["benchmarks/studies/backward.toml"]


def test_gpu_tests_sh_names_the_failures_of_a_shard_cut_at_its_time_limit(tmp_path):
    """benchmarks/gpu_tests.sh stops a shard at TEST_TIMEOUT_S with SIGINT: pytest still prints its summary, so a
    failure before the cut is named, and the shard's line says it was cut (a SIGTERM left only progress dots)."""
    suite = tmp_path / "test_cut.py"
    suite.write_text(
        "import time\n\ndef test_fails():\n    assert 1 == 2\n\ndef test_hangs():\n    time.sleep(60)\n"
    )
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # python3: this interpreter
        "OUT": str(tmp_path / "out"),
        "TESTS": str(suite),
        "JOBS": "1",
        "TEST_TIMEOUT_S": "8",
    }
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_tests.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "pytest shard 0/1 (cut at the 8 s limit)" in run.stdout, run.stdout
    assert "FAILED" in run.stdout and "test_cut.py::test_fails" in run.stdout, run.stdout
    failing = (tmp_path / "out" / "pytest-failing.txt").read_text()
    assert "test_cut.py::test_fails FAILED" in failing and "test_hangs" not in failing, failing


def test_gpu_tests_sh_names_a_failure_as_it_happens_even_if_the_run_is_killed(tmp_path):
    """A shard killed outright (the machine's own time limit ends the whole script, no summary is printed) has
    already written the tests that failed to $OUT/pytest-failing.txt."""
    suite = tmp_path / "test_killed.py"
    suite.write_text(
        "import time\n\ndef test_fails():\n    assert 1 == 2\n\ndef test_hangs():\n    time.sleep(120)\n"
    )
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OUT": str(out),
        "TESTS": str(suite),
        "JOBS": "1",
    }
    script = subprocess.Popen(
        ["bash", str(ROOT / "benchmarks/gpu_tests.sh")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    failing = out / "pytest-failing.txt"
    try:
        deadline = time.monotonic() + 90
        while "test_fails" not in (failing.read_text() if failing.exists() else ""):
            assert time.monotonic() < deadline and script.poll() is None, (
                "no failure named while test_hangs ran"
            )
            time.sleep(0.2)
        assert script.poll() is None  # still inside test_hangs: nothing has printed a summary
    finally:
        os.killpg(script.pid, signal.SIGKILL)
        script.wait()
    assert "test_killed.py::test_fails FAILED" in failing.read_text()
    assert "short test summary" not in (out / "pytest-0.log").read_text()
