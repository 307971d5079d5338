"""One declaration per file format (issue 28): ``ecal schema``, the registry, and the docs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ecal.cli import main
from frontier.errors import FormatError
from frontier.formats import KINDS, check_format, json_schema

ROOT = Path(__file__).resolve().parents[1]


def test_schema_lists_every_format(capsys):
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    for k in KINDS.values():
        assert k.tag in out


@pytest.mark.parametrize("kind", [k.name for k in KINDS.values() if k.model])
def test_each_declared_model_gives_a_json_schema(kind, capsys):
    assert main(["schema", kind]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == json_schema(kind) and schema.get("type") == "object"


def test_an_unknown_kind_is_one_line_and_exit_2(capsys):
    assert main(["schema", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no file format 'nope'" in err[0] and "signatures" in err[0]


def test_docs_list_every_format():
    doc = (ROOT / "docs" / "formats.md").read_text()
    for k in KINDS.values():
        assert f"`{k.tag}`" in doc


def test_older_forms_are_read_and_a_wrong_kind_is_named():
    assert check_format("f", {"format": "ecal.baselines/1"}, "baselines") == 1
    assert check_format("f", {"format": "energy-calculus/baselines", "version": 1},
                        "baselines") == 1
    with pytest.raises(FormatError, match="signatures"):
        check_format("f", {"format": "ecal.signatures/1"}, "plan")
