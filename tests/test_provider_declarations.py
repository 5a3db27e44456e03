"""A provider's declaration is the one truth about it: the models, the rows, the report's colours, the default
speedup reference, the gate's in-run ratio and the environment's package list all read it, never its name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flashbench.analysis import gate
from flashbench.analysis import runs as analysis
from flashbench.errors import FlashbenchError
from flashbench.models import memory
from flashbench.providers import builtin, registry
from flashbench.report.style import HASH_COLORS, provider_color
from flashbench.results.env import Environment, write_env
from flashbench.results.rows import ROWS_FILE, Row, append_row, read_rows
from flashbench.spec.cases import Case

GPU = "NVIDIA H100 80GB HBM3"
SHIPPED_GATE_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "gate.toml"


@pytest.fixture
def declared() -> Iterator[list[str]]:
    """Providers a test registers; taken out of the registry again after it."""
    names: list[str] = []
    yield names
    for name in names:
        registry._REGISTRY.pop(name, None)


def _register(names: list[str], name: str, **declaration: object) -> None:
    registry.register(name, devices=("cuda", "cpu"), source="test", **declaration)(lambda q, k, v, **kw: q)  # type: ignore[arg-type]
    names.append(name)


def _ok(provider: str, ms: float, n: int = 2048) -> Row:
    case = Case(provider, 1, 8, 8, n, n, 64, "bf16", False, "fwd+bwd")
    return Row.for_case(case, "ok", gpu=GPU, samples_ms=[ms] * 10, median_ms=ms, p20_ms=ms, p80_ms=ms)


def _run(run_dir: Path, rows: list[Row]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_env(run_dir, Environment(gpu=GPU))
    for row in rows:
        append_row(run_dir, row)
    return run_dir


def test_a_name_that_reads_like_another_family_is_modelled_as_its_declared_family(declared, tmp_path):
    """ "math", "v1" and "stored" in a name once made the models take sdpa-math, flash-v1 and stored-p."""
    for name in ("my-math", "my-v1", "my-stored"):
        _register(declared, name, memory_family="flash")
    _register(declared, "my-flash-named-naive", memory_family="naive")
    run = analysis.load_run(_run(tmp_path / "run", [_ok(n, 1.0) for n in declared]))
    frame = run.frame.set_index("provider")
    for name in declared:
        family = registry.get(name).info.memory_family
        assert frame.loc[name, "family"] == family
        expected = memory.predicted_peak_bytes(family, 1, 8, 8, 2048, 2048, 64, 2, False, "fwd+bwd")
        assert frame.loc[name, "model_mem_bytes"] == expected
    # the declared families differ in their models, so the columns above could not agree by accident
    assert frame.loc["my-flash-named-naive", "model_mem_bytes"] > 10 * frame.loc["my-math", "model_mem_bytes"]


def test_rows_carry_the_family_and_an_old_results_file_without_it_still_loads(tmp_path):
    """A rows.jsonl written before rows carried the family takes each provider's declared one; a provider that
    no registry here knows (a user kernel's row) is modelled as the default family."""
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    write_env(run_dir, Environment(gpu=GPU))
    lines = []
    for provider in ("naive", "sdpa-math", "triton-v1", "someone-elses-stored-kernel"):
        data = _ok(provider, 2.0).to_dict()
        assert data.pop("family") == (registry.family_of(provider))  # a new row carries it
        lines.append(json.dumps(data) + "\n")
    (run_dir / ROWS_FILE).write_text("".join(lines), encoding="utf-8")
    rows = {r.provider: r.family for r in read_rows(run_dir)}
    assert rows == {
        "naive": "naive",
        "sdpa-math": "sdpa-math",
        "triton-v1": "flash-v1",
        "someone-elses-stored-kernel": registry.DEFAULT_FAMILY,
    }
    frame = analysis.load_run(run_dir).frame.set_index("provider")
    assert frame.loc["someone-elses-stored-kernel", "family"] == "flash"
    assert frame["model_bytes_provider"].notna().all()


def test_a_row_keeps_the_family_it_was_written_with(tmp_path):
    """The row, not today's registry, says what was measured: a family written into the file is read back."""
    row = _ok("naive", 2.0)
    row.family = "flash"
    append_row(_run(tmp_path / "run", []), row)
    (back,) = read_rows(tmp_path / "run")
    assert back.family == "flash"


def test_registering_one_provider_is_all_it_takes(declared, tmp_path):
    """Its family reaches the models, its colour the figures, its rank the default speedup reference, its
    ratio the gate and its package the environment record, from the one registration."""
    _register(
        declared,
        "new-kernel",
        memory_family="stored-p",
        baseline=-1,
        ratio_vs="sdpa-flash",
        colour="#123456",
        package="new-kernel-dist",
    )
    run = analysis.load_run(_run(tmp_path / "run", [_ok("naive", 4.0), _ok("new-kernel", 2.0)]))
    assert run.frame.set_index("provider").loc["new-kernel", "family"] == "stored-p"
    assert analysis.pick_baseline(run.frame) == "new-kernel"  # ranked before naive
    assert provider_color("new-kernel") == "#123456"
    assert ("new-kernel", "sdpa-flash") in gate.GateConfig().ratio_pairs
    assert ("new-kernel", "sdpa-flash") in gate.load_config(SHIPPED_GATE_CONFIG).ratio_pairs
    assert "new-kernel-dist" in builtin.packages()


def test_builtins_declare_the_references_colours_and_packages():
    assert builtin.baselines() == (
        "naive",
        "sdpa-math",
        "sdpa",
        "sdpa-flash",
        "sdpa-efficient",
        "flex",
        "sdpa-cudnn",
    )
    assert builtin.ratio_pairs() == (("triton", "sdpa-flash"),)
    assert builtin.packages() == ("flash-attn", "flash_attn_3", "flash_mla", "nvidia-ml-py", "pandas")
    colours = builtin.colours()
    assert len(set(colours.values())) == len(colours)  # no two built-in providers share a colour
    assert not set(HASH_COLORS) & set(colours.values())  # nor does a user kernel's hashed one
    assert provider_color("a-user-kernel") in HASH_COLORS


def test_bad_declarations_are_one_line_errors():
    with pytest.raises(FlashbenchError, match="colour must be '#rrggbb'"):
        registry.register("x", colour="blue")
