"""The GPU table, NVML name matching, unknown GPUs, missing NVML, calibration files."""

from __future__ import annotations

import types

import pytest

from flashbench.errors import FlashbenchError
from flashbench.gpu import hardware, nvml

# Names as NVML / nvidia-smi / torch.cuda.get_device_name() print them.
DOCUMENTED_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA H200": "h200",
    "NVIDIA H200 NVL": "h200-nvl",
    "NVIDIA A100-SXM4-80GB": "a100-sxm-80gb",
    "NVIDIA A100-SXM4-40GB": "a100-sxm-40gb",
    "A100-SXM4-40GB": "a100-sxm-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA L40S": "l40s",
    "NVIDIA L4": "l4",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA B200": "b200",
}


@pytest.mark.parametrize(("name", "key"), sorted(DOCUMENTED_NAMES.items()))
def test_nvml_names_match_their_row(name, key):
    assert hardware.match_nvml_name(name).key == key


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA L40",
        "NVIDIA GH200 480GB",
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA H800",
        "NVIDIA A10",
        "Tesla T4",
    ],
)
def test_other_parts_do_not_match_a_listed_row(name):
    assert hardware.match_nvml_name(name) is None


def test_every_row_has_sources_and_every_listed_name_is_unambiguous():
    table = hardware.load_table()
    assert {
        "h100-sxm",
        "h100-pcie",
        "h100-nvl",
        "h200",
        "a100-sxm-40gb",
        "a100-sxm-80gb",
        "a100-pcie",
        "l40s",
        "l4",
        "rtx-4090",
        "b200",
    } <= set(table)
    for spec in table.values():
        assert spec.bw_bytes_s and spec.sm_count and spec.l2_bytes and spec.smem_per_sm_bytes
        assert {"fp32", "tf32", "fp16", "bf16"} <= set(spec.tflops)
        for fig in ("tflops", "bw_gb_s", "sm_count", "smem_per_sm_kb", "l2_mb"):
            assert spec.sources.get(fig), f"{spec.key}: no source for {fig}"
        for name in spec.nvml_names:
            assert hardware.match_nvml_name(name).key == spec.key


def test_lookup_by_alias_key_and_nvml_name():
    assert hardware.lookup("h100").key == "h100-sxm"
    assert hardware.lookup("H100_SXM").key == "h100-sxm"
    assert hardware.lookup("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert hardware.lookup("a100").key == "a100-sxm-80gb"


def test_bad_gpu_name_suggests_close_matches():
    with pytest.raises(FlashbenchError) as exc:
        hardware.lookup("h1000")
    assert "did you mean" in str(exc.value) and "h100" in str(exc.value)
    assert exc.value.exit_code == 2


def test_unknown_gpu_gets_a_labelled_derived_entry(monkeypatch):
    facts = {
        "name": "NVIDIA Future X1",
        "memory_total_bytes": 10**11,
        "max_sm_clock_mhz": 2000,
        "max_mem_clock_mhz": 3000,
        "bus_width_bits": 8192,
        "derived_bw_bytes_s": 6.144e12,
    }
    monkeypatch.setattr(nvml, "gpu_facts", lambda index=0: facts)
    with pytest.warns(hardware.UnknownGpuWarning):
        spec, got = hardware.detect()
    assert spec.derived and "not in configs/gpus.toml" in spec.note
    roofs = hardware.ceilings(spec, got)
    assert [r.source for r in roofs] == ["nvml"]
    assert roofs[0].bw_bytes_s == 6.144e12 and roofs[0].flops_s == {}  # no guessed compute peak


def test_known_gpu_nvml_ceiling_rescales_to_max_clock(monkeypatch):
    facts = {
        "name": "NVIDIA H100 80GB HBM3",
        "max_sm_clock_mhz": 1980,
        "max_mem_clock_mhz": 2619,
        "bus_width_bits": 5120,
        "derived_bw_bytes_s": nvml.derived_bandwidth(2619, 5120),
    }
    monkeypatch.setattr(nvml, "gpu_facts", lambda index=0: facts)
    spec, got = hardware.detect()
    assert spec.key == "h100-sxm" and not spec.derived
    sheet, derived = hardware.ceilings(spec, got)
    assert derived.bw_bytes_s == pytest.approx(3.352e12, rel=1e-3)
    assert derived.peak("bf16") == pytest.approx(989.4e12 * 1980 / 1830)


def test_missing_nvml_returns_none_and_auto_exits_3(monkeypatch):
    monkeypatch.setitem(nvml._state, "tried", True)
    monkeypatch.setitem(nvml._state, "nvml", None)
    assert nvml.gpu_facts() is None and nvml.sample() is None and nvml.all_gpus() == []
    with pytest.raises(FlashbenchError) as exc:
        hardware.resolve("auto")
    assert exc.value.exit_code == 3


class FakeNvml:
    """The pynvml calls gpu_facts makes, answering as an H100 SXM at a 700 W limit does (milliwatts, MHz)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self, power_limit_mw: object = 700_000) -> None:
        self.power_limit_mw = power_limit_mw

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA H100 80GB HBM3"  # old nvidia-ml-py returned bytes

    def nvmlDeviceGetMemoryInfo(self, h: str) -> object:
        return types.SimpleNamespace(total=85520809984)

    def nvmlDeviceGetMaxClockInfo(self, h: str, clock: int) -> int:
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetMemoryBusWidth(self, h: str) -> int:
        return 5120

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        if isinstance(self.power_limit_mw, Exception):
            raise self.power_limit_mw
        return self.power_limit_mw


def test_gpu_facts_record_the_enforced_power_limit_in_watts(monkeypatch):
    monkeypatch.setitem(nvml._state, "tried", True)
    monkeypatch.setitem(nvml._state, "nvml", FakeNvml(power_limit_mw=700_000))
    facts = nvml.gpu_facts(0)
    assert facts["power_limit_w"] == 700.0
    assert (facts["name"], facts["max_sm_clock_mhz"], facts["cuda_driver_version"]) == (
        "NVIDIA H100 80GB HBM3",
        1980,
        "13.0",
    )
    # A driver that refuses the query (NVML_ERROR_NOT_SUPPORTED on some boards) leaves it unrecorded, no raise.
    monkeypatch.setitem(nvml._state, "nvml", FakeNvml(power_limit_mw=RuntimeError("Not Supported")))
    facts = nvml.gpu_facts(0)
    assert facts["power_limit_w"] is None and facts["max_sm_clock_mhz"] == 1980


def test_throttle_reasons():
    assert nvml.reason_names(0x5) == ["gpu_idle", "sw_power_cap"]
    assert nvml.derived_bandwidth(2619, 5120) == pytest.approx(3.352e12, rel=1e-3)


def test_calibration_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    spec = hardware.lookup("h100")
    assert hardware.load_calibration(spec) is None
    path = hardware.save_calibration(spec, {"copy_bw_gb_s": 3000, "matmul_tflops": {"bf16": 750.0}})
    assert path == tmp_path / "calibration" / "h100-sxm.json"
    roofs = hardware.ceilings(spec, None, hardware.load_calibration(spec))
    assert [r.source for r in roofs] == ["datasheet", "measured"]
    assert roofs[1].bw_bytes_s == 3e12 and roofs[1].peak("bf16") == 750e12
    path.write_text("{not json")
    with pytest.raises(FlashbenchError):
        hardware.load_calibration(spec)


def _reported_l2() -> dict[str, int]:
    """L2 sizes the devices of committed runs reported (torch.cuda.get_device_properties().L2_cache_size)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    seen: dict[str, int] = {}
    for env_file in sorted([*root.glob("results/**/env.json"), *root.glob("benchmarks/**/env.json")]):
        worker = json.loads(env_file.read_text()).get("worker") or {}
        if worker.get("name") and worker.get("l2_cache_bytes"):
            seen[worker["name"]] = int(worker["l2_cache_bytes"])
    return seen


@pytest.mark.parametrize(("name", "l2"), sorted(_reported_l2().items()))
def test_spec_table_l2_matches_what_the_device_reported(name, l2):
    assert hardware.match_nvml_name(name).l2_bytes == l2


class PciNvml(FakeNvml):
    """Two GPUs, NVML's indices 0 and 1 at PCI buses 0x18 and 0x2a; an unknown address raises, as NVML_ERROR_NOT_FOUND
    does."""

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> str:
        return {"00000000:18:00.0": "gpu0", "00000000:2a:00.0": "gpu1"}[bus_id]

    def nvmlDeviceGetIndex(self, h: str) -> int:
        return int(h[3:])


def test_a_worker_finds_its_gpu_in_nvml_by_pci_address_whatever_cuda_visible_devices_holds(monkeypatch):
    """The rows' clocks, power and throttle reasons come from NVML's GPU at the worker's PCI address: under a UUID
    in CUDA_VISIBLE_DEVICES, and under an index that CUDA numbers otherwise than NVML; without an answer from NVML,
    the first plain-number entry, else GPU 0."""
    from flashbench.engine import worker

    monkeypatch.setitem(nvml._state, "tried", True)
    monkeypatch.setitem(nvml._state, "nvml", PciNvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-77d0")
    assert worker._nvml_index({"pci": [0, 0x2A, 0]}) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert worker._nvml_index({"pci": [0, 0x2A, 0]}) == 1
    assert worker._nvml_index({"pci": [0, 0x99, 0]}) == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert worker._nvml_index({}) == 3
    monkeypatch.setitem(nvml._state, "nvml", None)  # no NVML at all
    assert worker._nvml_index({"pci": [0, 0x2A, 0]}) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-77d0")
    assert worker._nvml_index({"pci": [0, 0x2A, 0]}) == 0
