"""`sweep --ncu`: re-run an ok case under Nsight Compute and record the DRAM bytes it really moved.

    ncu --clock-control none --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum
        -o REPORT python -P -m flashbench.engine.worker --device cuda --ncu-case CASE
The worker compiles and warms up outside the profiled range, then runs the mode once between
cudaProfilerStart/Stop; the bytes of every kernel in that range are summed. ncu flushes caches before
each kernel it profiles (its default --cache-control all), matching the timed runs' L2 flush.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from flashbench.engine import worker
from flashbench.spec.cases import Case

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
_UNITS = {
    "byte": 1,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}


def ncu_path() -> str | None:
    return shutil.which("ncu")


def _number(text: str, unit: str) -> float:
    value = float(text.replace(",", "").strip())
    return value * _UNITS.get(unit.strip().lower(), 1)


def parse_csv(text: str) -> dict[str, float]:
    """Sum each metric over kernels, from `ncu --csv` output in the details or the raw page layout."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    totals = {m: 0.0 for m in METRICS}
    if not rows:
        return totals
    header = rows[0]
    if "Metric Name" in header and "Metric Value" in header:  # details page: one row per metric
        name_at, value_at = header.index("Metric Name"), header.index("Metric Value")
        unit_at = header.index("Metric Unit") if "Metric Unit" in header else None
        for row in rows[1:]:
            if len(row) > value_at and row[name_at] in totals:
                unit = row[unit_at] if unit_at is not None else "byte"
                totals[row[name_at]] += _number(row[value_at], unit)
        return totals
    columns = {m: header.index(m) for m in METRICS if m in header}  # raw page: one column per metric
    units = rows[1] if len(rows) > 1 else []
    for row in rows[2:]:
        for metric, at in columns.items():
            if len(row) > at and row[at].strip():
                totals[metric] += _number(row[at], units[at] if at < len(units) else "byte")
    return totals


def measure(case: Case, kernels: tuple[str, ...], timeout_s: float) -> dict[str, Any]:
    """Row fields ncu_dram_read_bytes / ncu_dram_write_bytes, or {"reason": "ncu: ..."} on failure."""
    exe = ncu_path()
    if exe is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="flashbench-ncu-") as tmp:
        report = Path(tmp) / "report"
        cmd = [exe, "--clock-control", "none", "--profile-from-start", "off", "--metrics", ",".join(METRICS)]
        cmd += ["-f", "-o", str(report), *worker.command("--device", "cuda")]
        cmd += ["--ncu-case", json.dumps(case.to_dict())]
        for path in kernels:
            cmd += ["--kernel", path]
        try:
            env = worker.environment(os.environ)
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
            if run.returncode != 0:
                tail = " ".join((run.stderr or run.stdout).split()[-40:])
                return {"reason": f"ncu: exited with {run.returncode}: {tail}"}
            read = subprocess.run(
                [exe, "-i", f"{report}.ncu-rep", "--csv", "--page", "raw", "--print-units", "base"]
                + ["--metrics", ",".join(METRICS)],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except subprocess.TimeoutExpired:
            return {"reason": f"ncu: no result within {timeout_s:g} s"}
        totals = parse_csv(read.stdout)
    return {
        "ncu_dram_read_bytes": int(totals["dram__bytes_read.sum"]),
        "ncu_dram_write_bytes": int(totals["dram__bytes_write.sum"]),
    }
