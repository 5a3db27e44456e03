"""Every command that writes a directory refuses one it cannot write in one line with exit 2, before any work:
an --out under a file, or in a folder that refuses new entries (read-only)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flashbench.cli.app import main

EXAMPLE = Path(__file__).resolve().parent.parent / "results" / "examples" / "h100-speed"
SWEEP = ["sweep", "--device", "cpu", "--providers", "naive", "--seq", "16", "--batch", "1", "--heads", "1"]


def _commands(target: Path) -> dict[str, list[str]]:
    return {
        "sweep": [*SWEEP, "--head-dim", "16", "--out", str(target)],
        "merge": ["merge", str(EXAMPLE), "--out", str(target)],
        "baseline save": ["baseline", "save", str(EXAMPLE), "--name", "h100", "--out-dir", str(target)],
        "report": ["report", str(EXAMPLE), "-f", "md", "-o", str(target / "r.md")],
    }


def _read_only_dir(tmp_path: Path) -> Path:
    """A folder this process may not create entries in: mode 555, or where root ignores modes, /sys (which refuses
    new entries even to root)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):  # root
        folder = Path("/sys")
        if not folder.is_dir():
            pytest.skip("running as root without /sys: no folder here refuses a new entry")
    return folder


@pytest.mark.parametrize("command", ["sweep", "merge", "baseline save", "report"])
@pytest.mark.parametrize("where", ["under-a-file", "read-only"])
def test_an_unwritable_output_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, command, where):
    monkeypatch.chdir(tmp_path)
    if where == "under-a-file":
        (tmp_path / "afile.txt").write_text("not a folder")
        target, why = Path("afile.txt") / "out", "afile.txt is a file, not a directory"
    else:
        target, why = _read_only_dir(tmp_path) / "flashbench-out", "cannot write to "
    argv = _commands(target)[command]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # no traceback
    assert (
        err[0].startswith("flashbench: error: cannot write to ") and why in err[0] and str(target) in err[0]
    )
    assert not target.exists()


def test_report_of_a_file_names_the_file_not_its_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("afile.txt").write_text("not a run")
    assert main(["report", "afile.txt"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "flashbench: error: afile.txt is a file, not a run directory (one holding env.json and rows.jsonl)"
    )
