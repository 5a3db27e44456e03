"""Results on disk: the Row schema, append-only rows.jsonl, resume, load.

A run directory holds:
    env.json     the environment record (results/env.py: GPU, driver, versions, sweep spec)
    rows.jsonl   one JSON object per finished case, appended and fsync'ed as each case ends

A row is never rewritten. A retried case appends a new row; readers keep the last row per case key.
A half-written last line (the process was killed mid-write) is dropped with a one-line warning that names its
case where the written part shows it (a Row starts with the Case fields); the case then counts as not run
(`--resume` runs it again, the gate reports it missing). Any other unreadable line means the file is corrupt and
is reported as a one-line error.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flashbench.spec.cases import CASE_DEFAULTS, CASE_FIELDS, Case
from flashbench.errors import FlashbenchError, warn

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1
ROWS_FILE = "rows.jsonl"

# Row statuses. Only "ok" rows carry a speed.
OK = "ok"
WRONG = "wrong"  # result outside the error budget, or NaN/Inf: never shown as a speed
OOM = "oom"  # the case ran out of GPU memory
PREDICTED_OOM = "predicted-oom"  # the memory model says it cannot fit: not attempted
UNSUPPORTED = "unsupported"  # the provider refuses this case (reason says why)
UNAVAILABLE = "unavailable"  # the provider's package is not installed / no such backend
CRASH = "crash"  # the worker died (segfault, illegal memory access) or the provider raised
TIMEOUT = "timeout"  # the case ran past the per-case timeout
SKIPPED = "skipped"  # not attempted because a smaller case of the same shape already OOMed
STATUSES = (OK, WRONG, OOM, PREDICTED_OOM, UNSUPPORTED, UNAVAILABLE, CRASH, TIMEOUT, SKIPPED)
# Statuses a --resume retries; the others are final answers about the case.
RETRY_STATUSES = frozenset({CRASH, TIMEOUT})

FLOP_CONVENTION = (
    "forward = 4*B*H*d*(unmasked (q,k) pairs); backward = 2.5x forward (2x for the gradients "
    "+ 0.5x for recomputing P); fwd+bwd = 3.5x forward; MLA (V of dv dims within the latent K): "
    "forward = 2*B*H*(d+dv)*pairs"
)


@dataclass
class Row:
    """One measured (or refused) case. Field order is the column order of load()'s DataFrame."""

    # --- the case (Case fields, flattened) ---
    provider: str
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    dtype: str
    causal: bool
    mode: str
    kv_layout: str = "contiguous"
    page_size: int = 0
    seqlens: str = "uniform"
    seed: int = 0
    window: str = ""
    min_seq: int = 0
    kv_dtype: str = ""
    head_dim_v: int = 0
    # --- the provider's model family as it declares it (providers/registry.py); None: not modelled ---
    family: str | None = ""  # "" (not given, or a row written before rows carried it): filled from the registry
    # --- outcome ---
    status: str = ""  # always given (Row.for_case); the default only lets the serving fields above have theirs
    reason: str = ""  # why it is not "ok": torch's refusal, the stderr tail, the predicted bytes...
    device: str = "cuda"  # "cuda" or "cpu" (CPU times are labelled as such everywhere)
    gpu: str = ""  # device name as the worker saw it
    gpu_index: int | None = None  # --gpus: NVML's index of the GPU the worker was pinned to (None: one device)
    # --- timing (milliseconds) ---
    samples_ms: list[float] = field(default_factory=list)  # raw samples, one per repetition
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    compile_ms: float | None = None  # first call: JIT compile + autotune, kept out of the samples
    compile_wait_ms: float | None = None  # of compile_ms: waiting for another process compiling the same build
    cuda_graph: bool = False
    # --- work and speed ---
    flops: float | None = None  # FLOP_CONVENTION
    tflops: float | None = None  # flops / median
    # --- correctness (relative Frobenius error against a float64 reference) ---
    rel_err: float | None = None  # this provider's error
    err_budget: float | None = None  # 2 * error of torch's own low-precision attention + eps
    ref: str = ""  # what the reference was, or why there was none ("skipped: ... too large")
    # --- memory ---
    peak_mem_bytes: int | None = None  # peak allocated above the inputs, from an untimed run
    predicted_mem_bytes: int | None = None  # the memory model's prediction for the same quantity
    # --- kernel configuration (block sizes, warps, stages) where the provider exposes it ---
    kernel_config: dict[str, Any] | None = None
    # --- the measurement regime (engine/timing.py); None on the CPU, or where NVML is absent ---
    warmup_s: float | None = None  # how long the steady warm-up ran before the samples
    warmup_settled: bool | None = None  # the SM clock settled (False: stopped at the bound; None: no clock)
    host_time_included: bool | None = None  # False: a spin kernel held the GPU while each sample was enqueued
    # --- what a caller's loop pays (engine/timing.py measure_host; docs/measuring.md) ---
    host_ms: float | None = None  # host (CPU) time to enqueue one call: median, the GPU never waited on
    loop_ms: float | None = None  # per-call time of back-to-back calls, one sync, no spin kernel: median
    loop_samples_ms: list[float] = field(default_factory=list)  # per-call time of each back-to-back loop
    loop_gpu_ms: float | None = None  # GPU time per call of calls held back to back (no host gap, no flush)
    host_bound: bool | None = None  # loop_ms exceeds loop_gpu_ms (else median_ms) by over host_bound_pct
    energy_j: float | None = None  # joules per call: watts of a back-to-back run (NVML energy) x loop_ms
    # --- GPU state during the timed samples (NVML read every ~10 ms from the first sample to the last) ---
    sm_clock_mhz: float | None = None  # median SM clock: the clock the speed above was measured at
    sm_clock_min_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: float | None = None  # median memory clock
    power_w: float | None = None  # median board power
    temp_c: float | None = None  # median GPU temperature
    clock_readings_mhz: list[int] = field(default_factory=list)  # the raw SM clock readings (at most 200)
    throttle_reasons: list[str] = field(default_factory=list)  # clock-event reasons seen, idle excepted
    throttled_share: float | None = None  # the share of the readings in which one of them was active
    # --- GPU state around the case: sm_clock_mhz, mem_clock_mhz, power_w, temp_c, clock_event_reasons ---
    nvml_before: dict[str, Any] | None = None
    nvml_after: dict[str, Any] | None = None
    throttled: bool = False  # a clock-event reason other than idle was active during (or around) the samples
    # --- Nsight Compute (sweep --ncu) ---
    ncu_dram_read_bytes: int | None = None
    ncu_dram_write_bytes: int | None = None
    # --- bookkeeping ---
    timestamp: float = 0.0
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        # A row built without its family, or read from a file written before rows carried it, takes the family its
        # provider declares now; a provider no registry here knows (a user kernel), the default family.
        if self.family == "":
            from flashbench.providers.builtin import family_of

            self.family = family_of(self.provider)

    @property
    def case(self) -> Case:
        return Case(**{k: getattr(self, k) for k in CASE_FIELDS})

    @property
    def key(self) -> str:
        return self.case.key

    @classmethod
    def for_case(cls, case: Case, status: str, **kw: Any) -> Row:
        return cls(**case.to_dict(), status=status, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


ROW_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Row))


def append_row(run_dir: str | Path, row: Row) -> None:
    """Append one row and force it to disk, so a kill -9 after this call loses nothing."""
    path = Path(run_dir) / ROWS_FILE
    with path.open("a", encoding="utf-8") as fh:
        fh.write(_row_line(row))
        fh.flush()
        os.fsync(fh.fileno())


def write_rows(run_dir: str | Path, rows: list[Row]) -> None:
    """Write a whole rows.jsonl at once (merge): a temporary file, fsync'ed, then renamed into place."""
    path = Path(run_dir) / ROWS_FILE
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.writelines(_row_line(row) for row in rows)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _row_line(row: Row) -> str:
    return json.dumps(row.to_dict(), separators=(",", ":"), allow_nan=False, default=_json_default) + "\n"


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _check_schema(schema: Any, where: Path) -> None:
    if schema != SCHEMA_VERSION:
        raise FlashbenchError(
            f"{where} has results schema {schema!r}; this flashbench reads schema {SCHEMA_VERSION}"
        )


def read_rows(run_dir: str | Path, latest_only: bool = True) -> list[Row]:
    """Rows of a run. With latest_only, the last row per case key (a retried case's newest answer)."""
    run_dir = Path(run_dir)
    path = run_dir / ROWS_FILE
    if not run_dir.is_dir():
        raise FlashbenchError(f"results directory not found: {run_dir}")
    if not path.is_file():
        raise FlashbenchError(f"{run_dir}: no {ROWS_FILE} (not a flashbench run directory?)")
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    rows: list[Row] = []
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            _check_schema(data.get("schema"), path)
            row = Row.from_dict(data)
        except FlashbenchError:
            raise
        except (ValueError, TypeError) as exc:
            is_torn_tail = lineno == len(lines) and not text.endswith("}")
            if is_torn_tail:
                case = _torn_case_key(text)
                what = f" (case {case.replace('|', ' ')}: counted as not run)" if case else ""
                warn(f"{path}: dropped a half-written last line{what}")
                continue
            raise FlashbenchError(f"{path} line {lineno} is corrupt: {exc}") from None
        rows.append(row)
    if not latest_only:
        return rows
    latest: dict[str, Row] = {}
    for row in rows:
        latest.pop(row.key, None)  # keep first-seen order of the newest answer
        latest[row.key] = row
    return list(latest.values())


_FIELD_RE = re.compile(r'"(\w+)":("[^"]*"|true|false|-?\d+)')


def _torn_case_key(text: str) -> str | None:
    """The case key of a torn row when all the Case fields were written before the cut, else None."""
    found: dict[str, Any] = {}
    for name, value in _FIELD_RE.findall(text):
        found.setdefault(name, json.loads(value))  # the first: a Row writes the Case fields first
    # A row written before the serving fields existed has "status" right after "mode": its missing serving
    # fields are the defaults. Without "status" the cut may have fallen among them: the key is unknown.
    defaults = CASE_DEFAULTS if "status" in found else {}
    if any(name not in found and name not in defaults for name in CASE_FIELDS):
        return None
    try:
        fields: dict[str, Any] = {name: found.get(name, defaults.get(name)) for name in CASE_FIELDS}
        return Case(**fields).key
    except (TypeError, ValueError):
        return None


def load(path: str | Path) -> pd.DataFrame:
    """A run directory (or its rows.jsonl) as a pandas DataFrame, one row per case, with a `key` column."""
    run_dir = Path(path)
    if run_dir.name == ROWS_FILE:
        run_dir = run_dir.parent
    return frame_of(read_rows(run_dir))


def frame_of(rows: list[Row]) -> pd.DataFrame:
    """Rows as a pandas DataFrame, one row per case, the Row fields as columns after a `key` column."""
    import pandas as pd

    frame = pd.DataFrame([r.to_dict() for r in rows], columns=list(ROW_FIELDS))
    frame.insert(0, "key", [r.key for r in rows])
    return frame
