"""The exports can reproduce every number the page states: the summary's margins, ties, clocks, best % of
roofline and of the read bandwidth, and the decode rows' GB/s are recomputed here from the CSV export alone (with
the rules the JSON export states) and found, as printed, in the summary."""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from report_helpers import H100_DECODE, H100_SPEED, needs_plotly

from flashbench.report import build

COLUMNS_THE_PAGE_NEEDS = {
    "median_ms", "p20_ms", "p80_ms", "clock_mhz", "clock_source", "clock_reasons", "throttle_reasons",
    "throttled", "sm_clock_mhz", "power_w", "pct_of_roofline", "bound", "attainable_tflops", "ai_compulsory",
    "pct_of_own_roofline", "own_bound", "achieved_gb_s", "read_bw_gb_s", "datasheet_bw_gb_s", "pct_of_read_bw",
    "pct_of_datasheet_bw", "model_bytes_provider", "timed_as", "host_ms", "loop_ms", "host_bound", "energy_j",
    "tflop_per_j", "tokens_per_j", "variant", "serving",
}  # fmt: skip


def exported(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ok rows of the CSV export (numbers as floats) and the JSON export."""
    rows = []
    for r in csv.DictReader(io.StringIO(build(run, fmt="csv"))):
        if r["status"] != "ok" or r["above_roofline"] == "True":
            continue
        rows.append({k: _number(v) for k, v in r.items()})
    return rows, json.loads(build(run, fmt="json"))


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def leads_from_csv(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per group (mode, d, mask, variant): the fastest, runner-up, margin, noise, clocks and tie, by the rules the
    JSON export states (tie_rule), from the CSV's median_ms, p20_ms, p80_ms and clock_mhz alone."""
    groups: dict[str, dict[str, dict[str, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        group = (
            f"{r['mode']} · d={int(r['head_dim'])} · {'causal' if r['causal'] == 'True' else 'non-causal'}"
        )
        group += f" · {r['variant']}" if r["variant"] else ""
        groups[group][r["provider"]][r["key"].split("|", 1)[1]] = r
    out = {}
    for group, by_provider in groups.items():
        names = list(by_provider)
        if len(names) < 2:
            continue

        def margin(p: str, q: str) -> float:
            shared = by_provider[p].keys() & by_provider[q].keys()
            return statistics.geometric_mean(
                by_provider[q][k]["median_ms"] / by_provider[p][k]["median_ms"] for k in shared
            )

        worst = {p: min((margin(p, q), q) for q in names if q != p) for p in names}
        fastest = max(names, key=lambda p: worst[p][0])
        value, runner = worst[fastest]
        shared = sorted(by_provider[fastest].keys() & by_provider[runner].keys())
        noise = statistics.median(
            sum(
                (x["p80_ms"] - x["p20_ms"]) / (2 * x["median_ms"])
                for x in (by_provider[fastest][k], by_provider[runner][k])
            )
            for k in shared
        )
        clocks = [
            statistics.median(by_provider[p][k]["clock_mhz"] for k in shared) for p in (fastest, runner)
        ]
        gap = max(clocks[0] / clocks[1] - 1, 0.0)
        out[group] = {
            "fastest": fastest, "runner_up": runner, "geomean": value, "noise": noise, "clocks": clocks,
            "tied": value - 1 <= noise + gap,
        }  # fmt: skip
    return out


@pytest.mark.parametrize("run", [H100_SPEED, H100_DECODE], ids=lambda p: p.name)
def test_every_number_of_the_summary_comes_back_from_the_csv(run: Path) -> None:
    rows, doc = exported(run)
    assert COLUMNS_THE_PAGE_NEEDS <= set(rows[0])
    md = build(run, fmt="md")
    leads = leads_from_csv(rows)
    assert leads and {x["group"] for x in doc["leads"] if x["runner_up"]} == set(leads)
    for record in doc["leads"]:
        group = record["group"]
        if group not in leads:
            continue
        mine = leads[group]
        assert (record["fastest"], record["runner_up"], record["tied"]) == (
            mine["fastest"],
            mine["runner_up"],
            mine["tied"],
        )
        assert record["geomean"] == pytest.approx(mine["geomean"]) and record["noise"] == pytest.approx(
            mine["noise"]
        )
        line = next(x for x in md.splitlines() if x.startswith(f"- {group}:"))
        name = mine["fastest"] if mine["tied"] else f"**{mine['fastest']}**"
        assert (
            f"{'tied: ' if mine['tied'] else ''}{name} {mine['geomean']:.2f}× over {mine['runner_up']}"
            in line
        )
        assert f"noise ±{100 * mine['noise']:.1f}%" in line
        a, b = mine["clocks"]
        assert (f"SM clock {a:.0f} vs {b:.0f} MHz" in line) == (abs(a / b - 1) >= 0.01), line
        members = [r for r in rows if _group(r) == group]
        if members[0]["serving"] == "True":  # the best share of the calibrated read bandwidth, with its GB/s
            top = max(members, key=lambda r: r["pct_of_read_bw"])
            assert top["achieved_gb_s"] == pytest.approx(top["model_bytes_provider"] / top["median_ms"] / 1e6)
            assert top["pct_of_read_bw"] == pytest.approx(100 * top["achieved_gb_s"] / top["read_bw_gb_s"])
            assert f"best {top['pct_of_read_bw']:.0f}% of calibrated read BW ({top['provider']}" in line
            assert f"{top['achieved_gb_s']:.0f} GB/s)" in line
        else:  # the best % of the one roof per case, and the case's bound
            top = max(members, key=lambda r: r["pct_of_roofline"])
            assert top["pct_of_roofline"] == pytest.approx(100 * top["tflops"] / top["attainable_tflops"])
            assert f"best {top['pct_of_roofline']:.0f}% of roofline ({top['provider']}" in line
            assert f"{top['bound']})" in line

    # the clock sentence: the range of the case clocks, and how many ran throttled
    clocks = [r["clock_mhz"] for r in rows]
    span = f"{min(clocks):.0f}" if min(clocks) == max(clocks) else f"{min(clocks):.0f}–{max(clocks):.0f}"
    throttled = sum(r["throttled"] == "True" for r in rows)
    assert f"ran at SM clocks of {span} MHz" in md
    assert (f"{throttled} of {len(rows)} ran throttled" in md) if throttled else ("none ran throttled" in md)


def _group(r: dict[str, Any]) -> str:
    group = f"{r['mode']} · d={int(r['head_dim'])} · {'causal' if r['causal'] == 'True' else 'non-causal'}"
    return group + (f" · {r['variant']}" if r["variant"] else "")


def test_the_rows_above_the_read_bandwidth_are_explained_with_the_csvs_numbers() -> None:
    rows, _ = exported(H100_DECODE)
    over = [r for r in rows if r["pct_of_read_bw"] > 100]
    assert len(over) == 2
    md = build(H100_DECODE, fmt="md")
    lo, hi = sorted(r["achieved_gb_s"] for r in over)
    pct = sorted(r["pct_of_read_bw"] for r in over)
    sheet = sorted(r["pct_of_datasheet_bw"] for r in over)
    assert (
        f"read at {lo:.0f}–{hi:.0f} GB/s, {pct[0]:.1f}–{pct[1]:.1f}% of the calibrated {over[0]['read_bw_gb_s']:.0f} GB/s"
        in md
    )
    assert (
        f"these rows stay at {sheet[0]:.1f}–{sheet[1]:.1f}% of the datasheet's {over[0]['datasheet_bw_gb_s']:.0f} GB/s"
        in md
    )
    assert not math.isnan(over[0]["read_bw_gb_s"])


@needs_plotly
def test_the_page_and_the_exports_state_the_same_rules() -> None:
    _, doc = exported(H100_SPEED)
    page = build(H100_SPEED, fmt="html")
    assert (
        html.escape(doc["roof_rule"]) in page
    )  # the one roof per case, under the roofline and the best table
    assert re.search(r"one roof per case", doc["roof_rule"]) and "own traffic" in doc["roof_rule"]
