"""The bundled kernels' autotuner (kernels/autotune.py): rotation, the pick, the memory and disk caches, configs
that do not fit; and launch() tuning a real kernel end to end (on the CPU through Triton's interpreter, with
the GPU timing replaced by a fixed table)."""

from __future__ import annotations

import itertools
import json
import statistics

import pytest
import torch
from flashbench.kernels import autotune, common, flash_v2, last_config, launch
from triton.runtime.errors import OutOfResources

A = {"BLOCK_M": 64, "BLOCK_N": 64}
B = {"BLOCK_M": 128, "BLOCK_N": 64}
C = {"BLOCK_M": 128, "BLOCK_N": 128}


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("FLASHBENCH_AUTOTUNE_CACHE", raising=False)
    autotune.forget()
    yield
    autotune.forget()


class Fake:
    """run(config) records launches; bench(fns) launches each candidate once and returns the table's round
    times for it."""

    def __init__(self, times: dict[str, list[float]], unfit: tuple[str, ...] = ()):
        self.times = times
        self.unfit = unfit
        self.runs: list[str] = []
        self.benched: list[str] = []

    @staticmethod
    def name(config: dict) -> str:
        return {json.dumps(c, sort_keys=True): n for n, c in (("A", A), ("B", B), ("C", C))}[
            json.dumps(config, sort_keys=True)
        ]

    def run(self, config: dict) -> None:
        name = self.name(config)
        if name in self.unfit:
            raise OutOfResources(300000, 232448, "shared memory")
        self.runs.append(name)

    def bench(self, fns) -> list[list[float]]:
        out = []
        for fn in fns:
            fn()
            name = self.name(fn.args[0])
            self.benched.append(name)
            out.append(self.times[name])
        return out


def tune(fake: Fake, key=("k", 1), path="default", candidates=(A, B, C)):
    if path == "default":
        path = autotune.cache_file("k", ("identity",))
    return autotune.tune(
        key, list(candidates), fake.run, unfit=(OutOfResources,), path=path, bench=fake.bench
    )


def test_candidates_run_once_then_the_lowest_median_round_time_wins():
    # B has the lowest median (2.0) though A has the single fastest round; C is never best.
    fake = Fake({"A": [1.0, 3.0, 3.0], "B": [2.0, 2.0, 9.0], "C": [4.0, 4.0, 4.0]})
    assert tune(fake) == B
    assert fake.runs[:3] == ["A", "B", "C"]  # the compile-and-run pass, then the timing
    assert fake.benched == ["A", "B", "C"]
    report = autotune.last_report("k")
    assert report["config"] == B and report["median_ms"] == [3.0, 2.0, 4.0]
    assert report["rounds_ms"][1] == [2.0, 2.0, 9.0]


def test_ties_go_to_the_earlier_candidate():
    fake = Fake({"A": [2.0] * 3, "B": [2.0] * 3, "C": [2.0] * 3})
    assert tune(fake) == A


def test_the_pick_is_kept_in_memory_and_on_disk():
    times = {"A": [3.0] * 3, "B": [1.0] * 3, "C": [2.0] * 3}
    assert tune(Fake(times)) == B
    again = Fake(times)
    assert tune(again) == B and again.runs == [] and again.benched == []  # memory
    assert autotune.lookup(("k", 1)) == B
    autotune.forget()
    assert autotune.lookup(("k", 1)) is None
    from_disk = Fake(times)
    assert tune(from_disk) == B and from_disk.runs == []  # disk
    other_key = Fake(times)
    assert tune(other_key, key=("k", 2)) == B and other_key.benched  # another key tunes
    entry = json.loads(autotune.cache_file("k", ("identity",)).read_text())
    assert {json.loads(k)[1] for k in entry} == {"1", "2"}


def test_another_kernel_build_or_gpu_tunes_afresh():
    """The cache file is named by the kernel source hash, Triton version, GPU and candidate list."""
    times = {"A": [3.0] * 3, "B": [1.0] * 3, "C": [2.0] * 3}
    tune(Fake(times))
    autotune.forget()
    edited = Fake(times)
    tune(edited, path=autotune.cache_file("k", ("identity, edited kernel",)))
    assert edited.benched


def test_disk_cache_can_be_switched_off(monkeypatch):
    times = {"A": [3.0] * 3, "B": [1.0] * 3, "C": [2.0] * 3}
    monkeypatch.setenv("FLASHBENCH_AUTOTUNE_CACHE", "0")
    tune(Fake(times))
    assert not autotune.cache_file("k", ("identity",)).exists()  # not written
    monkeypatch.delenv("FLASHBENCH_AUTOTUNE_CACHE")
    tune(Fake(times), key=("k", 2))
    autotune.forget()
    monkeypatch.setenv("FLASHBENCH_AUTOTUNE_CACHE", "0")
    again = Fake(times)
    tune(again, key=("k", 2))
    assert again.benched  # not read either


@pytest.mark.parametrize(
    "content", ["{not json", "[1, 2]", '{"[\\"k\\", \\"1\\"]": {"config": {"BLOCK_M": 7}}}']
)
def test_a_corrupt_or_stale_cache_file_is_tuned_again_and_rewritten(content):
    path = autotune.cache_file("k", ("identity",))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    fake = Fake({"A": [3.0] * 3, "B": [1.0] * 3, "C": [2.0] * 3})
    assert tune(fake) == B and fake.benched
    assert json.loads(path.read_text())['["k", "1"]']["config"] == B


def test_configs_that_do_not_fit_are_dropped_and_none_fitting_raises():
    fake = Fake({"A": [3.0] * 3, "B": [1.0] * 3, "C": [2.0] * 3}, unfit=("B",))
    assert tune(fake) == C
    assert "B" not in fake.benched
    with pytest.raises(OutOfResources):
        tune(Fake({}, unfit=("A", "B", "C")), key=("k", 3))


@pytest.mark.skipif(torch.cuda.is_available(), reason="drives the CPU interpreter")
def test_launch_tunes_the_forward_kernel_and_reports_the_pick(monkeypatch):
    """launch() on its autotune path (reached on the CPU by pretending not to interpret): the candidates run
    for real through the interpreter, the one the timing table prefers is returned and reported by
    last_config(), the output is right, the pick is on disk, and the same key does not tune again."""
    small = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 2, "num_stages": 1}
    big = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 50, 32, generator=gen).half() for _ in range(3))
    q, k, v, scale = common.check_inputs("flash_attn", q, k, v, True, None)
    monkeypatch.setattr(flash_v2, "FWD_SPACE", ((32, 32, 4, 1), (16, 32, 2, 1)))
    monkeypatch.setattr(
        launch, "interpreting", lambda: False
    )  # the kernels still run through the interpreter
    monkeypatch.setattr(launch, "_max_shared_mem", lambda: 232448)
    monkeypatch.setattr(launch, "_device_name", lambda index: "test GPU")
    monkeypatch.setenv("FLASHBENCH_AUTOTUNE", "1")
    timed = []

    def bench(fns):
        out = []
        for fn in fns:
            fn()
            timed.append(fn.args[0])
            out.append([1.0 if fn.args[0]["BLOCK_M"] == 16 else 2.0] * 3)
        return out

    monkeypatch.setattr(autotune, "_rotated_ms", bench)
    out, _, config = flash_v2.attention_forward(q, k, v, True, scale)
    assert config == small and last_config() == small
    assert len(timed) == 2 and {json.dumps(c, sort_keys=True) for c in timed} == {
        json.dumps(c, sort_keys=True) for c in (small, big)
    }
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert (out.float() - ref).abs().max().item() < 1e-2
    files = list(autotune.cache_dir().glob("fwd_v2-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())
    timed.clear()
    assert flash_v2.attention_forward(q, k, v, True, scale)[2] == small  # same key: no tuning
    assert timed == []


@pytest.mark.gpu
def test_gpu_rotated_timing_reverses_the_order_and_ranks_the_work(monkeypatch):
    """The GPU timer runs ROUNDS rounds over the candidates, the order reversed every other round, each
    candidate timed as a sweep case (warm-up, then samples); a 64x larger matmul measures larger."""
    monkeypatch.setattr(autotune, "WARMUP_MS", 5.0)
    monkeypatch.setattr(autotune, "REP_MS", 10.0)
    order: list[int] = []
    x = torch.randn(2048, 2048, device="cuda")

    def small():
        order.append(0)
        x[:512, :512] @ x[:512, :512]

    def big():
        order.append(1)
        x @ x

    rounds = autotune._rotated_ms([small, big])
    assert [len(r) for r in rounds] == [autotune.ROUNDS] * 2
    # a candidate's calls within a round are consecutive; a reversed round starts where the one before ended
    assert [i for i, _ in itertools.groupby(order)] == [0, 1, 0, 1, 0][: autotune.ROUNDS + 1]
    assert statistics.median(rounds[1]) > 2 * statistics.median(rounds[0])


_SIDE_BY_SIDE = """
import json, os, sys, time
from flashbench.kernels import autotune
A = {"BLOCK_M": 64, "BLOCK_N": 64}
B = {"BLOCK_M": 128, "BLOCK_N": 64}

def bench(fns):
    with open(sys.argv[1], "a") as log:  # one line per tuning that timed candidates
        log.write(f"{os.getpid()}\\n")
    time.sleep(1.0)  # long enough for the other process to reach the lock
    return [[2.0], [1.0]]

path = autotune.cache_file("k", ("identity",))
print(json.dumps(autotune.tune(("k", 1), [A, B], lambda c: None, unfit=(), path=path, bench=bench)))
"""


def test_processes_side_by_side_tune_a_key_once_and_share_the_pick(tmp_path):
    """Two processes on one cache directory (the workers of --gpus): one tunes while the other waits on the key's
    lock and then reads the pick; the candidates are timed once."""
    import os
    import subprocess
    import sys

    log = tmp_path / "tunings.log"
    env = {**os.environ, "FLASHBENCH_HOME": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SIDE_BY_SIDE, str(log)], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    picks = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert picks == [B, B]
    assert len(log.read_text().split()) == 1
