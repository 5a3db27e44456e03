"""A sweep survives whatever a provider does: segfault, hang, OOM, NaN; kill -9 + --resume loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flashbench.cli.app import main
from flashbench.results.env import read_env
from flashbench.results.rows import read_rows

FIXTURES = Path(__file__).parent / "fixtures_providers"
TINY = ["--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--dtype", "fp16"]
TINY = ["--config", str(Path(__file__).with_name("fast_measure.toml")), *TINY]  # tests/fast_measure.toml: why


def test_misbehaving_providers_get_their_status_while_the_others_complete(tmp_path):
    out = tmp_path / "run"
    kernels = [
        arg
        for name in ("segfault", "hang", "oom", "nan", "wrong")
        for arg in ("--kernel", str(FIXTURES / f"{name}.py"))
    ]
    providers = "naive,test-segfault,test-hang,test-oom,test-nan,test-wrong"
    code = main(
        [
            "sweep",
            *TINY,
            *kernels,
            "--providers",
            providers,
            "--seq",
            "16,32",
            "--causal",
            "false",
            "--mode",
            "fwd",
            "--timeout",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    status = {(r.provider, r.seq_k): r for r in read_rows(out, latest_only=False)}
    assert len(status) == 12
    assert status[("naive", 16)].status == status[("naive", 32)].status == "ok"
    for n in (16, 32):
        crash = status[("test-segfault", n)]
        assert crash.status == "crash" and "SIGSEGV" in crash.reason and "segfault.py" in crash.reason
        assert status[("test-nan", n)].status == "wrong" and "NaN" in status[("test-nan", n)].reason
        assert status[("test-nan", n)].median_ms is None  # a wrong result is never a speed
        off = status[("test-wrong", n)]
        assert off.status == "wrong" and off.rel_err > off.err_budget and off.median_ms is None
    hang = status[("test-hang", 16)]
    assert hang.status == "timeout" and "8 s" in hang.reason
    assert (
        status[("test-hang", 32)].status == "skipped"
        and "timed out at N=16" in status[("test-hang", 32)].reason
    )
    assert status[("test-oom", 16)].status == "ok"
    assert status[("test-oom", 32)].status == "oom" and "out of memory" in status[("test-oom", 32)].reason


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()
    except FileNotFoundError:
        return False


def test_kill_9_mid_sweep_then_resume_finishes_without_duplicates_or_losses(tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "slowish.toml"
    config.write_text(
        '[sweep]\nproviders = "naive"\nseq = "16..128"\nbatch = 1\nheads = 2\nhead_dim = 16\ndtype = "fp32"\n'
        'causal = "both"\nmode = "fwd,fwd+bwd"\ndevice = "cpu"\n[measure]\nwarmup_ms = 0\nrep_ms = 150\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "flashbench", "sweep", "--config", str(config), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rows_file = out / "rows.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if rows_file.is_file() and len(rows_file.read_text().splitlines()) >= 4:
            break
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(read_rows(out, latest_only=False))
    assert 4 <= finished < 16
    worker_pid = read_env(out).worker["pid"]
    for _ in range(100):  # the worker dies with its parent (PR_SET_PDEATHSIG)
        if not _alive(worker_pid):
            break
        time.sleep(0.05)
    assert not _alive(worker_pid)
    with rows_file.open("a") as fh:  # as if the kill had landed mid-append
        fh.write('{"provider":"naive","batch":1,"hea')
    assert main(["sweep", "--out", str(out), "--resume"]) == 0  # the spec comes back from env.json
    rows = read_rows(out, latest_only=False)
    keys = [r.key for r in rows]
    assert len(keys) == 16 and len(set(keys)) == 16
    assert all(r.status == "ok" for r in rows)
    assert json.loads(rows_file.read_text().splitlines()[-1])["status"] == "ok"


def test_ctrl_c_exits_130_and_keeps_every_finished_row(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flashbench",
            "sweep",
            "--device",
            "cpu",
            "--providers",
            "naive",
            "--seq",
            "16..128",
            "--batch",
            "1",
            "--heads",
            "2",
            "--head-dim",
            "16",
            "--out",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    rows_file = out / "rows.jsonl"
    deadline = time.monotonic() + 120
    while not (rows_file.is_file() and len(rows_file.read_text().splitlines()) >= 2):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:  # the sweep finished before the signal landed
        return
    assert proc.returncode == 130 and "interrupted" in err
    rows = read_rows(out, latest_only=False)
    assert len(rows) >= 2 and all(r.status == "ok" for r in rows)
    assert not _alive(read_env(out).worker["pid"])
