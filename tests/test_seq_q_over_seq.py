"""More query tokens than keys: defined without a mask (every query sees every key) and run; refused with one
line where a causal mask or a window's right bound leaves some query with no key at all, since such a row has
no attention to average and providers disagree on it (the naive provider's softmax gives NaN: `wrong` rows that
read as a kernel bug)."""

from __future__ import annotations

import pytest

from flashbench.cli.app import main
from flashbench.results.rows import read_rows
from flashbench.spec.window import keyless_queries

TINY = ["--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--dtype", "fp32"]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("seq_q", "seq_k", "causal", "window", "keyless"),
    [
        (64, 16, True, None, 48),  # bottom-right: query i sits at key i - 48
        (16, 16, True, None, 0),
        (1, 4096, True, None, 0),  # decode: the last token sees the whole cache
        (64, 16, False, None, 0),  # no mask: every query sees every key
        (64, 16, False, (8, 40), 8),  # the right side reaches 40 keys ahead
        (64, 16, False, (8, -1), 0),  # no right bound
        (64, 16, True, (4, -1), 48),  # causal folds in as right = 0
    ],
)
def test_keyless_queries_counts_the_rows_that_see_nothing(seq_q, seq_k, causal, window, keyless):
    assert keyless_queries(seq_q, seq_k, causal, window) == keyless


def test_causal_seq_q_over_seq_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "sweep",
        *TINY,
        "--providers",
        "naive,sdpa-math",
        "--seq-q",
        "64",
        "--seq",
        "16",
        "--out",
        str(out),
    ]
    assert main([*args, "--causal", "both"]) == 2
    line = _error_line(capsys)
    assert line == (
        "flashbench: error: seq-q 64 over seq 16, causal: 48 of the 64 queries would see no key (masks align "
        "bottom-right: query i sits at key i + seq - seq-q); with this mask seq-q may be at most 16, or use "
        "--causal false"
    )
    assert not out.exists()


def test_a_window_that_leaves_queries_keyless_is_refused(tmp_path, capsys):
    args = ["sweep", *TINY, "--providers", "naive", "--seq-q", "64", "--seq", "16", "--causal", "false"]
    assert main([*args, "--window", "8,40", "--out", str(tmp_path / "run")]) == 2
    assert "window 8,40: 8 of the 64 queries would see no key" in _error_line(capsys)


def test_ragged_lengths_shorter_than_the_queries_are_refused(tmp_path, capsys):
    args = [
        "sweep",
        *TINY[:2],
        "--batch",
        "4",
        *TINY[4:],
        "--providers",
        "naive",
        "--seq-q",
        "16",
        "--seq",
        "16",
    ]
    assert main([*args, "--seqlens", "random", "--causal", "true", "--out", str(tmp_path / "run")]) == 2
    assert "(its shortest sequence: " in _error_line(capsys)


def test_seq_q_over_seq_without_a_mask_runs_and_every_row_is_right(tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "sweep",
        *TINY,
        "--providers",
        "naive,sdpa-math",
        "--seq-q",
        "64",
        "--seq",
        "16",
        "--causal",
        "false",
    ]
    assert main([*args, "--mode", "fwd,fwd+bwd", "--out", str(out)]) == 0
    rows = read_rows(out)
    assert len(rows) == 4 and all(r.status == "ok" and r.seq_q == 64 and r.seq_k == 16 for r in rows), [
        (r.provider, r.status, r.reason) for r in rows
    ]
