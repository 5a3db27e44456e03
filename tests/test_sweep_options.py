"""Each sweep option is written once (spec/config.py): `flashbench sweep`'s options, `flashbench.sweep`'s keywords
and the SweepSpec fields agree on names, defaults and help, because the first two are made from the third."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any

import pytest
import typer.main

import flashbench
from flashbench.cli.app import app
from flashbench.errors import FlashbenchError
from flashbench.spec.config import SPEC_OPTIONS, SweepSpec, load_spec
from flashbench.spec.options import RUN_OPTIONS

EVERY = (*SPEC_OPTIONS, *RUN_OPTIONS)


def _cli_params() -> dict[str, Any]:
    command = typer.main.get_command(app).commands["sweep"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_every_spec_field_is_one_option_whose_parser_takes_its_default():
    """Each field (but `extra`, the spec's free-form notes) has an Option; parsing the field's default gives it
    back, so the default and the parser cannot disagree."""
    spec = SweepSpec()
    by_field = {o.field: o for o in SPEC_OPTIONS}
    assert set(by_field) == {f.name for f in fields(SweepSpec)} - {"extra"}
    for name, option in by_field.items():
        assert option.help and option.parse is not None, name
        assert option.parse(getattr(spec, name)) == getattr(spec, name), name


def test_cli_options_are_the_options_with_a_flag_and_their_help():
    params = _cli_params()
    flagged = [o for o in EVERY if o.flag is not None]
    assert set(params) == {o.name for o in flagged} | {"json_out"}
    for option in flagged:
        param = params[option.name]
        assert param.opts[0] == option.flag.split("/")[0], option.name
        assert param.help == option.help and param.default == option.default, option.name
    assert {o.name for o in EVERY if o.flag is None} == {
        "name", "warmup_ms", "warmup_max_ms", "settle_window_ms", "settle_pct", "rep_ms", "rep_max_ms",
        "min_samples", "max_samples", "block_launches", "l2_flush", "host_loops", "host_loop_ms",
        "host_bound_pct", "description", "ref_flops_limit", "progress",
    }  # fmt: skip


def test_library_keywords_are_every_option_with_its_default_and_help():
    parameters = inspect.signature(flashbench.sweep).parameters
    assert list(parameters) == [o.name for o in EVERY]
    doc = inspect.getdoc(flashbench.sweep) or ""
    for option in EVERY:
        assert parameters[option.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert parameters[option.name].default == option.default, option.name
        assert f"{option.name}: {option.help}" in " ".join(doc.split()), option.name


def test_a_renamed_field_is_set_by_either_name_and_an_unknown_keyword_is_refused():
    assert load_spec(overrides={"timeout": 5}).timeout_s == 5.0
    assert load_spec(overrides={"timeout_s": 7}).timeout_s == 7.0
    with pytest.raises(FlashbenchError, match="unknown key 'sequ'; did you mean 'seq'"):
        flashbench.sweep(device="cpu", sequ="64")
    with pytest.raises(FlashbenchError, match="unknown key 'resume'"):
        load_spec(overrides={"resume": True})  # a run option is not part of the spec
