"""Each rule a docs page states, checked against the function that applies it: one test per rule.

A test first finds the rule's sentence in the page (whitespace-normalized) and reads its numbers from there, then
calls the code. Rewording a rule or changing its function makes the test fail until the two agree again.
docs/models.md's bound and % of roofline paragraphs are checked with the roofline code elsewhere.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from flashbench.errors import FlashbenchError

DOCS = Path(__file__).resolve().parents[1] / "docs"


def stated(page: str, pattern: str) -> re.Match[str]:
    """The rule's sentence in docs/`page` (a regex over the page with its whitespace collapsed)."""
    text = " ".join((DOCS / page).read_text(encoding="utf-8").split())
    match = re.search(pattern, text)
    assert match, f"docs/{page} no longer states /{pattern}/: reword the test with the page"
    return match


# ---------------------------------------------------------------------------------------------- docs/gate.md
def test_gate_limit_is_half_the_threshold_or_the_noise_band_and_judgeable_below_half():
    from flashbench.analysis.gate_rule import can_judge, case_threshold

    stated("gate.md", r"limit = max\(threshold / 2, noise band\) judgeable = noise band <= threshold / 2")
    for threshold in (0.03, 0.05, 0.1):
        for band in (0.0, 0.01, threshold / 2, 0.04, 0.2):
            assert case_threshold(threshold, band) == max(threshold / 2, band)
            assert can_judge(threshold, band) == (band <= threshold / 2)


def test_gate_noise_band_is_the_largest_of_half_the_p20_p80_spread_half_the_interval_the_history_and_the_clock():
    from flashbench.analysis.gate_rule import compare_samples, relative_spread

    stated(
        "gate.md",
        r"\| spread \| half the p20-p80 spread of the noisier side's samples, relative to its median \|",
    )
    stated("gate.md", r"\| interval \| half the width of the 95% bootstrap interval of the median ratio \|")
    rng = np.random.default_rng(0)
    base, cur = rng.normal(1.0, 0.01, 40), rng.normal(1.0, 0.04, 40)
    comp = compare_samples([cur], [base], 0.05, key="docs")
    assert comp.noise.spread == pytest.approx(0.5 * max(relative_spread(base), relative_spread(cur)))
    assert comp.noise.interval == pytest.approx((comp.ci_high - comp.ci_low) / 2)
    assert comp.band == max(comp.noise.spread, comp.noise.interval)
    assert compare_samples([cur], [base], 0.05, key="docs", history=0.09).band == 0.09
    assert compare_samples([cur], [base], 0.05, key="docs", clock=1905 / 1845).noise.clock == pytest.approx(
        1905 / 1845 - 1
    )


def test_gate_case_with_too_few_samples_fails_beyond_the_full_threshold():
    from flashbench.analysis.gate import GateConfig
    from flashbench.analysis.gate_rule import REGRESSION, UNCHANGED, compare_samples

    few = int(
        stated(
            "gate.md",
            r"A case with fewer than (\d+) samples on a side has no noise measure: it fails "
            r"beyond the full threshold",
        ).group(1)
    )
    assert GateConfig().min_samples == few
    base = [1.0] * (few - 1)
    # +4%: over half of 5% but with no noise measure the full 5% decides; +6% fails.
    assert compare_samples([[1.04] * (few - 1)], [base], 0.05, key="few").verdict == UNCHANGED
    assert compare_samples([[1.06] * (few - 1)], [base], 0.05, key="few").verdict == REGRESSION


def test_gate_missing_baseline_cases_fail_and_current_only_cases_never_do(tmp_path):
    from test_gate_cli import SYNTH, derive_run

    from flashbench.analysis.gate import run_gate
    from flashbench.results.rows import Row, read_rows

    stated(
        "gate.md",
        r"\*\*Missing cases fail\.\*\* A baseline case absent from the current run fails the gate, exit 1",
    )
    stated("gate.md", r"Cases only in the current run are listed and never fail\.")
    base, src = SYNTH
    dropped = read_rows(src)[0].key
    fewer = derive_run(src, tmp_path / "fewer", lambda r: None if r.key == dropped else r)
    result = run_gate(base, fewer)
    assert result.missing == [dropped] and result.exit_code == 1
    assert run_gate(base, fewer, allow_missing=True).exit_code == 0
    extra = derive_run(src, tmp_path / "extra", lambda r: r)
    first = read_rows(src)[0]
    from flashbench.results.rows import append_row

    append_row(extra, Row.from_dict({**first.to_dict(), "heads": 99}))
    result = run_gate(base, extra)
    assert any(c.verdict == "current-only" for c in result.cases) and result.exit_code == 0


def test_gate_learned_band_scales_the_range_of_k_runs_by_k_plus_1_over_k_minus_1():
    from flashbench.results.baseline import learned_band

    m = stated("gate.md", r"x(\d+) for 2 runs, x(\d+) for 3, x([\d.]+) for 5")
    for runs, factor in zip((2, 3, 5), m.groups(), strict=True):
        medians = [1.0] * (runs - 1) + [1.01]
        assert learned_band(medians) == pytest.approx(0.01 * float(factor))
        assert float(factor) == pytest.approx((runs + 1) / (runs - 1))


# ---------------------------------------------------------------------------------------------- docs/measuring.md
def test_error_budget_is_twice_torch_low_precision_error_plus_eps_per_dtype():
    import torch

    from flashbench.engine.correctness import compare

    stated(
        "measuring.md",
        r"rel_err\(provider, float64 reference\) <= 2 \* rel_err\(PyTorch attention in the "
        r"dtype, float64 reference\) \+ eps",
    )
    m = stated("measuring.md", r"eps is ([\d.e-]+) for fp16, ([\d.e-]+) for bf16 and ([\d.e-]+) for fp32")
    ref = torch.ones(1000, dtype=torch.float64)
    low = ref * (1 + 0.002)  # torch's own low-precision error: 0.002
    for dtype, eps in zip(("fp16", "bf16", "fp32"), map(float, m.groups()), strict=True):
        budget = 2 * 0.002 + eps
        inside = {"out": ref * (1 + 0.99 * budget)}
        outside = {"out": ref * (1 + 1.01 * budget)}
        assert compare(inside, {"out": ref}, {"out": low}, dtype).ok
        assert not compare(outside, {"out": ref}, {"out": low}, dtype).ok


def test_warm_up_and_sampling_defaults_are_the_ones_the_page_names():
    from flashbench.spec.config import SweepSpec

    spec = SweepSpec()
    m = stated(
        "measuring.md",
        r"once it has run `warmup_ms` \(([\d.]+) s\) and the median SM clock of the last "
        r"`settle_window_ms` \((\d+) ms\) is within `settle_pct` \((\d+)%\) of the window before, or at "
        r"`warmup_max_ms` \((\d+) s\)",
    )
    assert (spec.warmup_ms, spec.settle_window_ms, spec.settle_pct, spec.warmup_max_ms) == (
        float(m.group(1)) * 1e3,
        float(m.group(2)),
        float(m.group(3)),
        float(m.group(4)) * 1e3,
    )
    m = stated("measuring.md", r"in chunks of `rep_ms` \((\d+) ms\)")
    assert spec.rep_ms == float(m.group(1))
    m = stated("measuring.md", r"at least `min_samples` \((\d+)\)")
    assert spec.min_samples == int(m.group(1))
    m = stated("measuring.md", r"up to `rep_max_ms` \((\d+) s\)")
    assert spec.rep_max_ms == float(m.group(1)) * 1e3


def test_warm_up_settles_when_the_last_window_is_within_settle_pct_of_the_one_before():
    from flashbench.engine.timing import settled

    stated(
        "measuring.md",
        r"the median SM clock of the last `settle_window_ms` \(250 ms\) is within `settle_pct` "
        r"\(1%\) of the window before",
    )
    times = np.arange(0.0, 0.6, 0.01)  # NVML read every 10 ms, 600 ms of warm-up
    held = [(t, 1800.0 if t <= 0.35 else 1800.0 * 0.992) for t in times]  # the last window 0.8% lower
    fell = [(t, 1800.0 if t <= 0.35 else 1800.0 * 0.985) for t in times]  # 1.5% lower: still falling
    assert settled(held, 0.25, 1.0) and not settled(fell, 0.25, 1.0)


def test_throttled_means_any_clock_event_reason_but_idle_and_the_application_clock_setting():
    from flashbench.gpu import nvml

    stated(
        "measuring.md",
        r"`throttled` flags a case whose GPU slowed itself \(any reason but idle and the "
        r"application-clock setting\)",
    )
    for reasons, throttled in ((0x1, False), (0x2, False), (0x3, False), (0x4, True), (0x1 | 0x40, True)):
        assert bool(reasons & ~nvml.NOT_THROTTLING) == throttled
        readings = [{"sm_clock_mhz": 1800, "clock_event_reasons": reasons}]
        assert nvml.window_summary(readings)["throttled_share"] == (1.0 if throttled else 0.0)


def test_after_an_oom_or_timeout_larger_n_of_that_provider_and_shape_with_no_fewer_tokens_are_skipped():
    from flashbench.engine.runner import _Skips
    from flashbench.results.rows import OOM, TIMEOUT, Row
    from flashbench.spec.cases import Case

    for status in ("oom", "timeout"):
        stated(
            "measuring.md",
            rf"\| `{status}` \| .*?larger N of the same provider and shape, with no fewer tokens",
        )
    shape = dict(heads=16, kv_heads=16, head_dim=128, dtype="bf16", causal=True, mode="fwd")
    for status in (OOM, TIMEOUT):
        skips = _Skips()
        skips.note(Row.for_case(Case("triton", batch=4, seq_q=4096, seq_k=4096, **shape), status))
        assert skips.reason(Case("triton", batch=2, seq_q=8192, seq_k=8192, **shape))  # same tokens, larger N
        assert not skips.reason(Case("triton", batch=1, seq_q=8192, seq_k=8192, **shape))  # fewer tokens
        assert not skips.reason(Case("triton", batch=8, seq_q=2048, seq_k=2048, **shape))  # smaller N
        assert not skips.reason(Case("naive", batch=2, seq_q=8192, seq_k=8192, **shape))  # another provider


def test_resume_retries_crash_and_timeout_rows():
    from flashbench.results.rows import CRASH, RETRY_STATUSES, TIMEOUT

    stated("measuring.md", r"keeps every finished row and retries `crash` and `timeout` rows")
    assert RETRY_STATUSES == {CRASH, TIMEOUT}


# ---------------------------------------------------------------------------------------------- docs/providers.md
def test_causal_mask_is_bottom_right_aligned():
    from flashbench.models.flops import unmasked_pairs
    from flashbench.spec.window import visible

    stated("providers.md", r"query i sees key j iff j <= i \+ \(Nk - Nq\)")
    for nq, nk in ((4, 4), (3, 7), (1, 5)):
        for i in range(nq):
            for j in range(nk):
                assert bool(visible(i, j, nq, nk, True, None)) == (j <= i + (nk - nq))
        assert unmasked_pairs(nq, nk, causal=True) == sum(min(nk, i + nk - nq + 1) for i in range(nq))


def test_sliding_window_sees_p_minus_left_to_p_plus_right_and_causal_means_right_0():
    from flashbench.spec.plan import case_window
    from flashbench.spec.window import effective, visible

    stated(
        "providers.md",
        r"query i at key position p = i \+ Nk - Nq sees keys p - L <= j <= p \+ R, -1 = no "
        r"limit, causal means R = 0",
    )
    stated("providers.md", r"a causal case whose window has R > 0 is `unsupported` for everyone")
    nq, nk, left, right = 3, 8, 2, 1
    for i in range(nq):
        p = i + nk - nq
        for j in range(nk):
            assert bool(visible(i, j, nq, nk, False, (left, right))) == (p - left <= j <= p + right)
            assert bool(visible(i, j, nq, nk, False, (-1, right))) == (j <= p + right)
    assert effective(True, (left, -1)) == (left, 0)
    with pytest.raises(ValueError, match="causal means window right = 0"):
        effective(True, (left, right))
    assert (
        case_window(True, f"{left},{right}") == f"{left},{right}"
    )  # kept as given: the plan marks it unsupported


def test_an_unknown_provider_is_a_one_line_error_naming_the_closest():
    from flashbench.spec.plan import resolve_providers

    stated("providers.md", r"naming an unknown one is a one-line error \(exit 2\) with the closest name")
    known = ["naive", "sdpa-flash", "sdpa-cudnn", "triton"]
    with pytest.raises(FlashbenchError) as err:
        resolve_providers(["sdpa-flsh"], known)
    assert "\n" not in str(err.value) and "sdpa-flash" in str(err.value) and err.value.exit_code == 2
    assert resolve_providers(["all"], known) == known


# ---------------------------------------------------------------------------------------------- docs/decode.md
def test_ragged_lengths_are_drawn_from_half_n_to_n_seeded_by_the_string():
    import random

    from flashbench.spec.cases import kv_lengths

    stated(
        "decode.md",
        r"Ragged lengths are drawn uniformly from \[ceil\(N/2\), N\] with Python's `random.Random` "
        r"seeded by the string `flashbench-seqlens\|seed\|batch\|seq_q\|N`",
    )
    batch, seq_q, n, seed = 64, 1, 1001, 3
    lengths = kv_lengths(batch, seq_q, n, "random", seed)
    rng = random.Random(f"flashbench-seqlens|{seed}|{batch}|{seq_q}|{n}")
    assert lengths == tuple(rng.randint(math.ceil(n / 2), n) for _ in range(batch))
    assert min(lengths) >= 501 and max(lengths) <= n and kv_lengths(2, 1, n) == (n, n)


def test_a_case_key_gains_a_serving_part_only_when_it_is_not_the_default():
    from flashbench.spec.cases import Case

    stated(
        "decode.md",
        r"`Case.key` appends a serving field only when it is not the default: "
        r"`\.\.\.\|bf16\|causal\|fwd\|paged16`,\s+`\.\.\.\|fwd\|random-s0` and `\.\.\.\|fwd\|kvfp8`",
    )
    base = dict(
        batch=1,
        heads=32,
        kv_heads=8,
        seq_q=1,
        seq_k=4096,
        head_dim=128,
        dtype="bf16",
        causal=True,
        mode="fwd",
    )
    assert Case("triton-decode", **base).key.endswith("|bf16|causal|fwd")
    assert Case("triton-decode", **base, kv_layout="paged", page_size=16).key.endswith(
        "|bf16|causal|fwd|paged16"
    )
    assert Case("triton-decode", **base, seqlens="random", seed=0).key.endswith("|fwd|random-s0")
    assert Case("triton-decode", **base, kv_dtype="fp8").key.endswith("|fwd|kvfp8")


def test_decode_preset_batch_is_tokens_over_n_at_least_one():
    from flashbench.spec.config import load_spec
    from flashbench.spec.plan import batch_for

    m = stated("decode.md", r"`tokens = (\d+)`: batch = max\(1, \d+ // N\), (\d+) at 1k down to 1 from 32k")
    spec = load_spec("decode")
    assert spec.tokens == int(m.group(1))
    assert batch_for(spec, 1024) == [int(m.group(2))] and batch_for(spec, 32768) == [1]
    assert batch_for(spec, 131072) == [1]


# ---------------------------------------------------------------------------------------------- docs/models.md
def test_flop_convention_forward_four_bhd_pairs_backward_two_and_a_half_fwd_bwd_three_and_a_half():
    from flashbench.models.flops import attention_flops, unmasked_pairs

    stated("models.md", r"\*\*forward\*\* = 4 · B · H · d · \(number of unmasked \(q, k\) pairs\)")
    bwd = stated("models.md", r"\*\*backward\*\* = ([\d.]+) x forward")
    both = stated("models.md", r"\*\*fwd\+bwd\*\* = ([\d.]+) x forward")
    fwd = 4 * 2 * 16 * 128 * unmasked_pairs(1024, 1024, True)
    assert unmasked_pairs(1024, 1024, True) == 1024 * 1025 // 2  # N(N+1)/2, counted exactly
    assert attention_flops(2, 16, 1024, 1024, 128, True, "fwd") == fwd
    assert attention_flops(2, 16, 1024, 1024, 128, True, "bwd") == float(bwd.group(1)) * fwd
    assert attention_flops(2, 16, 1024, 1024, 128, True, "fwd+bwd") == float(both.group(1)) * fwd


# ---------------------------------------------------------------------------------------------- docs/multi-gpu.md
def test_shards_deal_shapes_by_predicted_cost_costliest_first():
    import math

    from flashbench.engine.shard import REF_BLOCK_S, case_cost_s, slice_of_shapes
    from flashbench.gpu.hardware import lookup
    from flashbench.models.flops import case_flops
    from flashbench.models.io_model import compulsory_traffic
    from flashbench.spec.cases import Case
    from flashbench.spec.config import SweepSpec

    stated(
        "multi-gpu.md",
        r"with a call's time its roofline bound \(its FLOPs over the peak of its dtype, or its compulsory bytes over "
        r"the bandwidth\) at the H100 SXM's datasheet roofs\. They are the first call and the memory run \(2 calls\); "
        r"the float64 check, priced by its blocks of query rows \(2\.2 ms a block, 6\.7 ms with the gradients",
    )
    assert REF_BLOCK_S == {False: 2.2e-3, True: 6.7e-3}
    stated(
        "multi-gpu.md",
        r"the estimate \(3 calls\) and the warm-up \(`warmup_ms`, or 3 calls if those take longer\); the samples at "
        r"their bound \(`rep_max_ms`, or `max_samples` calls if those take less, .*; but at least `rep_ms` or "
        r"`min_samples` calls\); and the host loops \(a 3-call probe, then `host_loops` rounds of a held batch of up "
        r"to 16 calls and a loop of `host_loop_ms`, at least 3 calls and at most 1000, then 300 ms of energy reading\)",
    )
    stated(
        "multi-gpu.md",
        r"The shapes, costliest first, each go to the slice with the least predicted work so far \(the "
        r"longest-processing-time rule; ties go to the lower slice",
    )
    h100, spec = lookup("h100-sxm"), SweepSpec()
    cases = [
        Case(p, max(1, 16384 // n), 16, 16, n, n, d, dt, c, mode)
        for dt in ("fp16", "bf16")
        for d in (128, 64)
        for c in (True, False)
        for mode in ("fwd", "fwd+bwd")
        for n in (1024, 4096, 65536)
        for p in ("triton", "sdpa-flash")
    ]
    for case in cases:
        nbytes = compulsory_traffic(
            case.batch,
            case.heads,
            case.kv_heads,
            case.seq_q,
            case.seq_k,
            case.head_dim,
            case.elem_bytes,
            case.mode,
        ).total
        call = max(case_flops(case) / h100.peak_flops(case.dtype), nbytes / h100.bw_bytes_s)
        grads = case.mode != "fwd"
        # the check: as many (batch, head) slices as fit in 2e13 FLOPs of the reference and its low-precision run
        # (one head a slice here), in blocks of rows whose float64 S block holds 2^25 elements
        per_slice = 2 * (3.5 if grads else 1.0) * 4 * case.seq_q * case.seq_k * case.head_dim
        slices = 0 if per_slice > 2e13 else max(1, min(case.batch * case.heads, int(2e13 // per_slice)))
        rows = min(case.seq_q, 2**25 // case.seq_k)
        loop = max(3, min(1000, int(spec.host_loop_ms / 1e3 / call)))
        stated_cost = (
            2 * call
            + slices * math.ceil(case.seq_q / rows) * REF_BLOCK_S[grads]
            + 3 * call
            + max(spec.warmup_ms / 1e3, 3 * call)
            + max(
                spec.rep_ms / 1e3,
                spec.min_samples * call,
                min(spec.rep_max_ms / 1e3, spec.max_samples * call),
            )
            + 3 * call
            + spec.host_loops * (loop + min(16, loop)) * call
            + 0.3
        )
        assert case_cost_s(case) == pytest.approx(stated_cost, rel=1e-12)
    shape_cost: dict[str, float] = {}
    first: dict[str, Case] = {}
    for case in cases:
        shape_cost[case.shape_key] = shape_cost.get(case.shape_key, 0.0) + case_cost_s(case)
        first.setdefault(case.shape_key, case)
    stated(
        "multi-gpu.md",
        r"shapes of equal cost keep the order \(dtype, head dim, heads, kv heads, causal, mode, query length, key "
        r"length, batch\)",
    )

    def order(key: str) -> tuple[object, ...]:
        c = first[key]  # fp16 and bf16 cost the same here (one peak on the H100)
        fields = (c.dtype, c.head_dim, c.heads, c.kv_heads, c.causal, c.mode, c.seq_q, c.seq_k, c.batch)
        return (-shape_cost[key], fields)

    where, load = slice_of_shapes(cases, 3), [0.0, 0.0, 0.0]
    for key in sorted(shape_cost, key=order):
        j = min(range(3), key=lambda i: (load[i], i))
        assert where[key] == j
        load[j] += shape_cost[key]


def test_shard_is_one_based_and_anything_else_is_a_one_line_error():
    from flashbench.results.env import parse_shard

    m = stated(
        "multi-gpu.md",
        r"`--shard i/n` is 1-based \(`1/4` \.\. `4/4`\); `(0/4)`, `(5/4)` or `(a/b)` is a "
        r"one-line error, exit 2",
    )
    assert parse_shard("1/4") == (1, 4) and parse_shard("4/4") == (4, 4)
    for bad in m.groups():
        with pytest.raises(FlashbenchError) as err:
            parse_shard(bad)
        assert err.value.exit_code == 2 and "\n" not in str(err.value)


def test_the_fp8_cache_budget_is_the_stated_derivation():
    import math

    from flashbench.engine.correctness import KV_FP8_EPS

    stated("decode.md", r"plus `KV_FP8_EPS = 2\^-4`")
    stated("decode.md", r"sqrt\(2/3\) x 2\^-4 = 0\.051; the term 2\^-4 = 0\.0625")
    assert KV_FP8_EPS == 2.0**-4 and round(math.sqrt(2 / 3) * 2.0**-4, 3) == 0.051
