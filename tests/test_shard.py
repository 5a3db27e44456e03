"""`--shard i/n`: a deterministic partition of a sweep by shape, the same in every process, and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashbench.cli.app import main
from flashbench.engine import correctness, shard, timing
from flashbench.results.env import read_env
from flashbench.results.rows import read_rows
from flashbench.spec.cases import Case
from flashbench.spec.config import load_spec
from flashbench.spec.plan import expand

TINY = ["--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--dtype", "fp16"]
TINY = ["--config", str(Path(__file__).with_name("fast_measure.toml")), *TINY]  # tests/fast_measure.toml: why
_SPEC = {
    "seq": "16..4096",
    "batch": "1,2",
    "head_dim": "16,64",
    "dtype": "fp16,bf16",
    "causal": "both",
    "mode": "fwd,bwd",
    "device": "cpu",
}
_PROVIDERS = ["naive", "sdpa-math", "sdpa-flash", "triton"]


def _cases():
    return expand(load_spec(preset="cpu", overrides=_SPEC), _PROVIDERS)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_shards_partition_the_cases_and_never_split_a_shape(count):
    cases = _cases()
    slices = [shard.select(cases, (i, count), case_of=lambda c: c) for i in range(1, count + 1)]
    keys = [c.key for part in slices for c in part]
    assert sorted(keys) == sorted(c.key for c in cases)  # every case exactly once
    owner = {}
    for index, part in enumerate(slices):
        for case in part:
            assert owner.setdefault(case.shape_key, index) == index  # a shape's providers stay together
    # dealt by predicted cost, costliest first to the least loaded slice: the slices' predicted work differs by
    # no more than the costliest shape
    shape_cost: dict[str, float] = {}
    for case in cases:
        shape_cost[case.shape_key] = shape_cost.get(case.shape_key, 0.0) + shard.case_cost_s(case)
    loads = [sum(shape_cost[k] for k in {c.shape_key for c in part}) for part in slices]
    assert max(loads) - min(loads) <= max(shape_cost.values()) + 1e-9
    for part in slices:  # each slice keeps the plan's order
        order = [cases.index(c) for c in part]
        assert order == sorted(order)


def test_partition_is_the_same_in_another_process_with_another_hash_seed():
    here = {i: [c.key for c in shard.select(_cases(), (i, 3), case_of=lambda c: c)] for i in (1, 2, 3)}
    script = (
        "import json, sys; sys.path.insert(0, 'tests'); import test_shard as t; from flashbench.engine import shard; "
        "print(json.dumps({i: [c.key for c in shard.select(t._cases(), (i, 3), case_of=lambda c: c)] "
        "for i in (1, 2, 3)}))"
    )
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True, timeout=120
        )
        there = {int(k): v for k, v in json.loads(out.stdout).items()}
        assert there == here


def test_sweep_id_names_the_sweep_not_the_shard():
    spec = load_spec(preset="cpu", overrides=_SPEC)
    other = load_spec(preset="cpu", overrides={**_SPEC, "seq": "16..2048"})
    a = shard.sweep_id(spec.to_dict(), _PROVIDERS, "0.1.0")
    assert a == shard.sweep_id(spec.to_dict(), list(_PROVIDERS), "0.1.0")
    assert a != shard.sweep_id(other.to_dict(), _PROVIDERS, "0.1.0")
    assert a != shard.sweep_id(spec.to_dict(), _PROVIDERS[:2], "0.1.0")
    assert a != shard.sweep_id(spec.to_dict(), _PROVIDERS, "0.2.0")


@pytest.mark.parametrize("value", ["0/2", "3/2", "a/b", "1/0", "2", "1/2/3", "-1/2"])
def test_bad_shard_is_one_line_and_exit_2(value, capsys, tmp_path):
    code = main(["sweep", *TINY, "--seq", "16", "--out", str(tmp_path / "r"), "--shard", value])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("flashbench: error: --shard") and "1-based" in err[0]


def test_shard_run_records_its_slice_and_the_sweep_id(tmp_path, capsys):
    args = ["sweep", *TINY, "--providers", "naive,sdpa-math", "--seq", "16,32", "--mode", "fwd"]
    assert main([*args, "--causal", "false", "--shard", "2/2", "--out", str(tmp_path / "s2")]) == 0
    env = read_env(tmp_path / "s2")
    rows = read_rows(tmp_path / "s2")
    assert env.shard == "2/2" and len(env.sweep_id) == 16
    assert env.sweep_planned_cases == 4 and env.planned_cases == 2 == len(rows)
    # the costlier shape (N = 32) is dealt first, to shard 1; shard 2 holds N = 16 with both its providers
    assert {r.seq_k for r in rows} == {16} and {r.provider for r in rows} == {"naive", "sdpa-math"}


def _case(n: int, mode: str = "fwd", provider: str = "triton") -> Case:
    return Case(provider, max(1, 16384 // n), 16, 16, n, n, 128, "bf16", True, mode)


def test_a_case_costs_its_fixed_budgets_plus_its_calls_at_the_roofs():
    """With the check off, a short call costs the sweep's fixed budgets (warm-up, samples, host loops, the energy
    phase); a long one adds min_samples calls at its roofline time; the sweep's own settings are the ones priced."""
    spec = load_spec(preset="speed")
    unchecked = {**spec.to_dict(), "ref_flops_limit": 1.0}  # one slice costs more: the check is skipped
    fixed = (
        spec.warmup_ms / 1e3
        + spec.rep_ms / 1e3
        + spec.host_loops * spec.host_loop_ms / 1e3
        + timing.ENERGY_MS / 1e3
    )
    short = shard.case_cost_s(_case(256), unchecked)
    assert fixed < short < fixed * 1.01
    slow = Case("triton", 8, 64, 64, 32768, 32768, 128, "bf16", False, "fwd+bwd")  # ~1 s a call at the roofs
    assert shard.case_cost_s(slow, unchecked) > spec.min_samples * 0.5
    assert shard.case_cost_s(_case(256), {**unchecked, "rep_ms": 5000.0}) == pytest.approx(
        short + 5 - spec.rep_ms / 1e3
    )


def test_the_check_costs_its_blocks_of_rows_so_many_short_sequences_check_longest():
    """The float64 check is host-bound: priced per block of query rows, not per FLOP. The same 16k tokens as 16
    sequences of 1024 (512 slices of one block) check longer than as one of 16384 (32 slices of 8 blocks)."""
    spec = load_spec(preset="speed").to_dict()
    unchecked = {**spec, "ref_flops_limit": 1.0}
    short = Case("triton", 16, 32, 32, 1024, 1024, 64, "bf16", False, "fwd+bwd")
    long = Case("triton", 1, 32, 32, 16384, 16384, 64, "bf16", False, "fwd+bwd")

    def check_s(case: Case) -> float:
        return shard.case_cost_s(case, spec) - shard.case_cost_s(case, unchecked)

    assert check_s(short) == pytest.approx(16 * 32 * 1 * shard.REF_BLOCK_S[True])
    assert check_s(long) == pytest.approx(32 * 8 * shard.REF_BLOCK_S[True])
    forward = Case("triton", 16, 32, 32, 1024, 1024, 64, "bf16", False, "fwd")
    assert check_s(forward) == pytest.approx(16 * 32 * shard.REF_BLOCK_S[False])
    # a limit that admits 10 of the 512 slices checks those only
    per_slice = correctness.slice_flops(short, grads=True)
    assert shard.case_cost_s(short, {**spec, "ref_flops_limit": 10.5 * per_slice}) - shard.case_cost_s(
        short, unchecked
    ) == pytest.approx(10 * shard.REF_BLOCK_S[True])


def test_samples_are_priced_at_their_bound():
    """The samples go on until the SM clock holds, at most rep_max_ms or max_samples calls: a call of a few ms
    is priced rep_max_ms of samples, a call too short for max_samples of them to fill rep_ms is priced rep_ms."""
    spec = load_spec(preset="speed").to_dict()
    mid = Case("triton", 1, 32, 32, 16384, 16384, 128, "bf16", False, "fwd+bwd")  # ~8 ms a call at the roofs
    longer = {**spec, "rep_max_ms": spec["rep_max_ms"] + 1000.0}
    assert shard.case_cost_s(mid, longer) == pytest.approx(shard.case_cost_s(mid, spec) + 1.0)
    tiny = _case(256)  # ~0.02 ms: 1000 samples take less than rep_ms
    assert shard.case_cost_s(tiny, longer) == shard.case_cost_s(tiny, spec)


def test_a_costly_shape_gets_a_slice_of_its_own_and_the_rest_share_the_others():
    """One shape that costs more than all the others together goes alone to slice 1 (round robin gave it a
    quarter of the rest besides); each slice keeps all providers of its shapes."""
    big = Case("triton", 8, 64, 64, 32768, 32768, 128, "bf16", False, "fwd+bwd")
    cases = [
        big,
        *(_case(n, provider=p) for n in (256, 512, 1024, 2048, 4096, 8192) for p in ("triton", "sdpa")),
    ]
    slices = [shard.select(cases, (i, 4), case_of=lambda c: c) for i in range(1, 5)]
    assert slices[0] == [big]
    assert sorted(len(s) for s in slices[1:]) == [4, 4, 4]
