"""GPU facts and clock/power/throttle samples from NVML (nvidia-ml-py, imported as ``pynvml``).

ClockSampler reads clocks, power and clock-event reasons in a thread while a case warms up and runs its samples
(engine/timing.py); window_summary turns the readings of the timed window into a row's fields.

Every public function returns None (or [] for all_gpus) where NVML is absent: no package, no driver, no GPU,
or a call that fails. Nothing here raises, so the CPU machines and CI can call it freely.

Bandwidth derived from NVML: 2 (double data rate) x max memory clock x bus width / 8. On the H100 SXM that is
2 x 2619 MHz x 5120 bit / 8 = 3.35 TB/s, the datasheet figure; on GDDR parts NVML already reports the
effective data clock per pin / 2 (RTX 4090: 2 x 10501 MHz x 384 / 8 = 1008 GB/s), so the same formula holds.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

# Clock-event (formerly "throttle") reason bits, as in nvml.h. Idle and the application-clock setting are not
# throttling: an idle GPU drops its clocks on purpose, and application clocks are the configured target.
REASON_GPU_IDLE = 0x1
REASON_APP_CLOCK_SETTING = 0x2
NOT_THROTTLING = REASON_GPU_IDLE | REASON_APP_CLOCK_SETTING
REASON_NAMES: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "app_clock_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

_state: dict[str, Any] = {"tried": False, "nvml": None}


def _nvml() -> Any | None:
    """The initialised pynvml module, or None. nvmlInit runs once per process."""
    if not _state["tried"]:
        _state["tried"] = True
        try:
            import pynvml

            pynvml.nvmlInit()
            _state["nvml"] = pynvml
        except Exception:
            _state["nvml"] = None
    return _state["nvml"]


def _call(fn: Any, *args: Any) -> Any | None:
    try:
        value = fn(*args)
    except Exception:
        return None
    if isinstance(value, bytes):  # old nvidia-ml-py returned bytes for strings
        value = value.decode("utf-8", "replace")
    return value


def _handle(nv: Any, index: int) -> Any | None:
    return _call(nv.nvmlDeviceGetHandleByIndex, index)


def _device(index: int) -> tuple[Any, Any] | None:
    """(the NVML module, GPU `index`'s handle), or None without NVML or that GPU."""
    nv = _nvml()
    if nv is None:
        return None
    h = _handle(nv, index)
    return None if h is None else (nv, h)


def index_at_pci(domain: int, bus: int, device: int) -> int | None:
    """NVML's index of the GPU at this PCI address (domain:bus:device, as torch's device properties give it), or
    None: how a process finds NVML's GPU for its CUDA device, whatever CUDA_VISIBLE_DEVICES holds (an index, a
    GPU- or MIG- UUID) and whatever CUDA_DEVICE_ORDER numbers them by. A MIG instance answers as its GPU."""
    nv = _nvml()
    if nv is None:
        return None
    h = _call(nv.nvmlDeviceGetHandleByPciBusId, f"{domain:08x}:{bus:02x}:{device:02x}.0")
    return None if h is None else _call(nv.nvmlDeviceGetIndex, h)


def index_of(pci: Any) -> int:
    """NVML's index of the GPU a process measures on, from its CUDA device's PCI address (domain, bus, device;
    None where torch gives none): index_at_pci's answer; where NVML gives none, the first CUDA_VISIBLE_DEVICES
    entry when it is a plain number, else 0."""
    if pci:
        index = index_at_pci(*pci)
        if isinstance(index, int):
            return index
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def derived_bandwidth(max_mem_clock_mhz: float | None, bus_width_bits: int | None) -> float | None:
    """Peak DRAM bytes/s from NVML's max memory clock and bus width: 2 x clock x width / 8."""
    if not max_mem_clock_mhz or not bus_width_bits:
        return None
    return 2.0 * max_mem_clock_mhz * 1e6 * bus_width_bits / 8.0


def reason_names(reasons: int | None) -> list[str]:
    """Readable names of the set clock-event reason bits (unknown bits as hex)."""
    if not reasons:
        return []
    out = [name for bit, name in REASON_NAMES.items() if reasons & bit]
    unknown = reasons & ~sum(REASON_NAMES)
    if unknown:
        out.append(hex(unknown))
    return out


def gpu_facts(index: int = 0) -> dict[str, Any] | None:
    """Static facts about GPU `index`: name, memory, max clocks, bus width, derived bandwidth, driver, the
    enforced power limit."""
    found = _device(index)
    if found is None:
        return None
    nv, h = found
    name = _call(nv.nvmlDeviceGetName, h)
    if name is None:
        return None
    mem = _call(nv.nvmlDeviceGetMemoryInfo, h)
    max_sm = _call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
    max_mem = _call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM)
    bus = _call(getattr(nv, "nvmlDeviceGetMemoryBusWidth", lambda _h: None), h)
    cuda = _call(nv.nvmlSystemGetCudaDriverVersion)
    # The power limit the driver enforces (milliwatts; the lower of the board's and any set with nvidia-smi -pl):
    # the limit the sw_power_cap clock-event reason refers to.
    limit_mw = _call(getattr(nv, "nvmlDeviceGetEnforcedPowerLimit", lambda _h: None), h)
    return {
        "index": index,
        "name": str(name),
        "memory_total_bytes": int(mem.total) if mem is not None else None,
        "max_sm_clock_mhz": max_sm,
        "max_mem_clock_mhz": max_mem,
        "bus_width_bits": bus,
        "derived_bw_bytes_s": derived_bandwidth(max_mem, bus),
        "driver": _call(nv.nvmlSystemGetDriverVersion),
        # NVML encodes CUDA 13.0 as 13000.
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
        "power_limit_w": limit_mw / 1000.0 if isinstance(limit_mw, int | float) else None,
    }


def sample(index: int = 0) -> dict[str, Any] | None:
    """Clocks, power, temperature and clock-event reasons of GPU `index` right now."""
    found = _device(index)
    if found is None:
        return None
    nv, h = found
    power_mw = _call(nv.nvmlDeviceGetPowerUsage, h)
    get_reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    reasons = _call(get_reasons, h) if get_reasons else None
    reasons = int(reasons) if reasons is not None else 0
    return {
        "sm_clock_mhz": _call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
        "mem_clock_mhz": _call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
        "power_w": power_mw / 1000.0 if power_mw is not None else None,
        "temp_c": _call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
        "clock_event_reasons": reasons,
        "throttled": bool(reasons & ~NOT_THROTTLING),
    }


def energy_mj(index: int = 0) -> int | None:
    """GPU `index`'s total energy counter (mJ since the driver loaded; Volta and newer), or None."""
    found = _device(index)
    if found is None:
        return None
    nv, h = found
    value = _call(getattr(nv, "nvmlDeviceGetTotalEnergyConsumption", lambda _h: None), h)
    return int(value) if value is not None else None


def all_gpus() -> list[dict[str, Any]]:
    """gpu_facts() for every GPU NVML sees; [] without NVML."""
    nv = _nvml()
    if nv is None:
        return []
    count = _call(nv.nvmlDeviceGetCount) or 0
    return [f for f in (gpu_facts(i) for i in range(count)) if f is not None]


# The SM clock readings kept per row: all of them up to this many, else evenly spaced ones.
MAX_KEPT_READINGS = 200


class ClockSampler:
    """Reads `read()` (e.g. `lambda: sample(index)`) every `interval_s` in a daemon thread, from start() to stop().

    NVML calls release the GIL and take tens of microseconds, so a 10 ms period costs the measuring thread
    nothing it times. mark() starts the timed window: stop() returns the readings taken after it.
    """

    def __init__(
        self,
        read: Callable[[], dict[str, Any] | None],
        interval_s: float = 0.01,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read, self._interval, self._now = read, interval_s, now
        self._readings: list[dict[str, Any]] = []
        self._mark = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _take(self) -> None:
        reading = self._read()
        if reading is not None:
            self._readings.append({**reading, "t": self._now()})

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(self._interval)

    def start(self) -> None:
        self._readings, self._mark = [], 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="flashbench-nvml", daemon=True)
        self._thread.start()

    def sm_clocks(self) -> list[tuple[float, float]]:
        """(time, SM clock MHz) of every reading so far (the warm-up's settle rule reads these)."""
        return [(r["t"], r["sm_clock_mhz"]) for r in list(self._readings) if r.get("sm_clock_mhz")]

    def mark(self) -> None:
        self._take()
        self._mark = len(self._readings)

    def window(self) -> list[dict[str, Any]]:
        """The readings taken since mark(), so far."""
        return list(self._readings[self._mark :])

    def stop(self) -> list[dict[str, Any]]:
        """Stop the thread (after one last reading); the readings taken since mark()."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take()
        return self.window()


def clock_sampler(index: int) -> ClockSampler | None:
    """A ClockSampler of GPU `index` (sample(index) every 10 ms), or None where NVML gives it no reading."""
    return ClockSampler(lambda: sample(index)) if sample(index) else None


def window_summary(readings: list[dict[str, Any]]) -> dict[str, Any]:
    """Row fields from the NVML readings of a timed window (sample() dicts); {} when there are none.

    Medians for the SM clock, memory clock, power and temperature; the SM clock's range and its raw readings
    (at most MAX_KEPT_READINGS, evenly spaced); the clock-event reasons other than idle seen in any reading,
    and the share of readings in which one was.
    """
    if not readings:
        return {}

    def median(key: str) -> float | None:
        values = [r[key] for r in readings if r.get(key) is not None]
        return float(statistics.median(values)) if values else None

    sm = [int(r["sm_clock_mhz"]) for r in readings if r.get("sm_clock_mhz") is not None]
    step = max(1, -(-len(sm) // MAX_KEPT_READINGS))
    held = [int(r.get("clock_event_reasons") or 0) & ~NOT_THROTTLING for r in readings]
    reasons = 0
    for bits in held:
        reasons |= bits
    return {
        "sm_clock_mhz": median("sm_clock_mhz"),
        "sm_clock_min_mhz": min(sm) if sm else None,
        "sm_clock_max_mhz": max(sm) if sm else None,
        "mem_clock_mhz": median("mem_clock_mhz"),
        "power_w": median("power_w"),
        "temp_c": median("temp_c"),
        "clock_readings_mhz": sm[::step],
        "throttle_reasons": reason_names(reasons),
        "throttled_share": round(sum(1 for bits in held if bits) / len(held), 3),
    }
