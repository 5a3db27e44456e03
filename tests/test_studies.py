"""The config and A/B studies (benchmarks/studies/): provider files that `flashbench sweep` runs from a study config.

Each study config names its provider file and its providers; the file registers them through the decorator a
user's --kernel file uses, and a variant's forced config is the one its rows record as having run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tiers import interpreter_sweep

import flashbench
from flashbench.api import list_providers
from flashbench.spec.config import load_spec

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "benchmarks" / "studies"
CONFIGS = sorted(STUDIES.glob("*.toml"))
FILES = sorted(STUDIES.glob("*.py"))


@pytest.fixture(scope="module")
def registered() -> dict[str, dict[str, str]]:
    """Provider file -> {provider name: its description}, as a worker loads it (`flashbench list providers`)."""
    infos = list_providers("cpu", [str(f) for f in FILES])
    return {str(f): {i.name: i.description for i in infos if i.source == str(f)} for f in FILES}


def test_every_study_config_names_providers_its_file_registers_or_built_ins(registered):
    builtin = {i.name for i in list_providers("cpu")}
    assert CONFIGS and FILES
    for path in CONFIGS:
        spec = load_spec(config=path)
        assert spec.kernels, f"{path.name} loads no provider file"
        files = [str((ROOT / k).resolve()) for k in spec.kernels]
        known = builtin.union(*(registered[f] for f in files))
        unknown = [p for p in spec.providers if p not in known]
        assert not unknown, f"{path.name} names providers nobody registers: {unknown}"


def test_every_study_provider_is_in_a_study_config(registered):
    named = {p for path in CONFIGS for p in load_spec(config=path).providers}
    for path, providers in registered.items():
        assert providers, f"{path} registers no provider"
        orphans = sorted(set(providers) - named)
        assert not orphans, f"{Path(path).name} registers providers no study config runs: {orphans}"


def test_the_providers_a_doc_command_names_for_a_study_are_registered(registered):
    """`--providers a,b` in a doc's command that loads a study (its config or its provider file)."""
    known = {i.name for i in list_providers("cpu")}.union(*registered.values())
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks/README.md"]
    commands = [
        cmd
        for page in pages
        for cmd in re.findall(r"`([^`]*benchmarks/studies/[^`]*)`", page.read_text(encoding="utf-8"))
    ]
    named = [
        n
        for cmd in commands
        for group in re.findall(r"--providers ([\w,.-]+)", cmd)
        for n in group.split(",")
    ]
    assert named, "no doc command names a study's providers"
    assert not [n for n in named if n not in known]


def _tiny_cpu_sweep(tmp_path: Path, config: str, providers: str, mode: str) -> list:
    """The study config's sweep shrunk to one CPU shape (its kernel path is relative to the repository root)."""
    result = flashbench.sweep(
        config=STUDIES / config,
        providers=providers,
        device="cpu",
        seq=64,
        tokens=64,
        hidden=64,
        head_dim=32,
        dtype="fp16",
        causal="true",
        mode=mode,
        warmup_ms=0,
        warmup_max_ms=0,
        rep_ms=1,
        rep_max_ms=1,
        min_samples=2,
        host_loops=0,
        out=tmp_path / "run",
    )
    assert result.counts() == {"ok": len(providers.split(","))}, [(r.provider, r.reason) for r in result.rows]
    return result.rows


@interpreter_sweep
def test_a_forward_tile_study_runs_on_cpu_with_its_forced_tile(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    rows = _tiny_cpu_sweep(tmp_path, "forward_tiles.toml", "fwd-128x64-w4-s2,fwd-64x32-w4-s2", "fwd")
    tiles = {r.provider: (r.kernel_config["BLOCK_M"], r.kernel_config["BLOCK_N"]) for r in rows}
    assert tiles == {"fwd-128x64-w4-s2": (128, 64), "fwd-64x32-w4-s2": (64, 32)}


@interpreter_sweep
def test_a_backward_tile_study_runs_on_cpu_with_its_forced_dkdv_tile(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    (row,) = _tiny_cpu_sweep(tmp_path, "backward.toml", "bwd-dkdv-32x64-w4-s3", "bwd")
    assert row.kernel_config["bwd"]["dkdv"] == {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
