"""benchmarks/turns.py: one sweep in rounds, the providers' order reversed every other round, and its summary."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scripts_helpers import load_script

from flashbench.results.rows import Row, append_row

turns = load_script("benchmarks/turns.py")


def test_rounds_alternate_the_order_and_replace_only_the_providers():
    args = ["--config", "x.toml", "--providers", "a,b,c", "--seq", "2048"]
    names, at = turns.providers_of(args)
    assert (names, at) == (["a", "b", "c"], 2)
    assert [turns.round_order(names, r) for r in (1, 2, 3)] == [
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["a", "b", "c"],
    ]
    cmd = turns.sweep_command(args, ["c", "b", "a"], at, Path("RUN/round-2"))
    assert cmd[:4] == [sys.executable, "-m", "flashbench", "sweep"]
    assert cmd[4:] == ["--config", "x.toml", "--providers", "c,b,a", "--seq", "2048", "--out", "RUN/round-2"]
    assert args[3] == "a,b,c"  # the caller's list is left as it was
    eq = ["--providers=a,b", "--seq", "1024"]
    names, at = turns.providers_of(eq)
    assert turns.sweep_command(eq, ["b", "a"], at, Path("R"))[4:] == [
        "--providers=b,a",
        "--seq",
        "1024",
        "--out",
        "R",
    ]
    assert turns.providers_of(["--seq", "1024"]) == ([], -1)


def _row(provider: str, seq: int, ms: float | None) -> Row:
    shape = dict(
        batch=8, heads=16, kv_heads=16, seq_q=seq, seq_k=seq, head_dim=128, dtype="bf16", causal=True
    )
    if ms is None:
        return Row(provider=provider, **shape, mode="fwd", status="crash", reason="boom")
    return Row(provider=provider, **shape, mode="fwd", status="ok", median_ms=ms, samples_ms=[ms])


def test_the_summary_gives_each_round_and_the_ratio_to_the_first_provider(tmp_path):
    """Per shape, in the first round's order: each provider's median per round ("-" where a round has no ok row)
    and its time over the first provider's in the same round, min..max and median; shapes do not mix."""
    rounds = [
        [("h4", 2048, 0.200), ("h8", 2048, 0.190), ("h4", 4096, 1.0), ("h8", 4096, None)],
        [("h8", 2048, 0.196), ("h4", 2048, 0.200), ("h8", 4096, 1.1), ("h4", 4096, 1.0)],
        [("h4", 2048, 0.210), ("h8", 2048, 0.210), ("h4", 4096, 1.0), ("h8", 4096, 1.2)],
    ]
    for r, rows in enumerate(rounds, start=1):
        folder = tmp_path / f"round-{r}"
        folder.mkdir()
        for provider, seq, ms in rows:
            append_row(folder, _row(provider, seq, ms))
    text = turns.summary(tmp_path).splitlines()
    first = text.index("b8 h16 kv16 q2048 k2048 d128 bf16 causal fwd")
    assert text[first + 4] == "| h4 | 0.2000 / 0.2000 / 0.2100 | 1.000..1.000 (median 1.000) |"
    assert text[first + 5] == "| h8 | 0.1900 / 0.1960 / 0.2100 | 0.950..1.000 (median 0.980) |"
    second = text.index("b8 h16 kv16 q4096 k4096 d128 bf16 causal fwd")
    assert text[second + 5] == "| h8 | - / 1.1000 / 1.2000 | 1.100..1.200 (median 1.150) |"
    with pytest.raises(SystemExit, match="no round-N folders"):
        turns.summary(tmp_path / "round-1")
