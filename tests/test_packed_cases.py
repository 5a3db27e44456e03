"""Packed training batches in the sweep: `--seqlens random|lognormal` on the training shape packs documents into
the batch's tokens (spec/cases.py), the providers run them, the oracle checks every document, the models count
each document's own pairs, and the report keeps them apart from uniform batches."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from tiers import interpreter_sweep

from flashbench.cli.app import main
from flashbench.engine import correctness, packed
from flashbench.models import io_model, memory
from flashbench.models.flops import case_flops
from flashbench.providers import packed as packed_providers
from flashbench.providers.registry import Unsupported
from flashbench.results.rows import read_rows
from flashbench.spec.cases import Case, documents, kv_lengths
from flashbench.spec.config import load_spec
from flashbench.spec.plan import expand
from flashbench.spec.window import document_visible, visible

MEASURE = ["--config", str(Path(__file__).with_name("fast_measure.toml"))]  # tests/fast_measure.toml: why
TINY = ["--device", "cpu", "--batch", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", *MEASURE]


def _packed(**kw) -> Case:
    base = dict(
        provider="triton", batch=2, heads=4, kv_heads=2, seq_q=64, seq_k=64, head_dim=32, dtype="fp16"
    )
    base.update(causal=True, mode="fwd", seqlens="random", min_seq=8)
    base.update(kw)
    return Case(**base)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("law", ["random", "lognormal"])
def test_documents_fill_the_tokens_within_their_range_and_repeat_exactly(law):
    lengths = documents(16384, 256, 4096, law, seed=3)
    assert sum(lengths) == 16384 and len(lengths) > 1
    assert all(256 <= n <= 4096 for n in lengths[:-1]) and 1 <= lengths[-1] <= 4096  # the last one is cut
    assert documents(16384, 256, 4096, law, seed=3) == lengths
    assert documents(16384, 256, 4096, law, seed=4) != lengths


def test_lognormal_documents_are_mostly_short():
    lengths = documents(1 << 22, 256, 4096, "lognormal")
    median = sorted(lengths)[len(lengths) // 2]
    assert 800 < median < 1300  # the range's geometric mean, 1024, against random's 2176
    assert max(lengths) > 3000


def test_the_decode_draw_is_unchanged_and_takes_lognormal_too():
    import random

    rng = random.Random("flashbench-seqlens|2|4|1|100")
    assert kv_lengths(4, 1, 100, "random", 2) == tuple(rng.randint(50, 100) for _ in range(4))
    assert all(50 <= n <= 100 for n in kv_lengths(64, 1, 100, "lognormal", 2))


def test_packed_key_extends_the_training_key_and_others_are_unchanged():
    uniform = _packed(seqlens="uniform", min_seq=0)
    assert uniform.key == "triton|b2|h4|kv2|q64|k64|d32|fp16|causal|fwd" and not uniform.packed
    case = _packed()
    assert case.key == uniform.key + "|random-s0|min8"
    assert case.packed and not case.ragged and not case.serving
    decode = _packed(seq_q=1, min_seq=0)
    assert decode.ragged and decode.documents() is None and decode.key.endswith("|random-s0")


def test_the_training_shape_packs_documents_and_the_serving_shape_draws_kv_lengths():
    spec = load_spec(overrides={"seq": "1024,4096", "tokens": 16384, "seqlens": "uniform,lognormal"})
    cases = expand(spec, ["triton"])
    assert {(c.seq_k, c.seqlens, c.min_seq) for c in cases} == {
        (1024, "uniform", 0),
        (4096, "uniform", 0),
        (1024, "lognormal", 64),  # default: N // 16
        (4096, "lognormal", 256),
    }
    assert all(sum(c.documents() or ()) == c.batch * c.seq_k for c in cases if c.packed)
    given = expand(load_spec(overrides={"seq": "4096", "seqlens": "random", "min_seq": 512}), ["triton"])
    assert {c.min_seq for c in given} == {512}
    serving = expand(load_spec(overrides={"seq": "4096", "seq_q": "1", "seqlens": "random"}), ["triton"])
    assert all(c.ragged and c.min_seq == 0 for c in serving)


def test_the_varlen_preset_is_the_issue_target():
    cases = expand(load_spec(preset="varlen"), ["triton"])
    packed_cases = [c for c in cases if c.packed]
    assert {c.mode for c in packed_cases} == {"fwd", "fwd+bwd"}
    for case in packed_cases:
        assert (case.dtype, case.head_dim, case.causal, case.min_seq, case.seq_k) == (
            "bf16",
            128,
            True,
            256,
            4096,
        )
        assert sum(case.documents()) == 16384


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seqlens", "lognormal", "--seq", "256", "--min-seq", "512"], "--min-seq 512 is above --seq 256"),
        (["--seqlens", "random", "--seq", "64", "--seq-q", "1", "--min-seq", "8"], "--min-seq is for packed"),
        (["--seqlens", "random", "--seq", "64", "--min-seq", "0"], "min-seq"),
        (["--seqlens", "gamma", "--seq", "64"], "unknown seqlens 'gamma'"),
    ],
)
def test_bad_packing_flags_are_one_line_and_exit_2(args, message, capsys, tmp_path):
    assert main(["sweep", *TINY, "--providers", "naive", *args, "--out", str(tmp_path / "run")]) == 2
    line = _error_line(capsys)
    assert line.startswith("flashbench: error: ") and message in line


def test_flops_count_each_documents_own_pairs():
    for causal in (True, False):
        case = _packed(causal=causal, mode="fwd+bwd")
        pairs = sum(n * (n + 1) // 2 if causal else n * n for n in case.documents())
        assert case_flops(case) == 3.5 * 4 * 4 * 32 * pairs
        assert case_flops(case) < case_flops(
            _packed(causal=causal, mode="fwd+bwd", seqlens="uniform", min_seq=0)
        )


def test_bytes_and_memory_follow_the_packed_layout():
    docs = (40, 10, 14)
    shape = (1, 4, 2, 64, 64, 32, 2)
    tiled = io_model.hbm_traffic("flash", *shape, True, "fwd", l2_reuse=False, documents=docs).total
    per_doc = sum(
        io_model.hbm_traffic("flash", 1, 4, 2, n, n, 32, 2, True, "fwd", l2_reuse=False).total for n in docs
    )
    assert tiled == per_doc
    dense = io_model.hbm_traffic("naive", *shape, False, "fwd", documents=docs).total
    assert dense == io_model.hbm_traffic("naive", 1, 4, 2, 64, 64, 32, 2, True, "fwd").total
    naive = memory.predicted_peak_bytes("naive", *shape, False, "fwd", documents=docs)
    assert naive == memory.predicted_peak_bytes("naive", 1, 4, 2, 64, 64, 32, 2, True, "fwd")
    flash = memory.predicted_peak_bytes("flash", *shape, True, "fwd", documents=docs)
    assert flash == memory.predicted_peak_bytes("flash", 1, 4, 2, 64, 64, 32, 2, True, "fwd")


def test_the_document_mask_is_block_diagonal_and_causal_within_each_document():
    case = _packed(batch=1, seq_q=16, seq_k=16, min_seq=4)
    mask = packed_providers.document_mask(case, "cpu")
    row = 0
    for n in case.documents():
        block = mask[row : row + n, row : row + n]
        rows, cols = torch.arange(n)[:, None], torch.arange(n)[None, :]
        assert torch.equal(block, visible(rows, cols, n, n, True, None))
        assert not mask[row : row + n, :row].any() and not mask[row : row + n, row + n :].any()
        row += n
    doc = torch.tensor([0, 0, 1])
    assert bool(document_visible(doc, 1, 0, False, None)) and not bool(
        document_visible(doc, 2, 1, False, None)
    )


def test_dense_references_refuse_more_tokens_than_their_bound():
    case = _packed(batch=3, seq_q=4096, seq_k=4096, min_seq=256)
    with pytest.raises(Unsupported, match="at most 8192 tokens, not 12288"):
        packed_providers.dense(case, "naive", lambda q, k, v: q)


def test_the_oracle_catches_one_wrong_document():
    case = _packed(dtype="fp32", causal=False)
    lengths = case.documents()
    total = sum(lengths)
    q, k, v = torch.randn(total, 4, 32), torch.randn(total, 2, 32), torch.randn(total, 2, 32)
    out = torch.zeros(total, 4, 32)
    parts = [packed.split(x, lengths) for x in (out, q, k, v)]
    for got, qs, ks, vs in zip(*parts, strict=True):  # the right answer, document by document (views of out)
        got.copy_(correctness.reference(qs, ks, vs, causal=False)["out"])
    inputs = {"q": q, "k": k, "v": v, "do": None}
    good = correctness.check(case, inputs, {"out": out}, "cpu")
    assert good.ok and f"all {len(lengths)} documents" in good.ref
    wrong = out.clone()
    last = total - lengths[-1]
    wrong[last:] = wrong[last:].flip(0)  # the last document's rows swapped
    assert not correctness.check(case, inputs, {"out": wrong}, "cpu").ok


@pytest.fixture(scope="module")
def packed_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "run"
    args = ["sweep", *TINY, "--providers", "triton,naive,sdpa-math", "--dtype", "fp16", "--seq", "64"]
    args += ["--causal", "both", "--mode", "fwd,fwd+bwd", "--seqlens", "uniform,random", "--min-seq", "8"]
    assert main([*args, "--out", str(out)]) == 0
    return out


@interpreter_sweep
def test_packed_rows_are_ok_within_the_budget_and_count_useful_flops(packed_run):
    rows = [r for r in read_rows(packed_run) if r.min_seq]
    assert len(rows) == 3 * 2 * 2
    for row in rows:
        assert row.status == "ok", (row.key, row.reason)
        assert row.rel_err is not None and row.rel_err <= row.err_budget, row.key
        assert f"all {len(row.case.documents())} documents" in row.ref
        assert row.flops == case_flops(row.case)


def test_the_report_keeps_packed_batches_apart_and_says_their_lengths(packed_run):
    from flashbench.analysis.serving import case_variants, serving_mask

    frame = pd.DataFrame([r.__dict__ for r in read_rows(packed_run)])
    variants = case_variants(frame)
    lengths = next(r.case.documents() for r in read_rows(packed_run) if r.min_seq)
    words = f"packed random [8, 64] s0: {len(lengths)} docs, mean {sum(lengths) / len(lengths):.0f}"
    assert set(variants[frame["min_seq"] > 0]) == {words}
    assert set(variants[frame["min_seq"] == 0]) == {""}
    assert not serving_mask(frame).any()
