"""The GPU clocks behind a run's numbers, in words: the clock each case ran at and why it throttled (NVML's
clock-event reason bits), how much of the run throttled, and whether the measured roof (`flashbench calibrate`)
was taken on a throttled GPU and so is no ceiling.

Reads the tidy frame (analysis.runs) and the environment record. The per-row clock of the timed window (the
rows' sm_clock_mhz and throttle_reasons, where the sweep recorded them) is preferred; older runs fall back to
the NVML samples taken before and after each case, and say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flashbench.analysis.summary import case_words
from flashbench.gpu.nvml import NOT_THROTTLING, REASON_NAMES

if TYPE_CHECKING:
    import pandas as pd

    from flashbench.results.env import Environment

# NVML clock-event reason bits (nvml.h, gpu.nvml.REASON_NAMES) in words a reader knows.
REASON_WORDS: dict[int, str] = {
    0x1: "idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}
NAME_WORDS = {REASON_NAMES[bit]: words for bit, words in REASON_WORDS.items()}


def reason_words(bits: Any = None, names: Any = None) -> list[str]:
    """NVML clock-event reasons as words, idle and application clocks left out (they are not throttling).

    bits: the raw bitmask (rows' clock_event_reasons); names: gpu.nvml.reason_names() output (the rows'
    throttle_reasons list, where recorded). Unknown bits and names are kept verbatim.
    """
    out: list[str] = []
    if isinstance(names, list | tuple):
        for name in names:
            words = NAME_WORDS.get(str(name), str(name))
            if words not in out and words not in ("idle", "application clocks setting"):
                out.append(words)
    if bits is not None and bits == bits:
        bits = int(bits) & ~NOT_THROTTLING
        for bit in range(32):
            if bits & (1 << bit):
                words = REASON_WORDS.get(1 << bit, hex(1 << bit))
                if words not in out:
                    out.append(words)
    return out


# --------------------------------------------------------------------------------------- throttling


def case_clocks(frame: pd.DataFrame) -> pd.DataFrame:
    """Per row: the SM clock the case ran at (clock_mhz), where that reading comes from (clock_source), the
    throttle reasons in words (reasons), and where the sweep recorded it, the range of the clock readings
    during the samples (clock_min_mhz, clock_max_mhz).

    With the per-row clock of the timed window (the rows' sm_clock_mhz, the median of NVML readings during the
    samples) that clock; on older runs, the lower of the two samples taken before and after the case. Reasons:
    the names seen during the samples (throttle_reasons), then any reason bit of the samples around the case
    (a row's `throttled` counts both).
    """
    import numpy as np
    import pandas as pd

    def column(name: str) -> pd.Series:
        if name in frame:
            return pd.to_numeric(frame[name], errors="coerce").astype(float)
        return pd.Series(np.nan, index=frame.index)

    during = column("sm_clock_mhz")
    around = np.fmin(column("sm_clock_mhz_before"), column("sm_clock_mhz_after"))
    clock = during.where(during.notna(), around)
    source = np.where(during.notna(), "during the samples", "before/after the case")
    names = frame["throttle_reasons"] if "throttle_reasons" in frame else pd.Series([None] * len(frame))
    bits_a = column("clock_event_reasons_after").fillna(0).astype(int)
    bits_b = column("clock_event_reasons_before").fillna(0).astype(int)
    words = [
        ", ".join(reason_words(int(a) | int(b), n if isinstance(n, list) else None))
        for a, b, n in zip(bits_a, bits_b, names.to_numpy(), strict=True)
    ]
    return pd.DataFrame(
        {
            "clock_mhz": clock.to_numpy(),
            "clock_source": source,
            "reasons": words,
            "clock_min_mhz": column("sm_clock_min_mhz").to_numpy(),
            "clock_max_mhz": column("sm_clock_max_mhz").to_numpy(),
        },
        index=frame.index,
    )


@dataclass(frozen=True)
class Throttling:
    """How many measured cases throttled, why, and the range of clocks the cases ran at."""

    cases: int  # ok cases
    throttled: int
    reasons: tuple[str, ...]
    clock_min: float | None
    clock_max: float | None
    max_clock: float | None  # the GPU's maximum SM clock (NVML), where recorded
    clock_source: str


def throttling(frame: pd.DataFrame, env: Environment) -> Throttling:
    ok = frame[frame["ok"]]
    clocks = case_clocks(ok)
    thr = clocks[ok["throttled"]]
    reasons: list[str] = []
    for text in thr["reasons"]:
        reasons += [w for w in text.split(", ") if w and w not in reasons]
    facts = env.gpu_facts or {}
    c = clocks["clock_mhz"].dropna()
    sources = set(clocks["clock_source"])
    return Throttling(
        cases=len(ok),
        throttled=int(ok["throttled"].sum()),
        reasons=tuple(reasons),
        clock_min=float(c.min()) if len(c) else None,
        clock_max=float(c.max()) if len(c) else None,
        max_clock=float(facts["max_sm_clock_mhz"]) if facts.get("max_sm_clock_mhz") else None,
        clock_source=" / ".join(sorted(sources)),
    )


def throttled_cases(frame: pd.DataFrame, env: Environment) -> pd.DataFrame:
    """The throttled ok cases, worst first (lowest clock): the case, its time, clock and reasons in words."""
    import pandas as pd

    ok = frame[frame["ok"] & frame["throttled"]]
    if ok.empty:
        return pd.DataFrame()
    clocks = case_clocks(ok)
    facts = env.gpu_facts or {}
    top = facts.get("max_sm_clock_mhz")
    out = pd.DataFrame(
        {
            "provider": ok["provider"],
            "case": [f"{case_words(r)} {r['mode']}" for r in ok.to_dict("records")],
            "median_ms": ok["median_ms"],
            "SM clock MHz": clocks["clock_mhz"],
            "% of max clock": 100.0 * clocks["clock_mhz"] / top if top else float("nan"),
            "why (NVML)": clocks["reasons"],
        }
    )
    return out.sort_values("SM clock MHz", na_position="last").reset_index(drop=True)


# --------------------------------------------------------------------------------------- the roof


@dataclass(frozen=True)
class Calibration:
    """Where the measured roof comes from and whether it can be trusted as a ceiling."""

    source: str  # "run" (the sweep's env.json), "this machine" (a calibrate file found here), "" (none)
    throttled: bool = False
    clock_mhz: float | None = None  # the SM clock its figures were taken at (the lowest), or at its end
    reasons: tuple[str, ...] = ()  # the clock-event reasons in short words (a chart label)
    reason: str = ""  # the throttle verdict in words: which reason held the clock, where, at what clock
    when: str = ""
    # Per matmul dtype of a steady-regime record: (median SM clock MHz, the reasons in words) of that measurement,
    # so a roof of one dtype quotes its own clock, never the lowest of all (the FP8 matmul's, usually).
    matmul: tuple[tuple[str, float | None, tuple[str, ...]], ...] = ()
    # The copy and read measurements of a steady-regime record: (name, GB/s, median SM clock, reasons in words).
    bandwidth: tuple[tuple[str, float, float | None, tuple[str, ...]], ...] = ()

    def matmul_clock(self, dtype: str) -> tuple[float | None, tuple[str, ...]]:
        """(SM clock, reasons) of the `dtype` matmul measurement; the record's overall figures otherwise."""
        for name, clock, reasons in self.matmul:
            if name == dtype:
                return clock, reasons
        return self.clock_mhz, self.reasons


def calibration(env: Environment, ceilings: list[Any], gpu_spec: Any = None) -> Calibration:
    """The measured ceiling's record: the run's (env.calibration), else this machine's calibrate file.

    A record of `flashbench calibrate` in the steady regime carries its own verdict: `throttled` and
    `throttle_reason` (which clock-event reasons held which measurement, at what clock), and `sm_clock_mhz`,
    the lowest of its measurements' median SM clocks. An older record has only the NVML samples taken before
    and after it: the verdict is then worded here from those (the clock at its end, either sample's reasons).
    """
    record = env.calibration if isinstance(env.calibration, dict) and "error" not in env.calibration else None
    source = "run" if record else ""
    if record is None and any(c.source == "measured" for c in ceilings):
        source = "this machine"
        if gpu_spec is not None:
            from flashbench.gpu import hardware

            record = hardware.load_calibration(gpu_spec)
    if not record:
        return Calibration(source=source)
    when = str(record.get("timestamp_utc", ""))
    if "throttle_reason" in record:  # the steady-regime record
        names = [n for m in _measurements(record) for n in m.get("throttle_reasons") or []]
        clock = record.get("sm_clock_mhz")
        matmuls = (record.get("details") or {}).get("matmul") or {}
        per_dtype = tuple(
            (
                str(dtype),
                float(m["sm_clock_mhz"]) if m.get("sm_clock_mhz") else None,
                tuple(reason_words(names=m.get("throttle_reasons") or [])),
            )
            for dtype, m in matmuls.items()
            if isinstance(m, dict) and "error" not in m
        )
        details = record.get("details") or {}
        bandwidth = tuple(
            (
                name,
                float(m["gb_s"]),
                float(m["sm_clock_mhz"]) if m.get("sm_clock_mhz") else None,
                tuple(reason_words(names=m.get("throttle_reasons") or [])),
            )
            for name in ("copy", "read")
            if isinstance(m := details.get(name), dict) and m.get("gb_s")
        )
        return Calibration(
            source=source,
            throttled=bool(record.get("throttled")),
            clock_mhz=float(clock) if clock else None,
            reasons=tuple(reason_words(names=names)),
            reason=str(record.get("throttle_reason") or ""),
            when=when,
            matmul=per_dtype,
            bandwidth=bandwidth,
        )
    before, after = record.get("nvml_before") or {}, record.get("nvml_after") or {}
    bits = int(after.get("clock_event_reasons") or 0) | int(before.get("clock_event_reasons") or 0)
    reasons = reason_words(bits)
    clock = after.get("sm_clock_mhz")
    top = record.get("max_sm_clock_mhz") or (env.gpu_facts or {}).get("max_sm_clock_mhz")
    words = f"SM clock {clock:.0f} MHz at its end" if clock else "clock not recorded"
    words += f" of {top:.0f} max" if clock and top else ""
    words += f", {after['power_w']:.0f} W" if after.get("power_w") else ""
    return Calibration(
        source=source,
        throttled=bool(record.get("throttled") or after.get("throttled") or reasons),
        clock_mhz=float(clock) if clock else None,
        reasons=tuple(reasons),
        reason=f"{words}; {', '.join(reasons) or 'reason not recorded'}",
        when=when,
    )


def _measurements(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's per-measurement results (copy, read, each matmul): bench_ms dicts with their clocks."""
    details = record.get("details") or {}
    out = [details[k] for k in ("copy", "read") if isinstance(details.get(k), dict)]
    matmuls = details.get("matmul") or {}
    return out + [m for m in matmuls.values() if isinstance(m, dict) and "error" not in m]
