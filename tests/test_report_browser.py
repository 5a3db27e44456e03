"""The HTML report in a real browser: headless Chromium renders every figure and the page fetches nothing.

Chromium runs with DNS mapped to nowhere and a network log; the log must show no request that the page
started (Chromium's own background requests have no page origin and are ignored). Without Chromium these
tests skip, unless FLASHBENCH_REQUIRE_BROWSER=1 (set by .ci/run), where a missing browser is a failure.

The last test builds the report from a real results directory: a `flashbench sweep --device cpu` made here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from flashbench.report import build

pytest.importorskip(
    "plotly", reason="plotly is not installed (the HTML report needs it; the GPU machine has none)"
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_DIRS = sorted(p.parent for p in (ROOT / "tests" / "fixtures").glob("*/rows.jsonl"))
SVG_ROOTS_PER_FIGURE = 3  # plotly draws main-svg for the plot, the hover layer and the modebar layer
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str:
    """The browser's path; skips the test without one (fails it where FLASHBENCH_REQUIRE_BROWSER=1)."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("FLASHBENCH_REQUIRE_BROWSER") == "1":
        pytest.fail("FLASHBENCH_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install -y chromium)")
    pytest.skip("no chromium on PATH (apt-get install -y chromium); .ci/run installs it")


@pytest.fixture(scope="module")
def chromium() -> str:
    return find_chromium()


def render(chromium: str, page: Path) -> tuple[str, list[str]]:
    """(the DOM after scripts ran, the http(s) URLs the page itself requested) from headless Chromium."""
    with tempfile.TemporaryDirectory() as profile:
        netlog = Path(profile) / "netlog.json"
        cmd = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}/user",
            "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves: a page that needs the network breaks
            f"--log-net-log={netlog}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout, page_requests(netlog)


def page_requests(netlog: Path) -> list[str]:
    """URLs of URL_REQUEST_START_JOB events whose initiator is a page (file:// pages have the "null" origin)."""
    log = json.loads(netlog.read_text(encoding="utf-8", errors="replace").rstrip().rstrip(",") or "{}")
    if "events" not in log:  # Chromium ends the log on exit; a truncated log is repaired above or fails here
        pytest.fail(f"unreadable network log {netlog}")
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log["events"]:
        params = event.get("params") or {}
        if event.get("type") != start_job or not params.get("url"):
            continue
        if params.get("initiator") == "not an origin":  # the browser's own update / account checks
            continue
        urls.append(params["url"])
    return [u for u in urls if not u.startswith(("file:", "data:", "blob:", "chrome:"))]


def assert_renders_offline(chromium: str, page: Path) -> int:
    html = page.read_text(encoding="utf-8")
    figures = html.count("Plotly.newPlot(")
    assert figures > 0
    dom, requests = render(chromium, page)
    assert requests == [], f"the page requested {requests}"
    svg_roots = len(re.findall(r'class="main-svg"', dom))
    assert svg_roots == SVG_ROOTS_PER_FIGURE * figures, f"{svg_roots} svg roots for {figures} figures"
    return figures


def test_network_check_catches_a_page_that_fetches(chromium: str, tmp_path: Path) -> None:
    """The detector itself: a page with a remote image and script is caught."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<html><body><img src="https://example.com/x.png"><script src="http://cdn.example.org/a.js">'
        "</script></body></html>"
    )
    _, requests = render(chromium, page)
    assert "https://example.com/x.png" in requests and "http://cdn.example.org/a.js" in requests


@pytest.mark.parametrize("fixture", FIXTURE_DIRS, ids=lambda p: p.name)
def test_every_figure_renders_offline(chromium: str, fixture: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    build(fixture, fmt="html", out=page)
    assert_renders_offline(chromium, page)


def test_synthetic_report_with_baseline_renders_offline(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    fixture = ROOT / "tests" / "fixtures" / "synthetic-h100"
    build(fixture, fmt="html", out=page, baseline=fixture)
    # roofline, TFLOP/s, latency, speedup, memory, recompute, HBM bytes, comparison
    assert assert_renders_offline(chromium, page) == 8


@pytest.mark.slow
def test_report_from_a_real_cpu_sweep(chromium: str, tmp_path: Path) -> None:
    """A real results directory: `flashbench sweep --device cpu` (Triton interpreter), then every format."""
    run = tmp_path / "cpu-run"
    sweep = [
        sys.executable,
        "-m",
        "flashbench",
        "sweep",
        "--device",
        "cpu",
        "--providers",
        "naive,triton,triton-stored-p",
        "--seq",
        "16..32",
        "--head-dim",
        "32",
        "--batch",
        "1",
        "--heads",
        "2",
        "--dtype",
        "fp32",
        "--causal",
        "false",
        "--mode",
        "fwd,bwd",
        "--config",
        str(ROOT / "tests" / "fast_measure.toml"),  # the measurement of the suite's CPU sweeps: why there
        "--out",
        str(run),
    ]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(sweep, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]

    page = tmp_path / "report.html"
    html = build(run, fmt="html", out=page)
    assert "CPU run: every time on this page is a CPU time" in html
    assert "Recompute overhead" in html  # triton vs triton-stored-p, bwd
    assert assert_renders_offline(chromium, page) >= 4  # TFLOP/s, latency, speedup, recompute

    md = build(run, fmt="md")
    assert "**CPU**" in md and "CPU times" in md and "### Recompute overhead" in md
    rows = [line for line in (run / "rows.jsonl").read_text().splitlines() if line.strip()]
    csv = build(run, fmt="csv").strip().splitlines()
    assert len(csv) == 1 + len(rows) == 1 + 12  # header + 3 providers x 2 N x 2 modes
    doc = json.loads(build(run, fmt="json"))
    assert {r["time_label"] for r in doc["rows"]} == {"CPU time"}
    assert all(r["pct_of_roofline"] is None for r in doc["rows"])  # no GPU roofline for CPU times


def test_cross_gpu_report_renders_offline(chromium: str, tmp_path: Path) -> None:
    """An H200 run against a DERIVED H100 run (the real aa-run1 relabelled, times scaled: see test_report)."""
    from test_report import H100, derived_h100_run

    h100 = derived_h100_run(ROOT / "tests" / "fixtures" / "aa-run1", tmp_path / "h100-derived")
    page = tmp_path / "report.html"
    html = build(ROOT / "tests" / "fixtures" / "aa-run2", fmt="html", out=page, baseline=h100)
    assert f"Roofline (bf16): NVIDIA H200 vs {H100}" in html
    assert "different GPUs: ratios compare machines, not code" in html
    # roofline (both GPUs), TFLOP/s, latency, speedup, memory, comparison at least: every one drawn
    assert assert_renders_offline(chromium, page) >= 5
