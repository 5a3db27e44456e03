"""Each kind of report, rendered in headless Chromium, read back as a reader sees it.

A probe script, put into a copy of the page ahead of plotly.js, collects every uncaught error and console.error,
and once the page has drawn writes into the DOM what the browser holds: each figure's trace colours (plotly's
resolved data) and the text of the annotations it drew on the charts. Chromium's --dump-dom hands that back.
The verdict's numbers are checked against numbers computed here from the rows.jsonl files, not from flashbench.
"""

from __future__ import annotations

import html
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from report_helpers import H100_DECODE, H100_SPEED, read_jsonl, slowed_copy
from test_report_browser import find_chromium, render

from flashbench.report import build

pytest.importorskip("plotly", reason="the HTML report needs plotly (the GPU machine has none)")

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC = ROOT / "tests" / "fixtures" / "synthetic-h100"
PROBE = """<script>
window.__errors = [];
window.addEventListener("error", (e) => window.__errors.push(String(e.message)));
(function () {
  const original = console.error;
  console.error = function (...args) { window.__errors.push(args.map(String).join(" ")); original.apply(console, args); };
})();
window.addEventListener("load", () => setTimeout(() => {
  const plots = [...document.querySelectorAll(".js-plotly-plot")].map((gd) => ({
    title: (gd.layout.title && gd.layout.title.text) || "",
    colors: (gd._fullData || []).filter((t) => t.name).map((t) => [
      t.name, String((t.mode || "").includes("lines") ? t.line.color : t.marker.color)]),
    annotations: [...gd.querySelectorAll(".annotation-text")].map((a) => a.textContent),
  }));
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({errors: window.__errors, plots: plots});
  document.body.appendChild(out);
}, 300));
</script>"""


@pytest.fixture(scope="module")
def browser() -> str:
    return find_chromium()


def rendered(chromium: str, run: Path, tmp_path: Path, **kw: Any) -> tuple[str, str, dict[str, Any]]:
    """(the DOM, the summary section's text as the browser shows it, the probe's record) for `run`'s report."""
    page = tmp_path / f"{run.name}.html"
    text = build(run, fmt="html", **kw)
    page.write_text(text.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    dom, requests = render(chromium, page)
    assert requests == []
    probe = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert probe, "the probe never ran: the page did not finish loading"
    record = json.loads(html.unescape(probe.group(1)))
    summary = re.search(r'<section id="summary">(.*?)</section>', dom, re.S)
    assert summary
    words = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", summary.group(1))))
    return dom, words, record


@pytest.fixture(scope="module")
def speed_page(browser: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, dict[str, Any]]:
    """The H100 speed run's report as rendered, shared by the tests that only read it (a render takes 5-14 s)."""
    return rendered(browser, H100_SPEED, tmp_path_factory.mktemp("speed"))


def n_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def fastest_per_group(
    rows: list[dict[str, Any]],
) -> dict[tuple[Any, ...], tuple[str, str, float, dict[int, float]]]:
    """From raw rows: per (mode, head dim, causal) the provider whose smallest geometric-mean margin over any
    other provider is the largest, that runner-up, the margin, and the ratio (runner-up / fastest) per N."""
    times: dict[tuple[Any, ...], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        if r["status"] == "ok":
            times[(r["mode"], r["head_dim"], r["causal"])][r["provider"]][r["seq_q"]] = r["median_ms"]
    out = {}
    for group, by_provider in times.items():
        best: tuple[float, str, str] | None = None
        for p, tp in by_provider.items():
            margins = []
            for q, tq in by_provider.items():
                common = sorted(tp.keys() & tq.keys())
                if q != p and common:
                    margins.append((statistics.geometric_mean([tq[n] / tp[n] for n in common]), q))
            worst = min(margins)
            if best is None or worst[0] > best[0]:
                best = (worst[0], p, worst[1])
        assert best is not None
        margin, p, q = best
        common = sorted(by_provider[p].keys() & by_provider[q].keys())
        out[group] = (p, q, margin, {n: by_provider[q][n] / by_provider[p][n] for n in common})
    return out


def colours_by_provider(record: dict[str, Any], providers: set[str]) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = defaultdict(set)
    for plot in record["plots"]:
        for name, colour in plot["colors"]:
            if name in providers:
                seen[name].add(colour)
    return seen


def test_run_report_in_chromium_states_the_fastest_from_the_rows(
    speed_page: tuple[str, str, dict[str, Any]],
) -> None:
    _, words, record = speed_page
    assert record["errors"] == []
    rows = read_jsonl(H100_SPEED)
    groups = fastest_per_group(rows)
    assert len(groups) == 8  # 2 modes x 2 head dims x 2 masks
    for (mode, d, causal), (fastest, runner, margin, ratios) in groups.items():
        mask = "causal" if causal else "non-causal"
        lo_n, hi_n = min(ratios, key=ratios.__getitem__), max(ratios, key=ratios.__getitem__)
        expected = (
            f"{mode} · d={d} · {mask}: {fastest} {margin:.2f}× over {runner} "
            f"({ratios[lo_n]:.2f}× at N={n_label(lo_n)} … {ratios[hi_n]:.2f}× at N={n_label(hi_n)}"
        )
        assert expected in words, expected
    # what the committed H100 run shows: triton leads the d=64 non-causal and d=128 causal forwards and every
    # fwd+bwd group, cuDNN the other two forwards
    assert groups[("fwd", 64, False)][0] == groups[("fwd", 128, True)][0] == "triton"
    assert all(groups[("fwd+bwd", d, causal)][0] == "triton" for d in (64, 128) for causal in (False, True))
    assert groups[("fwd", 64, True)][0] == groups[("fwd", 128, False)][0] == "sdpa-cudnn"
    assert "Not installed, so neither cases nor providers here: flash-attn, flash-attn-3." in words
    assert "120 cases, all ok" in words  # the 80 unavailable rows are no cases
    assert "Measured roof: the calibration ran on a throttled GPU (bf16 matmul: sw power cap" in words


def test_roofs_and_ridge_are_named_on_the_roofline(speed_page: tuple[str, str, dict[str, Any]]) -> None:
    from flashbench.analysis.runs import load_run

    _, _, record = speed_page
    (roof,) = [p for p in record["plots"] if p["title"].startswith("Roofline, bf16")]
    notes = roof["annotations"]
    datasheet, nvml, measured = load_run(H100_SPEED).ceilings
    ridge = datasheet.peak("bf16") / datasheet.bw_bytes_s
    for text in (
        f"ridge {ridge:.0f} FLOP/B",
        f"datasheet {datasheet.peak('bf16') / 1e12:.0f} TFLOP/s",
        f"NVML-derived {nvml.peak('bf16') / 1e12:.0f} TFLOP/s",
        f"{datasheet.bw_bytes_s / 1e12:.2f} TB/s · NVML-derived = datasheet",  # equal slopes: one line, said so
        f"measured (throttled calibration: not a ceiling) {measured.peak('bf16') / 1e12:.0f} TFLOP/s",
    ):
        assert text in notes, (text, notes)
    assert "ridge 295 FLOP/B" in notes  # 989.4 TFLOP/s / 3.35 TB/s on the H100 SXM datasheet


def test_a_provider_keeps_its_colour_in_every_report(
    browser: str, speed_page: tuple[str, str, dict[str, Any]], tmp_path: Path
) -> None:
    _, _, first = speed_page  # triton, sdpa-flash, sdpa-cudnn
    _, _, second = rendered(browser, SYNTHETIC, tmp_path)  # naive, sdpa-math, sdpa-flash, triton, ...
    assert first["errors"] == [] and second["errors"] == []
    a = colours_by_provider(first, {"triton", "sdpa-flash", "sdpa-cudnn"})
    b = colours_by_provider(second, {"triton", "sdpa-flash", "naive"})
    for provider in ("triton", "sdpa-flash"):
        assert len(a[provider]) == 1 and a[provider] == b[provider], (provider, a[provider], b[provider])
    assert len({next(iter(a[p])) for p in a} | {next(iter(b["naive"]))}) == 4  # four providers, four colours


def test_report_with_a_baseline_leads_with_the_gate_and_its_worst_case(browser: str, tmp_path: Path) -> None:
    def factor(row: dict[str, Any]) -> float:  # triton slower now, by 6% to 13%: one case the worst
        worst = row["mode"] == "fwd+bwd" and row["causal"] and row["head_dim"] == 128
        return 1.06 + 0.01 * math.log2(row["seq_q"] / 1024) + (0.03 if worst else 0.0)

    current = slowed_copy(H100_SPEED, tmp_path / "slower", "triton", factor)
    dom, words, record = rendered(browser, current, tmp_path, baseline=H100_SPEED)
    assert record["errors"] == []
    before = {
        json.dumps([r[k] for k in ("provider", "seq_q", "head_dim", "causal", "mode")]): r
        for r in read_jsonl(H100_SPEED)
    }
    ratios = []
    for r in read_jsonl(current):
        b = before[json.dumps([r[k] for k in ("provider", "seq_q", "head_dim", "causal", "mode")])]
        if r["status"] == "ok" and r["provider"] == "triton":
            ratios.append((statistics.median(r["samples_ms"]) / statistics.median(b["samples_ms"]), r))
    ratio, worst = max(ratios, key=lambda x: x[0])
    mask = "causal" if worst["causal"] else "non-causal"
    ok_both = sum(r["status"] == "ok" for r in read_jsonl(H100_SPEED))  # the slowed copy keeps every status
    assert f"Gate against h100-speed: FAIL (threshold 5% slower). {ok_both} cases compared;" in words
    case = f"triton N={n_label(worst['seq_q'])} d={worst['head_dim']} {mask} {worst['mode']}: {ratio:.2f}× slower"
    assert f"Worst cases (now / before, median time): {case}" in words, case
    assert "In-run ratio: the bundled kernel's time over its reference provider's" in words
    assert "triton / sdpa-flash at" in words  # the in-run ratio that moved, named
    assert re.findall(r'class="block (\w+)"', dom)[0] == "fail"  # the verdict opens in the failing colour


def test_the_probe_catches_an_error_and_a_console_error(browser: str, tmp_path: Path) -> None:
    """The no-error checks above can fail: a page that throws and logs an error is caught."""
    page = tmp_path / "bad.html"
    body = "<script>console.error('drawn wrong'); undefined_function();</script>"
    page.write_text(f"<html><head>{PROBE}</head><body>{body}</body></html>")
    dom, _ = render(browser, page)
    record = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))
    assert record["errors"][0] == "drawn wrong" and "undefined_function" in record["errors"][1]


def test_decode_report_in_chromium_judges_each_cache_variant_from_the_rows(
    browser: str, tmp_path: Path
) -> None:
    """A serving run (the committed H100 decode sweep): the verdict names the fastest provider per KV-cache variant
    (heads over KV heads, contiguous or paged), never GQA and MHA or paged and contiguous caches as one group, and
    the decode section draws."""
    dom, words, record = rendered(browser, H100_DECODE, tmp_path)
    assert record["errors"] == []
    assert '<section id="decode">' in dom
    times: dict[tuple[int, str], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in read_jsonl(H100_DECODE):
        if r["status"] == "ok":
            variant = (
                r["kv_heads"],
                "contiguous" if r["kv_layout"] == "contiguous" else f"paged{r['page_size']}",
            )
            times[variant][r["provider"]][r["seq_k"]] = r["median_ms"]
    assert set(times) == {(8, "contiguous"), (32, "contiguous"), (8, "paged16"), (32, "paged16")}
    for (kv, layout), by_provider in times.items():
        group = f"fwd · d=128 · causal · 32/{kv} heads · {layout}: "
        if len(by_provider) == 1:  # SDPA takes no paged cache: the bundled kernel alone
            assert f"{group}**triton-decode** (the only provider measured)".replace("**", "") in words
            continue
        margins = {}
        for p, tp in by_provider.items():
            margins[p] = min(
                (statistics.geometric_mean([tq[n] / tp[n] for n in tp.keys() & tq.keys()]), q)
                for q, tq in by_provider.items()
                if q != p
            )
        fastest = max(margins, key=lambda p: margins[p][0])
        margin, runner = margins[fastest]
        assert f"{group}{fastest} {margin:.2f}× over {runner}" in words, (group, fastest, runner, margin)
