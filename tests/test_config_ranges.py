"""Range parsing, presets and flag overrides -> SweepSpec; every bad value is a one-line FlashbenchError."""

from __future__ import annotations

import pytest

from flashbench.errors import FlashbenchError
from flashbench.spec.config import SweepSpec, load_spec, preset_names
from flashbench.spec.parse import parse_causal, parse_decode_shape, parse_dtypes, parse_modes, parse_range


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512..32768", [512, 1024, 2048, 4096, 8192, 16384, 32768]),
        ("1024..8192:1024", [1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192]),
        ("1000,3000", [1000, 3000]),
        ("64,128..512", [64, 128, 256, 512]),
        ("128", [128]),
        (" 3000 , 1000 ,1000", [1000, 3000]),
        ("100..1000", [100, 200, 400, 800]),  # doubling from the first value, never past the last
        ("16..16", [16]),
        (256, [256]),
        ([64, "128"], [64, 128]),
    ],
)
def test_parse_range_expands_powers_steps_and_lists(text, expected):
    assert parse_range(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "must be a positive number"),
        ("-4", "must be a positive number"),
        ("4096..512", "is reversed"),
        ("abc", "not a whole number"),
        ("1.5", "not a whole number"),
        ("512..", "not a whole number"),
        ("1024..8192:0", "must be a positive number"),
        ("", "empty value"),
        ("64,,128", "empty item"),
        ("1..100000000:1", "more than"),
    ],
)
def test_parse_range_rejects_bad_input_with_one_line(text, message):
    with pytest.raises(FlashbenchError, match=message) as err:
        parse_range(text, "seq")
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("seq")


def test_choice_lists_accept_aliases_and_suggest_close_matches():
    assert parse_dtypes("bf16,float16,fp32") == ["bf16", "fp16", "fp32"]
    assert parse_dtypes("fp8,e4m3") == ["fp8"]  # float8_e4m3fn; duplicates collapse
    assert parse_modes("fwd,fwd+bwd") == ["fwd", "fwd+bwd"]
    assert parse_causal("both") == [False, True]
    assert parse_causal(True) == [True]
    with pytest.raises(FlashbenchError, match="unknown dtype 'fp4'"):
        parse_dtypes("fp4")
    with pytest.raises(FlashbenchError, match="did you mean 'bwd'"):
        parse_modes("bwdd")
    with pytest.raises(FlashbenchError, match="true, false or both"):
        parse_causal("maybe")


def test_every_shipped_preset_loads():
    names = preset_names()
    assert {"default", "quick", "long-context", "ci", "cpu", "recompute"} <= set(names)
    for name in names:
        spec = load_spec(preset=name)
        assert spec.name == name and spec.seq and spec.providers


def test_default_preset_matches_the_issue():
    spec = load_spec(preset="default")
    assert spec.dtype == ("bf16",) and spec.head_dim == (64, 128)
    assert spec.causal == (False, True) and spec.mode == ("fwd", "fwd+bwd")
    assert spec.seq == (512, 1024, 2048, 4096, 8192, 16384) and spec.tokens == 16384
    assert spec.providers == ("all",)


def test_flags_override_the_preset_and_batch_replaces_tokens():
    spec = load_spec(
        preset="default", overrides={"seq": "1024", "batch": "2,4", "dtype": "fp16", "tokens": None}
    )
    assert spec.seq == (1024,) and spec.batch == (2, 4) and spec.tokens is None and spec.dtype == ("fp16",)
    spec = load_spec(preset="long-context", overrides={"tokens": 65536})
    assert spec.tokens == 65536 and spec.batch is None


def test_config_file_and_its_errors(tmp_path):
    good = tmp_path / "mine.toml"
    good.write_text('[sweep]\nseq = "64..256"\nbatch = 2\nkv-heads = 4\nheads = 8\n[measure]\nrep_ms = 5\n')
    spec = load_spec(config=good)
    assert spec.name == "mine" and spec.seq == (64, 128, 256) and spec.kv_heads == (4,) and spec.rep_ms == 5
    bad = tmp_path / "bad.toml"
    bad.write_text('[sweep]\nseqs = "64"\n')
    with pytest.raises(FlashbenchError, match="unknown key 'seqs'; did you mean 'seq'"):
        load_spec(config=bad)
    with pytest.raises(FlashbenchError, match="not found"):
        load_spec(config=tmp_path / "missing.toml")
    with pytest.raises(FlashbenchError, match="unknown preset 'quik'; did you mean 'quick'"):
        load_spec(preset="quik")


def test_inconsistent_specs_are_refused():
    with pytest.raises(FlashbenchError, match="multiple of kv-heads"):
        load_spec(overrides={"heads": 8, "kv_heads": 3})
    with pytest.raises(FlashbenchError, match="either batch or tokens"):
        load_spec(overrides={"batch": 2, "tokens": 1024})
    with pytest.raises(FlashbenchError, match="cuda-graph"):
        load_spec(overrides={"device": "cpu", "cuda_graph": True})


def test_spec_round_trips_through_a_dict():
    spec = load_spec(preset="ci")
    assert SweepSpec.from_dict(spec.to_dict()) == spec


def test_a_decode_probe_shape_is_four_or_five_numbers():
    """benchmarks/decode_speed.py's and tools/decode_timeline.py's --shape B,H,HKV,N[,PAGE]."""
    assert parse_decode_shape("16,32,8,8192") == (16, 32, 8, 8192, None)
    assert parse_decode_shape("4, 32, 8, 32_768, 16") == (4, 32, 8, 32768, 16)
    for text, words in (
        ("16,32,8", "has 3 fields, not 4 or 5"),
        ("16,32,8,8k", "'8k' is not a whole number"),
        ("1,32,0,8192", "0 must be a positive number"),
        ("1,32,5,8192", "5 KV heads do not divide 32 query heads"),
    ):
        with pytest.raises(FlashbenchError, match=words) as err:
            parse_decode_shape(text)
        assert "\n" not in str(err.value) and err.value.exit_code == 2


def test_the_timeline_probe_refuses_a_bad_shape_in_one_line_before_touching_the_gpu(capsys):
    from scripts_helpers import load_script

    tool = load_script("tools/decode_timeline.py")
    assert tool.main(["--shape", "16,32,8,8192", "--shape", "16,32,8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "decode_timeline: decode shape B,H,HKV,N[,PAGE]: '16,32,8' has 3 fields, not 4 or 5"
    assert not tool.COPY.exists()
