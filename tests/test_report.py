"""`flashbench report`: html / md / csv / json from every fixture, --baseline, and one-line errors (exit 2)."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from report_helpers import needs_plotly

from flashbench.analysis.modelled import ROOF_RULE
from flashbench.cli.app import main
from flashbench.models.roofline import BOUND_RULE
from flashbench.results.rows import read_rows

# The GPU machine has no network and no plotly: the HTML report's tests skip there, the rest run.
NO_PLOTLY = "plotly is not installed (the HTML report needs it; the GPU machine has none)"

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_DIRS = sorted(p.parent for p in FIXTURES.glob("*/rows.jsonl"))
# Any tag that makes the browser fetch something: <script src>, <link href>, <img src>, <iframe src>, ...
FETCHING_TAG = re.compile(r"<(script|link|img|iframe|source|video|audio|embed|object)\b[^>]*>", re.IGNORECASE)
REMOTE = re.compile(r"""(src|href|data)\s*=\s*["']?\s*(https?:)?//""", re.IGNORECASE)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_offline(page: str) -> None:
    """No tag asks for anything over the network, and plotly.js is inlined exactly once."""
    for tag in FETCHING_TAG.finditer(page):
        assert not REMOTE.search(tag.group(0)), f"remote reference: {tag.group(0)[:200]}"
    assert "@import" not in page and "@font-face" not in page
    assert page.count("plotly.js v") == 1 or page.count("Plotly.newPlot") == 0, (
        "plotly.js must be inlined once"
    )
    assert "cdn.plot.ly" not in page.split("<body>", 1)[1][:1000]


def test_every_fixture_is_found() -> None:
    assert FIXTURES / "synthetic-h100" in FIXTURE_DIRS


@needs_plotly
@pytest.mark.parametrize("fixture", FIXTURE_DIRS, ids=lambda p: p.name)
def test_html_report_is_one_offline_page(
    fixture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("plotly", reason=NO_PLOTLY)
    out = tmp_path / "report.html"
    code, _, err = run_cli(["report", str(fixture), "-o", str(out)], capsys)
    assert code == 0, err
    page = out.read_text(encoding="utf-8")
    assert_offline(page)
    assert page.count("Plotly.newPlot(") >= 3  # speeds, latency, speedup at least
    for section in ("Summary", "TFLOP/s against N", "Latency", "Peak memory", "Environment", "Failures ("):
        assert section in page


@needs_plotly
def test_html_report_sections_of_the_synthetic_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("plotly", reason=NO_PLOTLY)
    out = tmp_path / "r.html"
    assert run_cli(["report", str(FIXTURES / "synthetic-h100"), "-o", str(out)], capsys)[0] == 0
    page = out.read_text(encoding="utf-8")
    for needle in (
        "Roofline (bf16)",
        "datasheet: 989 TFLOP",
        "NVML-derived",
        "Speedup over naive",
        "Recompute overhead",
        "Measured vs modelled HBM bytes",
        "Throttled cases (4 of",
        "SYNTHETIC results",
        "above roofline",
        "580.159.04",
    ):
        assert in_page(needle, page), needle


def in_page(text: str, page: str) -> bool:
    """`text` on the page, raw or as figure JSON writes it: plotly's encoder escapes non-ASCII ("·" as
    \\u00b7) without orjson and keeps it with orjson, so the page's bytes depend on what is installed."""
    return text in page or json.dumps(text)[1:-1] in page


@needs_plotly
def test_default_html_output_goes_into_the_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("plotly", reason=NO_PLOTLY)
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "synthetic-h100", run)
    code, _, err = run_cli(["report", str(run)], capsys)
    assert code == 0 and (run / "report.html").is_file()
    assert "wrote" in err


def test_markdown_summary_for_a_pull_request(capsys: pytest.CaptureFixture[str]) -> None:
    code, md, _ = run_cli(["report", str(FIXTURES / "synthetic-h100"), "--format", "md"], capsys)
    assert code == 0
    assert md.startswith("## flashbench report: `synthetic-h100`")
    for needle in (
        "NVIDIA H100 80GB HBM3",
        "### Best TFLOP/s per provider",
        "**Speedup over naive**",
        "### Recompute overhead",
        "**Failures that matter** (8 cases)",
        "- 4 oom, naive: N=16k",
        "### Throttled cases (4)",
        "FLOPs: forward = 4*B*H*d",
        "SYNTHETIC",
    ):
        assert needle in md, needle
    assert "<table" not in md and "<div" not in md  # plain markdown, no HTML


def test_speedup_vs_picks_the_baseline_provider(capsys: pytest.CaptureFixture[str]) -> None:
    code, md, _ = run_cli(
        ["report", str(FIXTURES / "synthetic-h100"), "--format", "md", "--speedup-vs", "sdpa-flash"], capsys
    )
    assert code == 0 and "**Speedup over sdpa-flash**" in md


@pytest.mark.parametrize("fixture", FIXTURE_DIRS, ids=lambda p: p.name)
def test_csv_is_tidy_one_row_per_case(fixture: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = run_cli(["report", str(fixture), "--format", "csv"], capsys)
    assert code == 0
    frame = pd.read_csv(io.StringIO(text))
    rows = read_rows(fixture)
    assert len(frame) == len(rows) and frame["key"].is_unique
    assert {"provider", "seq_q", "status", "median_ms", "tflops", "time_label", "pct_of_roofline"} <= set(
        frame
    )
    assert frame.loc[frame["status"] != "ok", "tflops"].isna().all()


@pytest.mark.parametrize("fixture", FIXTURE_DIRS, ids=lambda p: p.name)
def test_json_is_strict_and_tidy(fixture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert run_cli(["report", str(fixture), "--format", "json", "-o", str(out)], capsys)[0] == 0
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert doc["schema"] == 1 and "forward = 4*B*H*d" in doc["flop_convention"]
    assert doc["roof_rule"] == ROOF_RULE  # the one definition of the rows' "bound" and "% of roofline"
    assert doc["own_traffic_rule"] == BOUND_RULE  # each provider's own roof: pct_of_own_roofline, own_bound
    assert len(doc["rows"]) == len(read_rows(fixture))
    ok = [r for r in doc["rows"] if r["status"] == "ok" and r["tflops"] is not None]
    assert ok and all(isinstance(r["samples_ms"], list) for r in ok)


@needs_plotly
def test_baseline_run_compared_case_by_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "before"
    cur = tmp_path / "after"
    shutil.copytree(FIXTURES / "synthetic-h100", base)
    shutil.copytree(FIXTURES / "synthetic-h100", cur)
    lines = []
    for line in (cur / "rows.jsonl").read_text().splitlines():  # every "triton" case 10% slower now
        row = json.loads(line)
        if row["provider"] == "triton" and row["median_ms"]:
            row["median_ms"] *= 1.1
            row["samples_ms"] = [x * 1.1 for x in row["samples_ms"]]
            row["tflops"] /= 1.1
        lines.append(json.dumps(row))
    (cur / "rows.jsonl").write_text("\n".join(lines) + "\n")
    code, md, _ = run_cli(["report", str(cur), "--format", "md", "--baseline", str(base)], capsys)
    assert code == 0
    assert "### Against `before`" in md
    assert "**Gate against `before`: FAIL**" in md and "regressed" in md  # the gate's own verdict, first
    section = md.split("### Against `before`", 1)[1]
    triton = next(line for line in section.splitlines() if line.startswith("| triton |"))
    assert "| 1.1 | 1.1 | 1.1 | 0 |" in triton  # median, worst, best ratio; no newly failing case
    pytest.importorskip("plotly", reason=NO_PLOTLY)
    html_out = tmp_path / "cmp.html"
    assert run_cli(["report", str(cur), "--baseline", str(base), "-o", str(html_out)], capsys)[0] == 0
    assert "Against before" in html_out.read_text()


# --- errors: one line on stderr, exit code 2 ---


def assert_one_line_error(code: int, err: str, pattern: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashbench: error:"), err
    assert re.search(pattern, lines[0]), lines[0]


def test_missing_results_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["report", str(tmp_path / "nope")], capsys)
    assert_one_line_error(code, err, "not found")


def test_corrupt_rows_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "synthetic-h100", run)
    text = (run / "rows.jsonl").read_text().splitlines()
    text.insert(3, "{this is not json}")
    (run / "rows.jsonl").write_text("\n".join(text) + "\n")
    code, _, err = run_cli(["report", str(run), "--format", "md"], capsys)
    assert_one_line_error(code, err, "line 4 is corrupt")


def test_other_schema_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "synthetic-h100", run)
    env = json.loads((run / "env.json").read_text())
    (run / "env.json").write_text(json.dumps({**env, "schema": 99}))
    code, _, err = run_cli(["report", str(run)], capsys)
    assert_one_line_error(code, err, "schema 99")


def test_not_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["report", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "env.json|rows.jsonl")


def test_corrupt_baseline_is_reported_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "base"
    shutil.copytree(FIXTURES / "synthetic-h100", base)
    (base / "env.json").write_text("{")
    code, _, err = run_cli(["report", str(FIXTURES / "synthetic-h100"), "--baseline", str(base)], capsys)
    assert_one_line_error(code, err, "corrupt")


def test_unknown_format_and_unknown_baseline_provider(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["report", str(FIXTURES / "synthetic-h100"), "--format", "pdf"], capsys)
    assert_one_line_error(code, err, "unknown report format 'pdf'")
    code, _, err = run_cli(["report", str(FIXTURES / "synthetic-h100"), "--speedup-vs", "trito"], capsys)
    assert_one_line_error(code, err, "did you mean triton")


# --- runs from two GPU models ---

H100 = "NVIDIA H100 80GB HBM3"
H100_SLOWER = 1.4  # H200 / H100 HBM bandwidth is about 4.8 / 3.35


def derived_h100_run(src: Path, dest: Path) -> Path:
    """A DERIVED run, not a measurement: the real H200 fixture `src` relabelled as an H100 (env.json's GPU
    name and NVML facts, every row's gpu field) with every time scaled by H100_SLOWER. Only the report's
    cross-GPU handling is tested with it; its numbers say nothing about a real H100."""
    shutil.copytree(src, dest)
    env = json.loads((dest / "env.json").read_text())
    env["gpu"] = H100
    env["gpus"][0].update(
        name=H100, bus_width_bits=5120, max_mem_clock_mhz=2619, memory_total_bytes=85520809984
    )
    env["gpus"][0]["derived_bw_bytes_s"] = 2 * 2619e6 * 5120 / 8
    env["derived_for_tests"] = f"relabelled {src.name} (NVIDIA H200) as {H100}, times x{H100_SLOWER}"
    (dest / "env.json").write_text(json.dumps(env, indent=2))
    lines = []
    for line in (dest / "rows.jsonl").read_text().splitlines():
        row = json.loads(line)
        row["gpu"] = H100
        for key in ("median_ms", "p20_ms", "p80_ms"):
            if row.get(key):
                row[key] *= H100_SLOWER
        if row.get("samples_ms"):
            row["samples_ms"] = [x * H100_SLOWER for x in row["samples_ms"]]
        if row.get("tflops"):
            row["tflops"] /= H100_SLOWER
        lines.append(json.dumps(row))
    (dest / "rows.jsonl").write_text("\n".join(lines) + "\n")
    return dest


@needs_plotly
def test_cross_gpu_comparison_labels_both_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flashbench.analysis import runs as analysis
    from flashbench.report import roofline_figure

    h100 = derived_h100_run(FIXTURES / "aa-run1", tmp_path / "h100-derived")
    h200 = FIXTURES / "aa-run2"
    code, md, err = run_cli(["report", str(h200), "--format", "md", "--baseline", str(h100)], capsys)
    assert code == 0, err
    section = md.split("### Against `h100-derived`", 1)[1]
    assert f"This run: **NVIDIA H200** · `h100-derived`: **{H100}**" in section
    assert "different GPUs: ratios compare machines, not code" in section
    assert "**Gate against" not in md and "No gate verdict: the runs are from different GPUs" in md
    assert f"median % of roofline, NVIDIA H200 | median % of roofline, {H100} |" in section
    triton = next(line for line in section.splitlines() if line.startswith("| triton |"))
    median_ratio = float(triton.split("|")[3])
    assert 0.6 < median_ratio < 0.8  # the H200 side is about 1/1.4 of the derived H100's time

    # the same GPU on both sides: no cross-GPU label, both sides still named
    code, md, _ = run_cli(
        ["report", str(h200), "--format", "md", "--baseline", str(FIXTURES / "aa-run1")], capsys
    )
    assert code == 0 and "This run: **NVIDIA H200** · `aa-run1`: **NVIDIA H200**" in md
    assert "different GPUs" not in md

    pytest.importorskip("plotly", reason=NO_PLOTLY)
    # each GPU's roofline: both GPUs' ceilings in one figure, each run's points in its own GPU's panel
    runs = [analysis.load_run(h200), analysis.load_run(h100)]
    assert [r.gpu_spec.name for r in runs][1] != runs[0].gpu_spec.name
    fig = roofline_figure.roofline_compare(runs, "bf16")
    lines = [t.name for t in fig.data if t.mode == "lines"]
    # every roof is named on its panel and none in the legend, which sits under both panels: a legend of both GPUs'
    # roofs (17 entries) squeezed the panels
    assert not [t.name for t in fig.data if t.mode == "lines" and t.showlegend is not False]
    assert fig.layout.legend.orientation == "h"
    for gpu in ("NVIDIA H200", H100):
        assert any(n.startswith(f"{gpu} · datasheet: ") for n in lines), lines
        assert any(n.startswith(f"{gpu} · NVML-derived: ") for n in lines), lines
    peaks = {
        t.name.split(" · ")[0]: max(t.y) for t in fig.data if t.mode == "lines" and "datasheet" in t.name
    }
    assert peaks[H100] < peaks["NVIDIA H200"] * 1.01  # the H100's bf16 datasheet roof is not above the H200's
    points = [t for t in fig.data if t.mode == "markers" and t.text is not None]  # the cases, not the legend
    assert {t.xaxis for t in points} == {"x", "x2"}  # points on both panels
    assert all("NVIDIA H200" in t.text[0] for t in points if t.xaxis == "x")
    assert all(H100 in t.text[0] for t in points if t.xaxis == "x2")

    out = tmp_path / "cross.html"
    assert run_cli(["report", str(h200), "--baseline", str(h100), "-o", str(out)], capsys)[0] == 0
    page = out.read_text(encoding="utf-8")
    assert_offline(page)
    for needle in (
        f"Roofline (bf16): NVIDIA H200 vs {H100}",
        "Different GPUs: ratios compare machines, not code",
        f"Against h100-derived ({H100}): different GPUs",
        f"median % of roofline, {H100}",
        f"{H100} % of roofline",  # the side-by-side table
        "NVIDIA H200 % of roofline",
        f"{H100} · datasheet: ",
        "NVIDIA H200 · datasheet: ",
    ):
        assert in_page(needle, page), needle
