"""Sliding windows in the sweep: `--window L,R` (and presets), the Case key, the plan's unsupported rows, the
providers that take a window, the FLOP, byte and memory models' pair counting."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tiers import interpreter_sweep

from flashbench.cli.app import main
from flashbench.errors import FlashbenchError
from flashbench.models import io_model, memory
from flashbench.models.flops import attention_flops, unmasked_pairs
from flashbench.providers import builtin, registry
from flashbench.providers.registry import ProviderInfo
from flashbench.results.rows import Row, read_rows
from flashbench.spec.cases import Case
from flashbench.spec.config import load_spec
from flashbench.spec.plan import expand, plan
from flashbench.spec.window import parse_window, parse_windows, visible

TINY = ["--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--dtype", "fp16"]
TINY = ["--config", str(Path(__file__).with_name("fast_measure.toml")), *TINY]  # tests/fast_measure.toml: why


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4096,0", ("4096,0",)),
        (" 4096 , -1 ", ("4096,-1",)),
        ("-1,-1;4096,0", ("", "4096,0")),
        ("none;4096,0;4096,0", ("", "4096,0")),
        ([4096, 0], ("4096,0",)),  # TOML: one pair
        (["-1,-1", [128, 0]], ("", "128,0")),  # TOML: a list of windows
    ],
)
def test_windows_parse_to_canonical_text(value, expected):
    assert parse_windows(value) == expected


@pytest.mark.parametrize("value", ["4096", "a,b", "-2,0", "1,2,3", "4096,0;x", "", ";"])
def test_bad_window_is_one_line_and_exit_2(value, capsys, tmp_path):
    if value in ("", ";"):  # an empty item is no window, not an error
        assert parse_windows(value) == ("",)
        return
    with pytest.raises(FlashbenchError):
        parse_windows(value)
    assert main(["sweep", "--device", "cpu", "--window", value, "--out", str(tmp_path / "r")]) == 2
    line = _error_line(capsys)
    assert line.startswith("flashbench: error: window:")


def test_window_in_a_preset_file(tmp_path):
    preset = tmp_path / "win.toml"
    preset.write_text('[sweep]\nseq = "1024"\nwindow = ["-1,-1", "256,0"]\n')
    assert load_spec(config=preset).window == ("", "256,0")
    bad = tmp_path / "bad.toml"
    bad.write_text('[sweep]\nwindow = "256"\n')
    with pytest.raises(FlashbenchError, match="window: '256' is not L,R"):
        load_spec(config=bad)


def test_visible_is_flash_attns_bottom_right_window():
    # seq_q = 2 over seq_k = 5: query 0 sits at key 3, query 1 at key 4.
    keep = [[bool(visible(i, j, 2, 5, False, (1, 0))) for j in range(5)] for i in range(2)]
    assert keep == [[False, False, True, True, False], [False, False, False, True, True]]
    assert visible(0, 4, 2, 5, True, (1, -1)) is False  # causal: right = 0
    with pytest.raises(ValueError, match="causal means window right = 0"):
        visible(0, 0, 2, 5, True, (1, 2))
    assert parse_window("-1,-1") is None and parse_window("none") is None


# ---------------------------------------------------------------------------------------------- keys
def test_a_case_without_a_window_keeps_its_old_key_and_a_windowed_one_differs():
    old = "triton|b1|h16|kv16|q32768|k32768|d128|bf16|causal|fwd"
    case = Case("triton", 1, 16, 16, 32768, 32768, 128, "bf16", True, "fwd")
    assert case.key == old and case.window_size is None
    windowed = Case("triton", 1, 16, 16, 32768, 32768, 128, "bf16", True, "fwd", window="4096,0")
    assert windowed.key == old + "|win4096,0" and windowed.window_size == (4096, 0)
    assert windowed.shape_key.endswith("|win4096,0")
    # a row written before the field existed reads as no window, with the same key
    data = Row.for_case(case, "ok").to_dict()
    del data["window"]
    assert Row.from_dict(data).key == old
    assert Case.from_dict(windowed.to_dict()) == windowed


# ---------------------------------------------------------------------------------------------- plan
def _infos():
    base = dict(devices=("cuda", "cpu"), gqa=True, memory_family="flash")
    return {
        "win": ProviderInfo("win", window=True, **base),
        "plain": ProviderInfo("plain", **base),
    }


def test_plan_folds_causal_into_the_window_and_marks_what_cannot_run():
    spec = load_spec(
        overrides={
            "seq": "1024",
            "batch": "1",
            "providers": "win,plain",
            "causal": "both",
            "window": "-1,-1;256,-1;-1,0;8,8",
        }
    )
    planned = {(p.case.provider, p.case.causal, p.case.window): p for p in plan(spec, _infos())}
    # causal: (256, -1) is (256, 0); (-1, 0) is plain causal; (8, 8) contradicts causal
    assert {w for (_, c, w) in planned if c} == {"", "256,0", "8,8"}
    assert {w for (_, c, w) in planned if not c} == {"", "256,-1", "-1,0", "8,8"}
    assert planned[("win", True, "256,0")].status is None
    assert planned[("win", True, "8,8")].status == "unsupported"
    assert "causal means window right = 0" in planned[("win", True, "8,8")].reason
    assert planned[("plain", False, "256,-1")].status == "unsupported"
    assert planned[("plain", False, "256,-1")].reason == "plain takes no sliding window (window 256,-1)"
    assert planned[("plain", True, "")].status is None  # the plain causal case still runs


def test_window_cases_expand_once_per_window_in_order():
    spec = load_spec(overrides={"seq": "512", "batch": "1", "causal": "true", "window": "-1,-1;4096,0"})
    assert [c.window for c in expand(spec, ["triton"])] == ["", "4096,0"]


def test_builtin_providers_declare_which_take_a_window():
    builtin.load()
    takes = {p.name for p in registry.providers() if p.info.window}
    assert takes == {"triton", "naive", "sdpa-math", "flex", "flash-attn"}


def test_a_user_kernel_gets_the_window_only_when_it_declares_it():
    seen = []

    def attn(q, k, v, causal=False, sm_scale=None, **kw):
        seen.append(kw)
        return q

    registry.register("window-probe", window=True, source="test")(attn)
    try:
        probe = registry.get("window-probe")
        case = Case("window-probe", 1, 1, 1, 8, 8, 16, "fp16", True, "fwd", window="4,0")
        probe.build(case, "cpu", None)(1, 2, 3)
        probe.build(Case("window-probe", 1, 1, 1, 8, 8, 16, "fp16", True, "fwd"), "cpu", None)(1, 2, 3)
    finally:
        registry._REGISTRY.pop("window-probe", None)
    assert seen == [{"window": (4, 0)}, {}]
    assert ProviderInfo("x").supports(case, "cuda") == "x takes no sliding window (window 4,0)"


# ---------------------------------------------------------------------------------------------- models
def test_window_pairs_by_hand():
    # causal window of W keys at N: row i keeps min(i, W) + 1 keys -> (W + 1) N - W (W + 1) / 2
    assert unmasked_pairs(10, 10, True, window=(3, -1)) == 4 * 10 - 6
    assert unmasked_pairs(10, 10, False, window=(3, 0)) == 34
    assert unmasked_pairs(10, 10, False, window=(0, 0)) == 10  # the diagonal
    assert unmasked_pairs(10, 10, False, window=(1, 1)) == 28  # a band of 3, minus the corners
    assert unmasked_pairs(4, 10, False, window=(-1, 2)) == 9 + 10 + 10 + 10  # query 0 at key 6 sees 0..8
    assert unmasked_pairs(8, 4, False, window=(1, 0)) == 0 + 0 + 0 + 0 + 1 + 2 + 2 + 2  # rows before key 0
    assert unmasked_pairs(10, 10, False, window=(100, 100)) == 100
    # the benchmark's shape: a causal window of 4096 at N = 32k keeps 4.27x fewer pairs than full causal
    n = 32768
    assert unmasked_pairs(n, n, True) / unmasked_pairs(n, n, True, window=(4096, 0)) == pytest.approx(
        4.2658, 1e-4
    )


def test_window_flops_count_unmasked_pairs_in_every_mode():
    pairs = 4097 * 32768 - 4096 * 4097 // 2
    fwd = 4 * 1 * 16 * 128 * pairs
    for mode, mult in (("fwd", 1.0), ("bwd", 2.5), ("fwd+bwd", 3.5)):
        got = attention_flops(1, 16, 32768, 32768, 128, True, mode, window=(4096, 0))
        assert got == mult * fwd


def test_tiled_bytes_and_naive_memory_account_for_the_window():
    shape = (1, 16, 16, 8192, 8192, 128, 2)
    kw = dict(l2_reuse=False, blocks=io_model.Blocks(fwd_m=128, fwd_n=64, bwd_m=64, bwd_n=128))
    full = io_model.hbm_traffic("flash", *shape, True, "fwd", **kw).as_dict()
    win = io_model.hbm_traffic("flash", *shape, True, "fwd", window=(1024, 0), **kw).as_dict()
    name = "read K, V (once per 128-row query block)"
    # every query block reads ceil((128 + 1024) / 64) = 18 or 19 key blocks instead of up to 128
    assert win[name]["read"] < full[name]["read"] / 3
    bwd_full = io_model.hbm_traffic("flash", *shape, True, "bwd", **kw).total
    assert io_model.hbm_traffic("flash", *shape, True, "bwd", window=(1024, 0), **kw).total < bwd_full / 2
    args = ("naive", 1, 2, 2, 1024, 1024, 64, 2, False, "fwd")
    assert (
        memory.predicted_peak_bytes(*args, window=(64, 0)) == memory.predicted_peak_bytes(*args) + 1024 * 1024
    )
    naive = io_model.hbm_traffic("naive", 1, 2, 2, 1024, 1024, 64, 2, False, "fwd", window=(64, 0))
    assert "build window mask (bool)" in naive.as_dict()


# ---------------------------------------------------------------------------------------------- end to end
def test_cpu_sweep_window_rows_flops_and_unsupported_reasons(tmp_path):
    out = tmp_path / "run"
    args = ["sweep", *TINY, "--providers", "naive,sdpa-math,sdpa-flash", "--seq", "160", "--causal", "true"]
    assert main([*args, "--window", "-1,-1;24,-1", "--mode", "fwd+bwd", "--out", str(out)]) == 0
    rows = {(r.provider, r.window): r for r in read_rows(out, latest_only=False)}
    assert set(rows) == {(p, w) for p in ("naive", "sdpa-math", "sdpa-flash") for w in ("", "24,0")}
    for provider in ("naive", "sdpa-math"):
        row = rows[(provider, "24,0")]
        assert row.status == "ok" and row.rel_err <= row.err_budget, row.reason
        # 3.5 x 4 B H d pairs, pairs = 25 * 160 - 24 * 25 / 2 = 3700
        assert row.flops == 3.5 * 4 * 1 * 2 * 16 * 3700
        assert row.key.endswith("|win24,0") and rows[(provider, "")].key.endswith("|fwd+bwd")
    assert rows[("sdpa-flash", "24,0")].status == "unsupported"
    assert rows[("sdpa-flash", "24,0")].reason == "sdpa-flash takes no sliding window (window 24,0)"
    assert rows[("sdpa-flash", "")].status == "ok"


@pytest.mark.skipif(importlib.util.find_spec("flashbench.kernels") is None, reason="bundled kernels missing")
@interpreter_sweep
def test_bundled_triton_runs_a_window_case_through_the_interpreter(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["sweep", *TINY, "--head-dim", "32", "--providers", "triton", "--seq", "160", "--causal", "true"]
    assert main([*args, "--window", "40,0", "--mode", "fwd,fwd+bwd", "--out", str(out), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["counts"] == {"ok": 2}
    for row in payload["rows"]:
        assert row["window"] == "40,0" and row["rel_err"] <= row["err_budget"]
        assert row["kernel_config"]["BLOCK_M"] > 0  # the tl forward ran (what the row says ran)
