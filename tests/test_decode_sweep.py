"""`flashbench sweep` over decode cases end to end (--device cpu here, cuda on the GPU machine): ok rows held to
the float64 reference, refusals as rows with reasons, kernel errors as rows, one-line errors for bad flags, the
report's decode section."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashbench.cli.app import main
from flashbench.gpu import environment
from flashbench.report import build
from flashbench.results.rows import read_rows

# The CPU machines run the bundled decode kernel through Triton's interpreter; the GPU machine (Triton 3.6, whose
# interpreter fails on the bundled kernels: tests/test_sweep_cli.py) runs the same sweep on CUDA.
DEVICE = "cuda" if environment.gpu_present()[0] else "cpu"
DECODE = ["--device", DEVICE, "--batch", "3", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"]
DECODE += ["--dtype", "fp16", "--causal", "true", "--mode", "fwd", "--seq", "48"]
DECODE += ["--config", str(Path(__file__).with_name("fast_measure.toml"))]  # tests/fast_measure.toml: why


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--page-size", "24"], "page-size: 24 is not a power of two"),
        (["--kv-layout", "ring"], "unknown kv-layout 'ring'"),
        (["--seqlens", "ragged"], "unknown seqlens 'ragged'"),
        (["--seq-q", "0"], "seq-q: 0 must be a positive number"),
        (["--seed", "-1"], "seed: -1 must be a whole number >= 0"),
        (["--providers", "sdpa-math", "--kv-layout", "paged"], "sdpa-math takes no paged KV cache"),
        (["--kv-dtype", "fp4"], "unknown kv-dtype 'fp4'"),
        (["--kv-dtype", "fp8", "--providers", "naive"], "naive takes no fp8 (e4m3 with scales) KV cache"),
        (
            ["--kv-dtype", "fp8", "--dtype", "fp32", "--providers", "triton-decode"],
            "an fp8 KV cache is read under fp16 or bf16 queries",
        ),
    ],
)
def test_bad_decode_flags_are_one_line_and_exit_2(args, message, capsys, tmp_path):
    assert main(["sweep", *DECODE, "--out", str(tmp_path / "run"), *args]) == 2
    line = _error_line(capsys)
    assert line.startswith("flashbench: error: ") and message in line


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("decode") / "run"
    args = ["sweep", *DECODE, "--providers", "triton-decode,naive,sdpa-math", "--seq-q", "1,4"]
    args += [
        "--kv-layout",
        "contiguous,paged",
        "--seqlens",
        "uniform,random",
        "--seed",
        "2",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    return out


def test_decode_sweep_rows_are_ok_and_within_the_error_budget(decode_run):
    rows = read_rows(decode_run)
    assert len(rows) == 3 * 2 * 4 and len({r.key for r in rows}) == len(rows)
    for row in rows:
        serving = row.kv_layout == "paged" or row.seqlens == "random"
        if row.provider != "triton-decode" and serving:
            assert row.status == "unsupported" and "takes no" in row.reason
            continue
        assert row.status == "ok", (row.key, row.reason)
        assert row.rel_err is not None and row.rel_err <= row.err_budget, row.key
        assert "float64" in row.ref and row.flops > 0
    decode = [r for r in rows if r.provider == "triton-decode"]
    assert {(r.kv_layout, r.page_size, r.seqlens, r.seed) for r in decode} == {
        ("contiguous", 0, "uniform", 0),
        ("contiguous", 0, "random", 2),
        ("paged", 16, "uniform", 0),
        ("paged", 16, "random", 2),
    }
    assert all(r.kernel_config["num_splits"] >= 1 and r.kernel_config["BLOCK_N"] for r in decode)


def test_a_forced_config_reaches_the_decode_kernel(tmp_path, monkeypatch):
    # FLASHBENCH_TRITON_CONFIG (providers/bundled.py) forces triton-decode's tile and split count as it does the
    # forward's tile; the row records them (by default BLOCK_N is 16 under the interpreter, 128 on the GPU, and 48
    # keys take one split).
    monkeypatch.setenv("FLASHBENCH_TRITON_CONFIG", '{"BLOCK_N": 32, "num_splits": 2}')
    args = ["sweep", *DECODE, "--providers", "triton-decode", "--seq-q", "1", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    (row,) = read_rows(tmp_path / "run")
    assert row.status == "ok" and row.kernel_config["BLOCK_N"] == 32 and row.kernel_config["num_splits"] == 2


def test_ragged_rows_count_the_flops_of_their_lengths(decode_run):
    rows = {(r.provider, r.seq_q, r.seqlens, r.kv_layout): r for r in read_rows(decode_run)}
    uniform = rows[("triton-decode", 1, "uniform", "contiguous")]
    ragged = rows[("triton-decode", 1, "random", "contiguous")]
    assert uniform.flops == 4 * 3 * 4 * 32 * 48
    assert ragged.flops == 4 * 4 * 32 * sum(ragged.case.kv_lengths()) < uniform.flops


def test_resume_runs_no_decode_case_again(decode_run, capsys):
    before = read_rows(decode_run, latest_only=False)
    args = ["sweep", *DECODE, "--providers", "triton-decode,naive,sdpa-math", "--seq-q", "1,4"]
    args += ["--kv-layout", "contiguous,paged", "--seqlens", "uniform,random", "--seed", "2"]
    assert main([*args, "--out", str(decode_run), "--resume"]) == 0
    assert len(read_rows(decode_run, latest_only=False)) == len(before)


def test_report_has_a_decode_section(decode_run):
    text = build(decode_run, fmt="md")
    assert "### Decode: bandwidth per provider and cache length" in text
    section = text.split("### Decode")[1]
    assert "triton-decode" in section and "paged16, random" in section and "ms per token" in section
    pytest.importorskip("plotly", reason="the HTML report needs plotly (the GPU machine has none)")
    page = build(decode_run, fmt="html")
    assert '<section id="decode">' in page and "Decode: GB/s against KV length" in page


BAD_KERNELS = """
import torch
from flashbench.kernels import flash_decode
from flashbench.providers import register


@register("pages-past-the-pool", dtypes=("fp16",), gqa=True, devices=("cpu", "cuda"), backward=False,
          kv_layouts=("paged",), ragged=True)
def past_pool(q, k, v, causal=True, sm_scale=None, cache_seqlens=None, block_table=None):
    return flash_decode(q, k, v, cache_seqlens, block_table + k.shape[0], causal=causal, sm_scale=sm_scale)


@register("lengths-past-the-cache", dtypes=("fp16",), gqa=True, devices=("cpu", "cuda"), backward=False,
          ragged=True)
def past_cache(q, k, v, causal=True, sm_scale=None, cache_seqlens=None, block_table=None):
    return flash_decode(q, k, v, cache_seqlens + 1000, causal=causal, sm_scale=sm_scale)
"""


def test_bad_kv_cache_inputs_in_a_sweep_are_unsupported_rows(tmp_path):
    kernel = tmp_path / "bad.py"
    kernel.write_text(BAD_KERNELS)
    out = tmp_path / "run"
    args = ["sweep", *DECODE, "--seq-q", "1", "--kernel", str(kernel), "--seqlens", "random"]
    args += ["--providers", "pages-past-the-pool,lengths-past-the-cache,triton-decode", "--out", str(out)]
    assert main([*args, "--kv-layout", "contiguous,paged"]) == 0
    rows = {(r.provider, r.kv_layout): r for r in read_rows(out)}
    assert rows[("pages-past-the-pool", "paged")].status == "unsupported"
    assert "outside the pool" in rows[("pages-past-the-pool", "paged")].reason
    assert rows[("lengths-past-the-cache", "contiguous")].status == "unsupported"
    assert "past the cache capacity 48" in rows[("lengths-past-the-cache", "contiguous")].reason
    assert rows[("triton-decode", "paged")].status == "ok"  # the sweep went on


def test_decode_table_shows_time_over_the_floor_where_a_calibration_gives_one(decode_run):
    from flashbench.analysis.runs import load_run
    from flashbench.report import decode

    frame = load_run(decode_run).frame
    rows = decode.decode_rows(frame)
    assert rows["time_over_floor"].isna().all() and "x floor" not in decode.shown(rows)  # CPU: no GPU floor
    rows["time_over_floor"] = 1.18
    assert (decode.shown(rows)["x floor"] == 1.18).all()
