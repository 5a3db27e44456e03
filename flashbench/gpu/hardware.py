"""What the GPU allows: the spec table (configs/gpus.toml), NVML-derived figures, and calibrated ceilings.

Three ceilings per GPU, each a (bandwidth, peak FLOP/s per dtype) pair with its source:
  datasheet  configs/gpus.toml, each figure with its source
  nvml       bandwidth = 2 x NVML max memory clock x bus width / 8; peak FLOP/s = the datasheet figure
             rescaled from the clock it is quoted at (gpus.toml clock_mhz) to NVML's max SM clock
  measured   `flashbench calibrate`: achieved copy bandwidth and matmul FLOP/s on this GPU (and its read-only
             bandwidth, Ceiling.read_bw_bytes_s: the roof of a decode), stored as JSON in
             calibration_dir() (``$FLASHBENCH_HOME/calibration`` if set, else
             ``${XDG_CACHE_HOME:-~/.cache}/flashbench/calibration``), one file per GPU, ``<gpu-key>.json``.

An unknown GPU (an NVML name that matches no row) gets a "derived" entry: NVML's name, memory and derived
bandwidth, no compute peaks unless a calibration file exists, and an UnknownGpuWarning. Nothing is guessed.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashbench.configfiles import config_path, read_toml
from flashbench.errors import EXIT_NO_GPU, FlashbenchError

GPUS_FILE = "gpus.toml"
PEAK_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


class UnknownGpuWarning(UserWarning):
    """NVML reported a GPU that configs/gpus.toml does not list; a derived entry is used."""


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    arch: str = ""
    compute_capability: str = ""
    memory_bytes: int | None = None
    bw_bytes_s: float | None = None
    sm_count: int | None = None
    smem_per_sm_bytes: int | None = None
    l2_bytes: int | None = None
    clock_mhz: float | None = None
    tflops: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    sources: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    aliases: tuple[str, ...] = ()
    nvml_names: tuple[str, ...] = ()
    nvml_pattern: str | None = None
    derived: bool = False  # built from NVML because the table does not list this GPU
    note: str = ""

    def peak_flops(self, dtype: str) -> float | None:
        """Datasheet dense peak in FLOP/s for a compute dtype (fp32, tf32, fp16, bf16, fp8), or None."""
        tf = self.tflops.get(dtype)
        return tf * 1e12 if tf else None


@dataclass(frozen=True)
class Ceiling:
    """One roof: DRAM bandwidth and peak FLOP/s per compute dtype, with where they come from."""

    source: str  # "datasheet" | "nvml" | "measured"
    bw_bytes_s: float | None
    flops_s: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    note: str = ""
    # read-only bandwidth (measured: calibrate's torch.sum over 1 GiB): the roof of a decode, which reads a KV
    # cache and hardly writes, where the copy figure (bw_bytes_s) counts read + write; None where not measured
    read_bw_bytes_s: float | None = None
    # the empty kernel's event time in seconds, eager and replayed from a CUDA graph (measured: calibrate's
    # empty_kernel_us): with read_bw_bytes_s, a decode call's floor (models.roofline.decode_floor_s)
    empty_kernel_s: float | None = None
    empty_graph_s: float | None = None

    def peak(self, dtype: str) -> float | None:
        return self.flops_s.get(dtype)

    def ridge(self, dtype: str) -> float | None:
        """FLOP/byte at which this roof turns from memory-bound to compute-bound."""
        peak = self.peak(dtype)
        if not peak or not self.bw_bytes_s:
            return None
        return peak / self.bw_bytes_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "bw_bytes_s": self.bw_bytes_s,
            "flops_s": self.flops_s,
            "note": self.note,
            "read_bw_bytes_s": self.read_bw_bytes_s,
            "empty_kernel_s": self.empty_kernel_s,
            "empty_graph_s": self.empty_graph_s,
        }


# --------------------------------------------------------------------------------------- the table


def normalize_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100 80gb hbm3' (see the matching rules in configs/gpus.toml)."""
    text = name.strip().lower()
    text = re.sub(r"^nvidia\s+", "", text)
    text = re.sub(r"[-_\s]+", " ", text)
    return text.strip()


def _key_form(text: str) -> str:
    """'H100 SXM' / 'h100_sxm' -> 'h100-sxm': how --gpu names are compared with keys and aliases."""
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def _spec_from_toml(key: str, row: dict[str, Any]) -> GpuSpec:
    def num(name: str, scale: float) -> Any:
        value = row.get(name)
        return None if value is None else value * scale

    memory = num("memory_gb", 1e9)
    smem = num("smem_per_sm_kb", 1024)
    l2 = num("l2_mb", 1024 * 1024)
    return GpuSpec(
        key=key,
        name=row.get("name", key),
        arch=row.get("arch", ""),
        compute_capability=str(row.get("compute_capability", "")),
        memory_bytes=int(memory) if memory is not None else None,
        bw_bytes_s=num("bw_gb_s", 1e9),
        sm_count=row.get("sm_count"),
        smem_per_sm_bytes=int(smem) if smem is not None else None,
        l2_bytes=int(l2) if l2 is not None else None,
        clock_mhz=row.get("clock_mhz"),
        tflops={k: float(v) for k, v in row.get("tflops", {}).items()},
        sources=dict(row.get("sources", {})),
        aliases=tuple(row.get("aliases", ())),
        nvml_names=tuple(row.get("nvml_names", ())),
        nvml_pattern=row.get("nvml_pattern"),
    )


_TABLE_CACHE: dict[str, dict[str, GpuSpec]] = {}


def load_table(path: str | Path | None = None) -> dict[str, GpuSpec]:
    """The spec table, key -> GpuSpec, in file order."""
    path = Path(path) if path is not None else config_path(GPUS_FILE)
    cached = _TABLE_CACHE.get(str(path))
    if cached is not None:
        return cached
    data = read_toml(path)
    table = {}
    for key, row in data.items():
        if not isinstance(row, dict):
            raise FlashbenchError(f"{path}: [{key}] is not a table")
        table[key] = _spec_from_toml(key, row)
    _TABLE_CACHE[str(path)] = table
    return table


def known_gpus() -> list[str]:
    """'key (name)' for every row of the spec table (used by `flashbench list gpus`)."""
    return [f"{spec.key} ({spec.name})" for spec in load_table().values()]


def match_nvml_name(name: str, table: dict[str, GpuSpec] | None = None) -> GpuSpec | None:
    """The table row for a name as NVML / torch print it, or None. Exact names first, then patterns."""
    table = table if table is not None else load_table()
    norm = normalize_name(name)
    for spec in table.values():
        if norm in {normalize_name(n) for n in spec.nvml_names}:
            return spec
    for spec in table.values():
        if spec.nvml_pattern and re.fullmatch(spec.nvml_pattern, norm):
            return spec
    return None


def lookup(name: str, table: dict[str, GpuSpec] | None = None) -> GpuSpec:
    """The row for a --gpu name: a key, an alias, or an NVML name. Unknown names raise with suggestions."""
    table = table if table is not None else load_table()
    wanted = _key_form(name)
    for spec in table.values():
        if wanted == spec.key or wanted in {_key_form(a) for a in spec.aliases}:
            return spec
    by_nvml = match_nvml_name(name, table)
    if by_nvml is not None:
        return by_nvml
    raise FlashbenchError(f"unknown GPU {name!r}{_suggestion(wanted, table)}")


def _suggestion(wanted: str, table: dict[str, GpuSpec]) -> str:
    names: list[str] = []
    owner: dict[str, str] = {}
    for spec in table.values():
        for candidate in (spec.key, *spec.aliases):
            form = _key_form(candidate)
            names.append(form)
            owner.setdefault(form, spec.key)
    close = difflib.get_close_matches(wanted, names, n=6, cutoff=0.5)
    close += [n for n in names if wanted and (wanted in n or n in wanted) and n not in close]
    keys: list[str] = []
    for n in close:
        if owner[n] not in keys:
            keys.append(owner[n])
    hint = f"; did you mean {', '.join(keys[:4])}?" if keys else ""
    return f"{hint} (known: {', '.join(table)}; or --gpu auto to detect)"


# --------------------------------------------------------------------------------------- NVML


def derived_spec(facts: dict[str, Any]) -> GpuSpec:
    """An entry for a GPU the table does not list, built only from what NVML reports."""
    name = str(facts.get("name") or "unknown GPU")
    return GpuSpec(
        key=slug(name),
        name=name,
        memory_bytes=facts.get("memory_total_bytes"),
        bw_bytes_s=facts.get("derived_bw_bytes_s"),
        clock_mhz=facts.get("max_sm_clock_mhz"),
        sources={"bw_bytes_s": "derived from NVML: 2 x max memory clock x bus width / 8"},
        nvml_names=(name,),
        derived=True,
        note=(
            f"{name!r} is not in configs/gpus.toml: using a derived entry (bandwidth from NVML, "
            "no datasheet compute peak; run `flashbench calibrate` for measured ceilings)"
        ),
    )


def detect(index: int = 0) -> tuple[GpuSpec, dict[str, Any]]:
    """The spec of GPU `index` as NVML names it, and NVML's facts. No NVML -> FlashbenchError (exit 3)."""
    from flashbench.gpu import nvml

    facts = nvml.gpu_facts(index)
    if facts is None:
        raise FlashbenchError(
            "no GPU found through NVML (--gpu auto needs an NVIDIA driver); name one instead, e.g. --gpu h100",
            exit_code=EXIT_NO_GPU,
        )
    spec = match_nvml_name(facts["name"])
    if spec is None:
        spec = derived_spec(facts)
        warnings.warn(spec.note, UnknownGpuWarning, stacklevel=2)
    return spec, facts


def resolve(gpu: str, index: int = 0) -> tuple[GpuSpec, dict[str, Any] | None]:
    """--gpu NAME or --gpu auto -> (spec, NVML facts or None)."""
    if gpu.strip().lower() == "auto":
        return detect(index)
    return lookup(gpu), None


# --------------------------------------------------------------------------------------- calibration


def slug(name: str) -> str:
    """A file-name-safe form of a GPU name: 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", normalize_name(name)).strip("-") or "gpu"


def state_dir(name: str) -> Path:
    """flashbench's per-user folder `name` (calibration, autotune): $FLASHBENCH_HOME/name, else
    ${XDG_CACHE_HOME:-~/.cache}/flashbench/name."""
    home = os.environ.get("FLASHBENCH_HOME")
    if home:
        return Path(home) / name
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "flashbench" / name


def calibration_dir() -> Path:
    """Where calibrate stores its JSON: $FLASHBENCH_HOME/calibration, else the user cache directory."""
    return state_dir("calibration")


def calibration_file(spec: GpuSpec) -> Path:
    return calibration_dir() / f"{spec.key}.json"


def load_calibration(spec: GpuSpec) -> dict[str, Any] | None:
    """The stored calibration for this GPU, or None (absent). A corrupt file is a one-line error."""
    path = calibration_file(spec)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FlashbenchError(
            f"calibration file {path} is corrupt: {exc} (re-run flashbench calibrate)"
        ) from None
    if not isinstance(data, dict):
        raise FlashbenchError(f"calibration file {path} is corrupt: expected a JSON object")
    return data


def save_calibration(spec: GpuSpec, data: dict[str, Any]) -> Path:
    path = calibration_file(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------------------- ceilings


def datasheet_ceiling(spec: GpuSpec) -> Ceiling | None:
    if spec.derived:
        return None
    flops = {d: p for d in PEAK_DTYPES if (p := spec.peak_flops(d))}
    return Ceiling("datasheet", spec.bw_bytes_s, flops, "configs/gpus.toml")


def nvml_ceiling(spec: GpuSpec, facts: dict[str, Any] | None) -> Ceiling | None:
    if not facts or not facts.get("derived_bw_bytes_s"):
        return None
    max_sm = facts.get("max_sm_clock_mhz")
    flops: dict[str, float] = {}
    note = f"bandwidth 2 x {facts.get('max_mem_clock_mhz')} MHz x {facts.get('bus_width_bits')} bit / 8"
    if max_sm and spec.clock_mhz and not spec.derived:
        scale = max_sm / spec.clock_mhz
        flops = {d: p * scale for d in PEAK_DTYPES if (p := spec.peak_flops(d))}
        note += f"; peaks rescaled from {spec.clock_mhz:g} to NVML max SM clock {max_sm} MHz"
    return Ceiling("nvml", facts["derived_bw_bytes_s"], flops, note)


def measured_ceiling(calibration: dict[str, Any] | None) -> Ceiling | None:
    if not calibration:
        return None
    flops = {d: float(tf) * 1e12 for d, tf in calibration.get("matmul_tflops", {}).items() if tf}
    bw, read = calibration.get("copy_bw_gb_s"), calibration.get("read_bw_gb_s")
    when = calibration.get("timestamp_utc", "")
    note = f"flashbench calibrate {when}".strip()
    read_bw = float(read) * 1e9 if read else None
    empty = calibration.get("empty_kernel_us") or {}
    eager, graph = (float(empty[k]) * 1e-6 if empty.get(k) else None for k in ("eager", "cuda_graph"))
    return Ceiling(
        "measured",
        float(bw) * 1e9 if bw else None,
        flops,
        note,
        read_bw_bytes_s=read_bw,
        empty_kernel_s=eager,
        empty_graph_s=graph,
    )


def ceilings(
    spec: GpuSpec,
    facts: dict[str, Any] | None = None,
    calibration: dict[str, Any] | None = None,
) -> list[Ceiling]:
    """The available roofs for this GPU, in the order datasheet, nvml, measured (absent ones left out)."""
    roofs = [datasheet_ceiling(spec), nvml_ceiling(spec, facts), measured_ceiling(calibration)]
    return [r for r in roofs if r is not None]
