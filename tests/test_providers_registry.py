"""The provider registry: declarations, support checks, user kernel files, and no torch in the parent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flashbench.errors import FlashbenchError
from flashbench.providers import builtin, registry
from flashbench.spec.cases import Case

FIXTURES = Path(__file__).parent / "fixtures_providers"
EXAMPLE = Path(__file__).parent.parent / "examples" / "my_attention.py"


def test_builtins_are_registered_with_their_declarations():
    builtin.load()
    names = registry.names()
    for name in (
        "naive",
        "sdpa",
        "sdpa-math",
        "sdpa-efficient",
        "sdpa-flash",
        "sdpa-cudnn",
        "flex",
        "flash-attn",
        "flash-attn-3",
        "triton",
        "triton-stored-p",
        "triton-v1",
    ):
        assert name in names
    fa = registry.get("flash-attn").info
    assert fa.layout == "bnhd" and fa.dtypes == ("fp16", "bf16") and fa.devices == ("cuda",)
    assert registry.get("naive").info.memory_family == "naive"
    assert registry.get("triton-stored-p").info.memory_family == "stored-p"


def test_supports_explains_every_refusal():
    info = registry.ProviderInfo(
        "p", dtypes=("bf16",), head_dims=(64,), causal=False, backward=False, devices=("cuda",)
    )
    case = Case("p", 1, 4, 4, 128, 128, 64, "bf16", False, "fwd")
    assert info.supports(case, "cuda") is None
    assert "cuda only" in info.supports(case, "cpu")
    assert "fp16" in info.supports(Case("p", 1, 4, 4, 128, 128, 64, "fp16", False, "fwd"), "cuda")
    assert "head_dim 96" in info.supports(Case("p", 1, 4, 4, 128, 128, 96, "bf16", False, "fwd"), "cuda")
    assert "causal" in info.supports(Case("p", 1, 4, 4, 128, 128, 64, "bf16", True, "fwd"), "cuda")
    assert "backward" in info.supports(Case("p", 1, 4, 4, 128, 128, 64, "bf16", False, "bwd"), "cuda")
    assert "GQA" in info.supports(Case("p", 1, 4, 2, 128, 128, 64, "bf16", False, "fwd"), "cuda")


def test_fp8_is_declared_not_assumed_and_forward_only():
    """A provider takes fp8 only when it declares it (its call then gets e4m3 inputs and descales); an fp8
    backward is never timed; the refusals say so rather than run an upcast."""
    plain = registry.ProviderInfo("plain")
    declared = registry.ProviderInfo("declared", dtypes=("bf16", "fp8"))
    fwd, bwd = (Case("p", 1, 4, 4, 128, 128, 64, "fp8", False, mode) for mode in ("fwd", "fwd+bwd"))
    assert "fp8" not in plain.dtypes and "fp8" not in registry.DEFAULT_DTYPES
    assert "no FP8" in plain.supports(fwd, "cuda") and "upcast" in plain.supports(fwd, "cuda")
    assert declared.supports(fwd, "cuda") is None
    assert "forward only" in declared.supports(bwd, "cuda")
    triton, sdpa = registry.get("triton").info, registry.get("sdpa").info
    assert "fp8" in triton.dtypes and "fp8" not in sdpa.dtypes


def test_register_rejects_bad_declarations():
    with pytest.raises(FlashbenchError, match="unknown dtype"):
        registry.register("x", dtypes=("fp4",))
    with pytest.raises(FlashbenchError, match="memory_family"):
        registry.register("x", memory_family="tiny")
    with pytest.raises(FlashbenchError, match="must be non-empty"):
        registry.register("a|b")


def test_kernel_file_registers_through_the_same_decorator():
    added = registry.load_kernel_file(EXAMPLE)
    assert added == ["my-attention"]
    info = registry.get("my-attention").resolved_info()
    assert info.source == str(EXAMPLE.resolve()) and info.available and info.backward


def test_bad_kernel_files_are_one_line_errors(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import nonexistent_module_xyz\n")
    with pytest.raises(FlashbenchError, match="ModuleNotFoundError"):
        registry.load_kernel_file(broken)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(FlashbenchError, match="registered no provider"):
        registry.load_kernel_file(empty)
    clash = tmp_path / "clash.py"
    clash.write_text(
        "from flashbench.providers import register\n@register('naive')\ndef f(q, k, v, causal, sm_scale): pass\n"
    )
    builtin.load()
    with pytest.raises(FlashbenchError, match="clashes"):
        registry.load_kernel_file(clash)
    with pytest.raises(FlashbenchError, match="not found"):
        registry.load_kernel_file(tmp_path / "missing.py")


def test_parent_side_modules_never_import_torch():
    code = (
        "import sys, flashbench, flashbench.api, flashbench.engine.runner, flashbench.spec.plan, flashbench.cli.sweep\n"
        "from flashbench.providers import builtin\n"
        "builtin.load()\n"
        "from flashbench.spec.config import load_spec\n"
        "load_spec(preset='default')\n"
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
