"""What the CLI prints: one-line usage errors, whole provider names in narrow tables, one word for the mask,
nothing about GPUs on the CPU, availability that says where a provider can run, help that matches behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashbench.analysis import runs
from flashbench.cli.app import main
from flashbench.cli.render import render_tables
from flashbench.cli.roofline import render_roofline
from flashbench.engine import runner
from flashbench.engine.progress import describe_case
from flashbench.gpu import environment
from flashbench.models.roofline import BOUND_RULE
from flashbench.results.rows import OK, Row
from flashbench.spec.cases import Case

LONG_NAMES = ["my-flash-attention-kernel-v2", "sdpa-efficient", "triton-stored-p"]
SEQS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


def _row(provider: str, n: int, *, device: str = "cuda", causal: bool = False, **kw: object) -> Row:
    case = Case(provider, 1, 16, 16, n, n, 128, "bf16", causal, "fwd")
    return Row.for_case(case, OK, device=device, median_ms=1.234, tflops=456.7, **kw)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "--sq", "512"], "No such option: --sq"),
        (["gate", "--baseline", "x.json"], "Missing option '--current'"),
        (["roofline", "--batch", "two"], "Invalid value for '--batch'"),
        (["sweeep"], "No such command 'sweeep'"),
    ],
)
def test_usage_errors_are_one_line_with_exit_2(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert line.startswith("flashbench: error: ") and message in line and "--help" in line
    assert captured.out == ""


def test_provider_names_are_never_cut_in_an_80_column_sweep_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    render_tables([_row(p, n) for p in LONG_NAMES for n in SEQS])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    for name in LONG_NAMES:
        assert name in out


def test_provider_names_are_never_cut_in_the_roofline_overlay(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    report = {
        "gpu": {"name": "H100 SXM5 80GB", "derived": False},
        "ceilings": [],
        "shape": {"batch": 1, "heads": 16, "kv_heads": 16, "causal": False},
        "roof_used": "datasheet",
        "flop_convention": "forward = 4*B*H*d*pairs",
        "bound_rule": BOUND_RULE,
        "predictions": [],
        "measured": [
            {
                "provider": name,
                "dtype": "bf16",
                "mode": "fwd+bwd",
                "seq_q": 32768,
                "head_dim": 128,
                "median_ms": 12.5,
                "achieved_tflops": 512.3,
                "ai": 2048.0,
                "pct_of_roofline": 51.8,
                "bound": "compute-bound",
                "valid": True,
                "throttled": True,
            }
            for name in LONG_NAMES
        ],
    }
    render_roofline(report)
    out = capsys.readouterr().out
    for name in LONG_NAMES:
        assert name in out


_DESCRIBED: dict[tuple[str, tuple[str, ...]], runner.Worker] = {}


@pytest.fixture
def one_worker(monkeypatch):
    """`list providers` asks a worker process what each provider supports, 3-9 s to start here; the calls of this
    module's tests share the first worker's answer (what they check is how the CLI renders it)."""
    real = runner.describe

    def describe(device: str, kernels: tuple[str, ...]) -> runner.Worker:
        key = (device, tuple(kernels))
        if key not in _DESCRIBED:
            _DESCRIBED[key] = real(device, kernels)
        return _DESCRIBED[key]

    monkeypatch.setattr(runner, "describe", describe)


def _providers_table(out: str, names: set[str]) -> tuple[str, dict[str, str], dict[str, str]]:
    """`list providers` output as (header line, name -> its table row, name -> its reason under the table);
    a reason that wraps is joined back into one string."""
    lines = out.splitlines()
    header = next(line for line in lines if line.split()[:1] == ["name"])
    split = next(j for j, line in enumerate(lines) if line.startswith("Not available here:"))
    table = {line.split()[0]: line for line in lines[:split] if line.split()[:1] and line.split()[0] in names}
    reasons: dict[str, str] = {}
    last = ""
    for line in lines[split + 1 :]:
        first = line.split()[:1]
        if first and first[0] in names and not line.startswith(" "):
            last = first[0]
            reasons[last] = line[len(last) :].strip()
        elif last and line.strip():
            reasons[last] += " " + line.strip()
    return header, table, reasons


@pytest.mark.skipif(environment.gpu_present()[0], reason="this machine has a GPU")
@pytest.mark.usefixtures("one_worker")
def test_list_providers_without_a_gpu_says_cuda_only(capsys):
    assert main(["list", "providers", "--json"]) == 0
    infos = {i["name"]: i for i in json.loads(capsys.readouterr().out)}
    assert not infos["sdpa-cudnn"]["available"] and infos["sdpa-cudnn"]["reason"] == "cuda only (no GPU here)"
    assert main(["list", "providers"]) == 0
    _, table, reasons = _providers_table(capsys.readouterr().out, set(infos))
    assert table["sdpa-cudnn"].split()[1] == "no" and reasons["sdpa-cudnn"] == "cuda only (no GPU here)"
    assert table["naive"].split()[1] == "yes" and "naive" not in reasons


@pytest.mark.parametrize("width", [80, 100])
def test_list_providers_reads_at_80_and_100_columns(capsys, monkeypatch, width):
    """Every line fits; names are whole; a cell wraps between words, never inside one (the table showed
    "conti" / "guous"); each unavailable provider's reason is there in full, wrapped under the table (it ran
    over 15 lines of a 5-character cell)."""
    assert main(["list", "providers", "--json"]) == 0
    infos = {i["name"]: i for i in json.loads(capsys.readouterr().out)}
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["list", "providers"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= width
    _, table, reasons = _providers_table(out, set(infos))
    assert set(table) == set(infos)
    assert reasons == {n: i["reason"] for n, i in infos.items() if not i["available"]}
    words = {w for i in infos.values() for key in ("dtypes", "kv_layouts", "devices") for w in i[key]}
    words |= {str(d) for i in infos.values() for d in i["head_dims"] or ()} | set(infos)
    words |= {
        "yes",
        "no",
        "any",
        "causal",
        "window",
        "bwd",
        "GQA",
        "MLA",
        "MLA-only",
        "ragged",
        "-",
        "8..256:8",
    }
    body = out.split("Not available here:")[0].splitlines()[3:]  # below the title and the header
    assert {w for line in body for w in line.split()} <= words


@pytest.mark.parametrize("width", [80, 100])
def test_roofline_tables_read_at_80_and_100_columns(capsys, monkeypatch, width):
    """The modelled and measured tables fit, cut nothing short ("sdpa-m…", "memory-…" at 80 columns) and
    break no word ("throttl" / "ed")."""
    monkeypatch.setenv("COLUMNS", str(width))
    run = Path(__file__).resolve().parent.parent / "results" / "examples" / "h100-speed"
    assert main(["roofline", "--gpu", "h100", "--seq", "1024,8192", "--results", str(run)]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= width and "…" not in out
    families = ("naive (bf16)", "sdpa-math (fp32)", "flash (bf16)", "stored-p (bf16)", "flash-v1 (bf16)")
    assert all(family in out for family in families)
    words = out.split()
    assert {"memory-bound", "compute-bound", "throttled", "sdpa-cudnn"} <= set(words)


@pytest.mark.usefixtures("one_worker")
def test_list_providers_says_who_takes_a_window_and_which_kv_caches(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["list", "providers", "--json"]) == 0
    names = {i["name"] for i in json.loads(capsys.readouterr().out)}
    assert main(["list", "providers"]) == 0
    header, table, _ = _providers_table(capsys.readouterr().out, names)
    starts = [header.index(h) for h in ("takes", "KV cache", "devices")]

    def cell(name: str, j: int) -> str:
        return table[name][starts[j] : starts[j + 1]].strip()

    assert "window" in cell("triton", 0).split() and "window" in cell("flex", 0).split()
    assert "window" not in cell("sdpa-cudnn", 0) and "window" not in cell("triton-stored-p", 0)
    assert cell("triton-decode", 1) == "contiguous paged ragged" and cell("sdpa-cudnn", 1) == "contiguous"
    assert "MLA-only" in cell("triton-mla", 0).split() and "MLA" in cell("sdpa-math", 0).split()
    assert "MLA" not in cell("sdpa-cudnn", 0).split() and "MLA-only" not in cell("flex", 0).split()


def test_cpu_sweep_footer_says_nothing_about_gpus(capsys):
    render_tables([_row("naive", n, device="cpu") for n in (16, 32)], tokens=None)
    out = capsys.readouterr().out
    assert "CPU ms" in out and "GPU" not in out


def test_gpu_sweep_footer_still_marks_throttling(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the footer on one line
    render_tables([_row("naive", 16, throttled=True)])
    assert "GPU throttled" in capsys.readouterr().out


def test_progress_lines_and_tables_use_the_same_word_for_the_mask(capsys):
    non_causal = _row("naive", 512)
    assert "non-causal" in describe_case(non_causal) and " full " not in describe_case(non_causal)
    render_tables([non_causal])
    assert "non-causal" in capsys.readouterr().out
    assert "causal" in describe_case(_row("naive", 512, causal=True))


def test_report_speedup_vs_help_states_the_rule_pick_baseline_follows(capsys, tmp_path: Path):
    assert main(["report", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert runs.SPEEDUP_VS_HELP in text
    # The rule as stated: the first default provider *with an ok row*, else the first provider with one.
    import pandas as pd

    frame = pd.DataFrame(
        {"provider": ["naive", "sdpa-math", "triton"], "ok": [False, True, True]}  # naive only OOMed
    )
    assert runs.pick_baseline(frame) == "sdpa-math"
    frame = pd.DataFrame({"provider": ["flex", "triton"], "ok": [False, True]})
    assert runs.pick_baseline(frame) == "triton"


def test_a_decode_sweep_table_shows_gb_s_as_the_report_computes_them(capsys, monkeypatch):
    """A serving group's cells are GB/s, the same number the report states (its achieved_gb_s), not the 3-10
    TFLOP/s a decode does; a training group keeps TFLOP/s."""
    from flashbench.results.rows import read_rows

    monkeypatch.setenv("COLUMNS", "200")
    run_dir = Path(__file__).resolve().parents[1] / "results" / "examples" / "h100-decode"
    decode = runs.load_run(run_dir)
    rows = [r for r in read_rows(run_dir) if r.kv_heads == 8 and r.kv_layout == "contiguous"]
    render_tables(rows + [_row("naive", 512)])
    out = capsys.readouterr().out
    assert "GB/s (median)" in out and "TFLOP/s (median)" in out and "N = KV length" in out
    ok = decode.frame[
        decode.frame["ok"] & (decode.frame["kv_heads"] == 8) & (decode.frame["kv_layout"] == "contiguous")
    ]
    cudnn = next(line for line in out.splitlines() if "sdpa-cudnn" in line)
    expected = [f"{v:.0f}" for v in ok[ok["provider"] == "sdpa-cudnn"].sort_values("seq_k")["achieved_gb_s"]]
    assert cudnn.replace("│", " ").split()[1:] == expected
    assert all(float(v) > 1000 for v in expected)  # bytes/s of a cache read, not TFLOP/s


def test_a_host_bound_row_is_marked_in_the_sweep_table(capsys):
    render_tables([_row("naive", 512, host_bound=True, loop_ms=2.0, host_ms=1.5), _row("triton", 512)])
    out = capsys.readouterr().out
    naive = next(line for line in out.splitlines() if "naive" in line)
    triton = next(line for line in out.splitlines() if "triton" in line)
    assert "456.7†" in naive and "†" not in triton
    assert "† = host-bound" in out
