"""One self-contained, offline HTML page: plotly.js inlined once, no network request of any kind.

No CDN, no MathJax, no web fonts: the page opens from an e-mail attachment on a machine with no network. It
leads with the verdict (report/verdict.py: the same text as the markdown report), then the figures, then the
tables; the environment closes it.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from flashbench import __version__
from flashbench.analysis import clocks, host, serving, summary, walk
from flashbench.analysis.comparison import cross_gpu_note, same_gpu, same_run
from flashbench.analysis.modelled import ROOF_RULE
from flashbench.analysis.runs import failures, recompute_overhead
from flashbench.report import (
    compare,
    decode,
    figures,
    model_figures,
    roofline_figure,
    roofline_points,
    verdict,
)
from flashbench.report.tables import details, env_table, recompute_table, status_counts, table
from flashbench.report.tables import figure as _fig
from flashbench.results.rows import FLOP_CONVENTION

if TYPE_CHECKING:
    from flashbench.analysis.runs import Run

MAX_THROTTLED_ROWS = 30

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0;
       color: #1d1d1f; background: #f6f7f9; }
header { background: #14213d; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px 0; font-size: 22px; }
header .sub { color: #c9d1e3; font-size: 14px; }
nav { padding: 8px 32px; background: #e8ebf2; font-size: 14px; position: sticky; top: 0; z-index: 10; }
nav a { margin-right: 14px; color: #14213d; text-decoration: none; }
main { padding: 8px 32px 40px 32px; max-width: 1500px; }
section { background: #fff; border-radius: 8px; padding: 14px 20px; margin: 16px 0;
          box-shadow: 0 1px 3px rgba(0,0,0,.08); }
section h2 { font-size: 18px; margin: 4px 0 6px 0; }
p.note { color: #555; font-size: 13px; margin: 4px 0 10px 0; max-width: 1100px; }
.verdict .block { font-size: 14px; line-height: 1.45; padding: 2px 12px; margin: 6px 0; border-left: 4px solid #c9d1e3; }
.verdict .block p { margin: 6px 0; } .verdict .block ul { margin: 4px 0; padding-left: 20px; }
.verdict .block.warn { border-color: #e6a700; background: #fff8e1; }
.verdict .block.fail { border-color: #b00020; background: #fdecee; }
.verdict .block.pass { border-color: #1e8e3e; background: #e8f5ec; }
.verdict code, .note code { background: #f1f3f8; padding: 0 3px; border-radius: 3px; }
.banner { padding: 10px 16px; border-radius: 6px; margin: 12px 0; font-weight: 600; }
.banner.warn { background: #fff4d6; border: 1px solid #e6c200; }
.banner.info { background: #e6f0ff; border: 1px solid #8fb3ff; }
table.tbl { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
table.tbl th { background: #eef0f5; text-align: left; padding: 4px 10px; }
table.tbl td { padding: 3px 10px; border-top: 1px solid #e3e5ea; vertical-align: top; }
table.tbl td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.tbl td.name, .status-bad { white-space: nowrap; }
table.env th { width: 160px; }
pre.raw, pre.md { font-size: 12px; background: #f6f7f9; padding: 8px; overflow-x: auto; white-space: pre-wrap; }
details summary { cursor: pointer; color: #14213d; font-size: 14px; margin: 6px 0; }
.status-bad { color: #b00020; font-weight: 600; }
footer { color: #777; font-size: 12px; padding: 0 32px 24px 32px; }
"""


def render(
    run: Run, baseline_provider: str | None, baseline_run: Run | None = None, verdicts: Any = None
) -> str:
    """The whole page for `run`; with `baseline_run`, the two-run comparison (and the gate's verdicts) too."""
    import plotly.offline

    sections: list[str] = []
    nav: list[tuple[str, str]] = []

    def add(anchor: str, title: str, note: str, body: str) -> None:
        nav.append((anchor, title))
        sections.append(
            f'<section id="{anchor}"><h2>{html.escape(title)}</h2>'
            + (f'<p class="note">{note}</p>' if note else "")
            + body
            + "</section>"
        )

    frame = run.frame
    blocks = verdict.blocks(run, baseline_provider, baseline_run, verdicts)
    add("summary", "Summary", "", _verdict_html(blocks))
    # A serving run's headline is its bandwidth: the decode section leads; a training run's is its roofline.
    serving_first = bool(frame["serving"][frame["ok"]].mean() > 0.5) if frame["ok"].any() else False
    if serving_first:
        decode.html_section(run, add)
    _roofline_sections(run, baseline_run, add)
    _speed_sections(run, baseline_provider, add)
    fig = model_figures.memory(run)
    add(
        "memory",
        "Peak memory",
        "Bytes allocated above the inputs, from a separate untimed run, in GiB. Dotted lines: flashbench's memory "
        "model; red ✕: out of memory, ⊗: predicted not to fit and not run (both drawn at the model's bytes)."
        if fig is not None
        else "This run recorded no peak memory and no out-of-memory case.",
        _fig(fig) if fig is not None else "",
    )
    rc = recompute_overhead(frame)
    fig = model_figures.recompute(run, rc)
    if fig is not None:
        add(
            "recompute",
            "Recompute overhead",
            "FlashAttention's backward recomputes P from Q, K and the saved log-sum-exp instead of storing it. This "
            "compares the backward alone (--mode bwd) with the stored-P variant of the same kernel: the time "
            "recomputing costs (left; below 0 recomputing is faster than reading the stored P back; the dotted "
            "lines are the overhead if time followed the credited or the executed FLOPs) and the memory it saves "
            "(right). An empty cell in the table says why (OOM: that side ran out of memory).",
            _fig(fig) + details("Recompute overhead table", table(recompute_table(rc))),
        )
    if not serving_first:
        decode.html_section(run, add)
    fig = model_figures.hbm_bytes(run)
    if fig is not None:
        add("bytes", "Measured vs modelled HBM bytes", "Rows measured with sweep --ncu.", _fig(fig))
    elif not run.is_cpu:
        add(
            "bytes",
            "Measured vs modelled HBM bytes",
            "No DRAM bytes measured in this run, so the byte model stands unchecked here. Nsight Compute measures "
            "them per case: rerun the sweep with <code>flashbench sweep --ncu ...</code> on a machine with "
            "<code>ncu</code> (it replays each kernel, so keep the sweep small).",
            "",
        )
    if baseline_run is not None:
        anchor, title, note, body = compare.section(run, baseline_run, verdicts)
        add(anchor, title, note, body)
    _table_sections(run, add)

    head = _header(run, baseline_run)
    nav_html = "".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t in nav)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>flashbench report: {html.escape(run.name)}</title>"
        f"<style>{CSS}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
        f"</head><body>{head}<nav>{nav_html}</nav><main>{''.join(sections)}</main>"
        f"<footer>flashbench {__version__} · generated {stamp} · offline page, plotly.js embedded</footer>"
        "</body></html>\n"
    )


def _verdict_html(blocks: list[verdict.Block]) -> str:
    """The verdict's markdown rendered (raw HTML in it escaped), each block in its colour, and the same
    markdown collapsed under it, ready to paste into a pull request."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False})
    body = "".join(f'<div class="block {b.kind}">{md.render(b.markdown)}</div>' for b in blocks)
    text = "\n\n".join(b.markdown for b in blocks)
    paste = details(
        "The summary as markdown, to paste into a pull request", f'<pre class="md">{html.escape(text)}</pre>'
    )
    return f'<div class="verdict">{body}</div>{paste}'


def _roofline_sections(run: Run, baseline_run: Run | None, add: Any) -> None:
    # the baseline where it ran on another GPU: each GPU's roofline then gets its own panel
    other = baseline_run if baseline_run is not None and not same_gpu(run, baseline_run) else None
    dtypes = set(run.frame["dtype"]) | (set(other.frame["dtype"]) if other is not None else set())
    drawn = False
    for dtype in sorted(dtypes):
        if other is not None:
            fig = roofline_figure.roofline_compare([run, other], dtype)
            title = f"Roofline ({dtype}): {run.gpu_name} vs {other.gpu_name}"
            note = (
                "The two runs are from different GPUs: each panel is one GPU's ceilings with that run's points on "
                "them; the dotted faint line is the other GPU's datasheet roof. A point's % of roofline is against "
                "its own GPU. "
            )
        else:
            fig = roofline_figure.roofline(run, dtype)
            title, note = f"Roofline ({dtype})", ""
        if fig is None:
            continue
        drawn = True
        pts = roofline_figure.points(run, dtype)
        above = int(roofline_points.above_no_l2_roof(pts).sum()) if len(pts) else 0
        note += (
            "Each filled point is one measured case at its compulsory intensity (FLOPs over the bytes any exact "
            "attention must move), the same for every provider of the case, so providers compare by height: "
            f"colour: provider, symbol: mode and mask, size: N. <i>{html.escape(ROOF_RULE)}</i> Two legend entries "
            "show, on demand, the same measurements open at each implementation's own modelled intensity, with "
            "and without L2 reuse"
            + (
                f" (without it, {above} of {len(pts)} sit above the memory roof: the L2 cache serving re-reads "
                "the no-L2 model counts as DRAM traffic, not a kernel beating the hardware)."
                if above
                else "."
            )
        )
        add(f"roofline-{dtype}", title, note, _fig(fig))
    if run.is_cpu:
        add("roofline", "Roofline", "CPU run: there is no GPU roofline for CPU times.", "")
    elif not drawn:
        add(
            "roofline",
            "Roofline",
            "No roofline: the byte model or this GPU's ceilings are not available.",
            "",
        )


def _speed_sections(run: Run, reference: str | None, add: Any) -> None:
    t = clocks.throttling(run.frame, run.env)
    ring = ""
    if t.throttled:
        ring = (
            f" A dark ring marks a case measured while the GPU throttled ({t.throttled} of {t.cases}: "
            f"{html.escape(', '.join(t.reasons) or 'reason not recorded')}); its clock is in the hover."
        )
    for anchor, title, metric in (
        ("tflops", "TFLOP/s against N", "tflops"),
        ("latency", "Latency", "median_ms"),
    ):
        fig = figures.speed_vs_seq(run, metric)
        if fig is None:
            continue
        note = f"Only cases with status ok. FLOPs: {html.escape(FLOP_CONVENTION)}.{ring}"
        if metric == "tflops":
            note += " Panels of one mode share their scale; the dashed line is the GPU's datasheet peak."
            if run.frame["serving"].any():
                note += " Serving rows are left out: a decode's TFLOP/s says little; its GB/s is in the decode section."
        else:
            note += " Against the KV length (N for training rows, the cache length for serving rows)."
        add(anchor, title, note, _fig(fig))
    if reference:
        fig = figures.speedup(run, reference)
        if fig is not None:
            add(
                "speedup",
                f"Speedup over {reference}",
                f"{html.escape(reference)}'s median time / the provider's, same shape, both ok: above 1 the provider "
                f"is faster than {html.escape(reference)}. Another reference: <code>--speedup-vs NAME</code>.",
                _fig(fig),
            )


def _table_sections(run: Run, add: Any) -> None:
    frame = run.frame
    best = summary.best_per_provider(frame)
    if len(best):
        add(
            "best",
            "Best TFLOP/s per provider",
            html.escape(ROOF_RULE) + " Sorted by mode, then the highest TFLOP/s.",
            table(best, formats=summary.BEST_FORMATS),
        )
    walks = walk.walk_table(frame, walk.sm_count_of(run.env, run.gpu_spec))
    if len(walks):
        add(
            "walk",
            "SM fill of the bundled forward (modelled)",
            html.escape(walk.WALK_RULE) + " The least filled first.",
            details(f"{len(walks)} cases", table(walks, formats=walk.WALK_FORMATS)),
        )
    bw = serving.best_bandwidth(frame)
    if len(bw):
        add(
            "best-gb-s",
            "Best GB/s per provider (serving rows)",
            "Serving rows are judged on bytes/s: the byte model's DRAM bytes over the median time, as a share of the "
            "calibrated read bandwidth and of the datasheet's. Sorted by KV cache, then the highest GB/s.",
            table(bw, formats=serving.BANDWIDTH_FORMATS),
        )
    hosts = host.host_table(frame)
    if len(hosts):
        n_bound = int(hosts["host-bound"].eq(True).sum())
        add(
            "host",
            f"Host time and energy ({n_bound} of {len(hosts)} cases host-bound)",
            "GPU ms: the samples' median, the GPU's work behind a spin kernel; GPU ms in the loop: its time per "
            "call held back to back, no L2 flush (the samples' median on rows that predate it); host ms: the host "
            "(CPU) time to enqueue one call; loop ms: the per-call time of back-to-back calls with one sync and no "
            "spin kernel, what an eager loop pays; loop / GPU: loop ms over GPU ms in the loop; host-bound: the "
            "sweep's flag (that ratio above 1 by more than its margin). J per call: NVML's energy counter over the "
            "back-to-back loops. Host-bound cases first.",
            details(f"{len(hosts)} cases", table(hosts, ratios=("loop / GPU",)), open_=n_bound > 0),
        )
    bad = summary.failures_that_matter(frame)
    refused = frame[frame["status"].isin(summary.NOT_RUN)]
    missing = summary.not_installed(frame)
    body = table(bad) if len(bad) else "<p>None: no wrong result, crash, timeout or OOM.</p>"
    if len(refused):
        body += "<h3>Refused or not attempted</h3>" + status_counts(refused)
        every = failures(refused)
        # Cut at a word boundary: a stored reason may itself end mid-word (the sweep keeps its first 800 characters).
        every["reason"] = every["reason"].map(lambda r: summary.shorten(r, 300))
        body += details("Every refused case", table(every))
    if missing:
        body += f"<p class='note'>Not installed, so neither cases nor providers here: {html.escape(', '.join(missing))}.</p>"
    add(
        "failed",
        f"Failures ({int(bad['cases'].sum()) if len(bad) else 0}) and refusals ({len(refused)})",
        "Never shown as speeds. Failures: wrong result, crash, timeout, OOM, or faster than the roofline allows "
        "(a measurement or model error). Refusals: the provider declines the shape, or the memory model "
        "predicts it cannot fit.",
        body,
    )
    thr = clocks.throttled_cases(frame, run.env)
    if len(thr):
        t = clocks.throttling(frame, run.env)
        add(
            "throttled",
            f"Throttled cases ({len(thr)} of {t.cases})",
            "NVML reported a clock-event reason other than idle during these cases; the clock is the SM clock "
            f"{html.escape(t.clock_source)}. Lowest clock first.",
            details(
                f"{len(thr)} cases, {', '.join(t.reasons) or 'reason not recorded'}",
                table(thr, limit=MAX_THROTTLED_ROWS),
            ),
        )
    add("env", "Environment", "", env_table(run))


def _header(run: Run, baseline_run: Run | None) -> str:
    f = run.frame
    banners = ""
    if run.is_cpu:
        banners += (
            '<div class="banner warn">CPU run: every time on this page is a CPU time (torch on CPU, Triton '
            "interpreter), useful to check the pipeline, meaningless as a GPU speed.</div>"
        )
    elif (f["device"] == "cpu").any():
        banners += (
            '<div class="banner warn">Some rows are CPU times (device = cpu): they are labelled so.</div>'
        )
    if run.env.synthetic:
        banners += '<div class="banner warn">SYNTHETIC results: generated for tests, not measured.</div>'
    if baseline_run is not None:
        banners += f'<div class="banner info">Compared with {html.escape(str(baseline_run.path))}.</div>'
        why = same_run(run, baseline_run)
        if why:
            banners += (
                f'<div class="banner warn">The baseline is this run itself ({html.escape(why)}): every ratio on '
                "this page is 1 by construction.</div>"
            )
        note = cross_gpu_note(run, baseline_run)
        if note:
            banners += f'<div class="banner warn">{html.escape(note[0].upper() + note[1:])}</div>'
    facts = [str(run.path), "CPU" if run.is_cpu else run.gpu_name, *summary.description(f)]
    return (
        f"<header><h1>flashbench report: {html.escape(run.name)}</h1>"
        f'<div class="sub">{html.escape(" · ".join(facts))}</div></header>'
        + (f'<main style="padding-bottom:0">{banners}</main>' if banners else "")
    )
