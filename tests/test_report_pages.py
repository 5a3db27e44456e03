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
import shutil
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from report_helpers import H100_DECODE, H100_SPEED, read_jsonl, slowed_copy
from test_report_browser import find_chromium, render

from flashbench.report import build
from flashbench.report.style import provider_color

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
    colors: (gd._fullData || []).filter((t) => t.name && (t.line || t.marker)).map((t) => [
      t.name, String((t.mode || "").includes("lines") ? t.line.color : t.marker.color)]),
    xs: (gd._fullData || []).filter((t) => t.name && t.visible === true && t.x).map((t) => [
      t.name, [...t.x].filter((v) => v !== null)]),
    xrange: gd._fullLayout.xaxis ? gd._fullLayout.xaxis.range : null,
    background: gd._fullLayout.plot_bgcolor,
    yticks: [...gd.querySelectorAll(".yaxislayer-above .ytick text")].map((t) => t.textContent),
    points: (gd._fullData || [])
      .filter((t) => t.visible === true && (t.mode || "").includes("markers") && t.x && !/^ridge/.test(t.name))
      .reduce((n, t) => n + [...t.x].filter((v) => v !== null).length, 0),
    hidden: (gd._fullData || []).filter((t) => t.visible === "legendonly").map((t) => t.name),
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
) -> dict[tuple[Any, ...], tuple[str, str, float, dict[int, float], bool]]:
    """From raw rows: per (mode, head dim, causal) the provider whose smallest geometric-mean margin over any
    other provider is the largest, that runner-up, the margin, the ratio (runner-up / fastest) per N, and whether
    the margin is a tie: no more than the two rows' p20-p80 half-widths (relative, added, median over N) plus
    how much higher the fastest's median SM clock was than the runner-up's."""
    by_case: dict[tuple[Any, ...], dict[str, dict[int, dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for r in rows:
        if r["status"] == "ok":
            by_case[(r["mode"], r["head_dim"], r["causal"])][r["provider"]][r["seq_q"]] = r
    out = {}
    for group, by_provider in by_case.items():
        times = {p: {n: r["median_ms"] for n, r in tp.items()} for p, tp in by_provider.items()}
        best: tuple[float, str, str] | None = None
        for p, tp in times.items():
            margins = []
            for q, tq in times.items():
                common = sorted(tp.keys() & tq.keys())
                if q != p and common:
                    margins.append((statistics.geometric_mean([tq[n] / tp[n] for n in common]), q))
            worst = min(margins)
            if best is None or worst[0] > best[0]:
                best = (worst[0], p, worst[1])
        assert best is not None
        margin, p, q = best
        common = sorted(times[p].keys() & times[q].keys())

        def half(r: dict[str, Any]) -> float:
            return (r["p80_ms"] - r["p20_ms"]) / (2 * r["median_ms"])

        noise = statistics.median(half(by_provider[p][n]) + half(by_provider[q][n]) for n in common)
        clock = [statistics.median(by_provider[x][n]["sm_clock_mhz"] for n in common) for x in (p, q)]
        tied = margin - 1 <= noise + max(clock[0] / clock[1] - 1, 0.0)
        out[group] = (p, q, margin, {n: times[q][n] / times[p][n] for n in common}, tied)
    return out


def colours_by_provider(record: dict[str, Any], providers: set[str]) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = defaultdict(set)
    for plot in record["plots"]:
        for name, colour in plot["colors"]:
            if name in providers:
                seen[name].add(colour)
    return seen


def states_the_fastest(
    browser: str, run: Path, tmp_path: Path
) -> tuple[dict[tuple[Any, ...], tuple[str, str, float, dict[int, float], bool]], str]:
    """Check that `run`'s report names each group's fastest provider as the rows do, in bold only where it is no
    tie; (the groups, fastest_per_group's, and the words the browser shows)."""
    dom, words, record = rendered(browser, run, tmp_path)
    assert record["errors"] == []
    rows = read_jsonl(run)
    groups = fastest_per_group(rows)
    assert len(groups) == 8  # 2 modes x 2 head dims x 2 masks
    for (mode, d, causal), (fastest, runner, margin, ratios, tied) in groups.items():
        mask = "causal" if causal else "non-causal"
        lo_n, hi_n = min(ratios, key=ratios.__getitem__), max(ratios, key=ratios.__getitem__)
        expected = (
            f"{mode} · d={d} · {mask}: {'tied: ' if tied else ''}{fastest} {margin:.2f}× over {runner} "
            f"({ratios[lo_n]:.2f}× at N={n_label(lo_n)} … {ratios[hi_n]:.2f}× at N={n_label(hi_n)}"
        )
        assert expected in words, expected
    # a tie is no win: its provider is not in bold
    summary = re.search(r'<section id="summary">(.*?)</section>', dom, re.S).group(1)
    for (mode, d, causal), (fastest, *_, tied) in groups.items():
        line = re.search(
            rf"<li>{re.escape(mode)} · d={d} · {'causal' if causal else 'non-causal'}:.*?</li>", summary
        )
        assert line and (f"<strong>{fastest}</strong>" in line.group(0)) == (not tied), line and line.group(0)
    return groups, words


def test_run_report_in_chromium_states_the_fastest_from_the_rows(browser: str, tmp_path: Path) -> None:
    groups, words = states_the_fastest(browser, H100_SPEED, tmp_path)
    assert not all(v[4] for v in groups.values())  # the committed run has wins (ties: the next test)
    assert "Not installed, so neither cases nor providers here: flash-attn, flash-attn-3." in words
    assert "120 cases, all ok" in words  # the 80 unavailable rows are no cases
    assert "Measured roof: the calibration ran on a throttled GPU (bf16 matmul: sw power cap" in words


def test_a_tie_is_stated_as_one_and_its_provider_not_in_bold(browser: str, tmp_path: Path) -> None:
    """The committed run with cuDNN's forward at d = 128 without a mask made 0.2% slower than the bundled one's
    (inside any row's p20-p80 band): that group's verdict is a tie, the others keep theirs."""
    rows = read_jsonl(H100_SPEED)
    group = ("fwd", 128, False)
    ours = {r["seq_q"]: r["median_ms"] for r in rows if r["provider"] == "triton" and r["status"] == "ok"
            and (r["mode"], r["head_dim"], r["causal"]) == group}  # fmt: skip

    def factor(r: dict[str, Any]) -> float:
        return (
            1.002 * ours[r["seq_q"]] / r["median_ms"]
            if (r["mode"], r["head_dim"], r["causal"]) == group
            else 1.0
        )

    tie = slowed_copy(H100_SPEED, tmp_path / "tie", "sdpa-cudnn", factor)
    groups, _ = states_the_fastest(browser, tie, tmp_path)
    assert groups[group][:2] == ("triton", "sdpa-cudnn") and groups[group][4]


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
    assert (
        f"Gate against h100-speed: FAIL (catching 5% slowdowns where the noise allows). {ok_both} cases compared;"
        in words
    )
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
    (heads over KV heads, contiguous or paged), never GQA and MHA or paged and contiguous caches as one group, a
    lead inside its noise is a tie, and the headline is GB/s against the calibrated read bandwidth."""
    dom, words, record = rendered(browser, H100_DECODE, tmp_path)
    assert record["errors"] == []
    assert '<section id="decode">' in dom
    rows = [r for r in read_jsonl(H100_DECODE) if r["status"] == "ok"]
    by_variant: dict[tuple[int, str], dict[str, dict[int, dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for r in rows:
        layout = "contiguous" if r["kv_layout"] == "contiguous" else f"paged{r['page_size']}"
        by_variant[(r["kv_heads"], layout)][r["provider"]][r["seq_k"]] = r
    assert set(by_variant) == {(8, "contiguous"), (32, "contiguous"), (8, "paged16"), (32, "paged16")}
    ties = set()
    for (kv, layout), by_provider in by_variant.items():
        group = f"fwd · d=128 · causal · 32/{kv} heads · {layout}: "
        if len(by_provider) == 1:  # SDPA takes no paged cache: the bundled kernel alone
            assert f"{group}triton-decode (the only provider measured)" in words
            continue
        times = {p: {n: r["median_ms"] for n, r in tp.items()} for p, tp in by_provider.items()}
        margins = {
            p: min(
                (statistics.geometric_mean([tq[n] / tp[n] for n in tp.keys() & tq.keys()]), q)
                for q, tq in times.items()
                if q != p
            )
            for p, tp in times.items()
        }
        fastest = max(margins, key=lambda p: margins[p][0])
        margin, runner = margins[fastest]
        common = sorted(times[fastest].keys() & times[runner].keys())
        noise = statistics.median(
            sum((by_provider[x][n]["p80_ms"] - by_provider[x][n]["p20_ms"]) / (2 * by_provider[x][n]["median_ms"])
                for x in (fastest, runner))
            for n in common
        )  # fmt: skip
        tied = margin - 1 <= noise  # every decode row ran at 1980 MHz: no clock advantage
        ties |= {(kv, layout)} if tied else set()
        expected = f"{group}{'tied: ' if tied else ''}{fastest} {margin:.2f}× over {runner}"
        assert expected in words, expected
    assert ties == set()  # triton-decode 1.03x (GQA) and 1.01x (MHA) over cuDNN, past a 2.8% and a 0.7% noise

    # the headline: the best share of the calibrated read bandwidth, and the rows above it explained
    read = json.loads((H100_DECODE / "env.json").read_text())["calibration"]["read_bw_gb_s"]
    over = sorted(r["provider"] for r in rows if serving_gb_s(r) > read)
    assert over == ["sdpa-cudnn", "triton-decode"]  # at 128k, 32/32 heads: 100.7% and 101.2%
    top = max(serving_gb_s(r) for r in rows)
    assert (
        f"best {100 * top / read:.0f}% of calibrated read BW (triton-decode, N=1×128k batch 1, {top:.0f} GB/s)"
        in words
    )
    assert "2 serving rows" in words and f"% of the calibrated {read:.0f} GB/s" in words
    assert "a lower bound of what the memory delivers, not its ceiling" in words

    plots = {p["title"]: p for p in record["plots"]}
    lengths = {r["seq_k"] for r in rows}
    assert not [t for t in plots if "TFLOP/s against" in t]  # a decode's TFLOP/s says nothing: not drawn
    speed = [p for t, p in plots.items() if t.startswith(("Decode,", "Latency", "Speedup", "Peak memory"))]
    assert len(speed) == 5  # two decode figures (GQA, MHA), latency, speedup, memory
    for plot in speed:
        xs = {x for name, values in plot["xs"] for x in values if not name.startswith("roof:")}
        assert xs and xs <= lengths, (plot["title"], xs)  # the KV length, never N = seq_q = 1
        assert plot["background"] == "white"  # the report's theme, not plotly's default grey
    for title in [t for t in plots if t.startswith("Decode,")]:
        names = [n for n, _ in plots[title]["colors"]]
        assert (
            f"roof: calibrated read BW {read:.0f} GB/s" in names and "roof: datasheet BW 3350 GB/s" in names
        )
    colours = colours_by_provider(record, {"triton-decode", "sdpa-cudnn", "sdpa-flash"})
    for provider, seen in colours.items():
        assert seen == {provider_color(provider)}, (provider, seen)  # the fixed colours, in every figure
    decode_colours = {
        c
        for t, p in plots.items()
        if t.startswith("Decode,")
        for n, c in p["colors"]
        if n.startswith("triton-decode")
    }
    assert decode_colours == {provider_color("triton-decode")}  # lines and legend agree

    (roof,) = [p for t, p in plots.items() if t.startswith("Roofline, bf16")]
    lo, hi = (10**x for x in roof["xrange"])
    assert 0.1 < lo < 1 and 4 < hi < 100  # the points' 1-4 FLOP/B, not an axis to 10^4
    assert any(
        a.startswith("compute roofs start at the ridge (datasheet: 295 FLOP/B)") for a in roof["annotations"]
    )


def serving_gb_s(row: dict[str, Any]) -> float:
    """A decode row's GB/s from its raw fields: K and V of every KV head over the cache, Q and O of every query
    head (bf16), over the median time; the bundled kernel's split partials as its kernel_config reports them."""
    b, h, kv, nq, nk, d = (row[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim"))
    nbytes = 2 * (2 * b * kv * nk * d + 2 * b * h * nq * d)
    splits = (row.get("kernel_config") or {}).get("num_splits", 1)
    if splits > 1:
        nbytes += 2 * splits * b * h * nq * (d + 1) * 4
    return nbytes / (row["median_ms"] * 1e-3) / 1e9


def test_the_roofline_reads_at_a_glance(browser: str, tmp_path: Path) -> None:
    """One marker per case (the own-traffic points on demand), labelled ticks between the decades, the ridge's
    label clear of the bandwidth slope, refusal reasons cut at a word, the best table sorted in one precision."""
    from flashbench.analysis.runs import load_run
    from flashbench.report import roofline_figure

    dom, _, record = rendered(browser, H100_SPEED, tmp_path)
    (roof,) = [p for p in record["plots"] if p["title"].startswith("Roofline, bf16")]
    cases = sum(r["status"] == "ok" for r in read_jsonl(H100_SPEED))
    assert roof["points"] == cases  # 120 markers for 120 cases, not 240
    assert any(n.startswith("open: at its own traffic's intensity, with L2 reuse") for n in roof["hidden"])
    assert any(n.startswith("open: at its own traffic's intensity, no L2 reuse") for n in roof["hidden"])
    assert len(roof["yticks"]) >= 3 and {"100", "200", "500", "1000"} <= set(roof["yticks"])
    fig = roofline_figure.roofline(load_run(H100_SPEED), "bf16")
    (ridge,) = [a for a in fig.layout.annotations if a.text.startswith("ridge ")]
    assert ridge.ax > 0 and ridge.ay > 0 and ridge.xanchor == "left"  # below-right: the slope runs below-left

    best = re.search(r'<section id="best">(.*?)</section>', dom, re.S).group(1)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", best)[1:]]
    header = re.findall(r"<th>(.*?)</th>", best)
    tflops = [float(c[header.index("max TFLOP/s")]) for c in cells]
    modes = [c[header.index("mode")] for c in cells]
    assert modes == sorted(modes, key=["fwd", "bwd", "fwd+bwd"].index)
    for mode in set(modes):
        mine = [t for t, m in zip(tflops, modes, strict=True) if m == mode]
        assert mine == sorted(mine, reverse=True)
    for col in ("max TFLOP/s", "median % of roofline"):
        assert all(re.fullmatch(r"\d+\.\d", c[header.index(col)]) for c in cells), col  # one decimal, always


def test_refusal_reasons_are_cut_at_a_word(browser: str, tmp_path: Path) -> None:
    dom, _, _ = rendered(browser, H100_DECODE, tmp_path)
    failed = html.unescape(re.search(r'<section id="failed">(.*?)</section>', dom, re.S).group(1))
    reasons = {r["reason"] for r in read_jsonl(H100_DECODE) if r["status"] == "unsupported"}
    shown = [c for c in re.findall(r"<td[^>]*>(.*?)</td>", failed) if c.endswith(" …")]
    assert shown, "no reason was cut: the 800-character sdpa-efficient refusal must be"
    for text in shown:
        prefix = text[: -len(" …")]
        full = next(r for r in reasons if " ".join(r.split()).startswith(prefix))
        rest = " ".join(full.split())[len(prefix) :]
        assert rest.startswith(" ") or rest[:1] in ",;:", (prefix[-20:], rest[:20])  # never mid-word


def test_a_run_compared_with_itself_is_flagged(browser: str, tmp_path: Path) -> None:
    _, words, record = rendered(browser, H100_SPEED, tmp_path, baseline=H100_SPEED)
    assert record["errors"] == []
    assert (
        "The baseline is this run itself (the same directory): every ratio below is 1 by construction"
        in words
    )
    copy = tmp_path / "copy"
    shutil.copytree(H100_SPEED, copy)
    _, words, _ = rendered(browser, copy, tmp_path, baseline=H100_SPEED)
    assert "The baseline is this run itself (every case has the same raw samples)" in words
    slower = slowed_copy(H100_SPEED, tmp_path / "slower", "triton", lambda row: 1.05)
    _, words, _ = rendered(browser, slower, tmp_path, baseline=H100_SPEED)
    assert "The baseline is this run itself" not in words
