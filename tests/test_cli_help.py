"""``--help`` says what each option does and what it defaults to; ``ecal import`` and ``ecal
export`` take each kind's options on that kind's own sub-command."""
from __future__ import annotations

import argparse
import json

import pytest

from ecal.cli import build_parser, main


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("ecal",)):
    """Every (command path, action) of ``parser`` and its sub-commands, help actions left out."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _options(sub, (*path, name))
        elif a.option_strings and not isinstance(a, argparse._HelpAction):
            yield " ".join(path), a


OPTIONS = list(_options(build_parser()))


def test_the_walk_sees_the_whole_parser():
    # a walk that found nothing would pass every test below
    commands = {c for c, _ in OPTIONS}
    assert {"ecal characterize", "ecal plan", "ecal import zeus-plo", "ecal export zeus-pfo",
            "ecal store list"} <= commands and len(OPTIONS) > 100


@pytest.mark.parametrize("command,action", OPTIONS, ids=[f"{c} {a.option_strings[-1]}"
                                                          for c, a in OPTIONS])
def test_every_option_has_help_and_states_its_default(command, action):
    assert action.help, f"{command} {action.option_strings}: no help"
    if action.default not in (None, False, argparse.SUPPRESS) and action.help != argparse.SUPPRESS:
        assert "default" in action.help.lower(), (
            f"{command} {'/'.join(action.option_strings)}: default {action.default!r} not stated")


def test_each_import_kind_has_its_own_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["import", "zeus-plo", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ecal import zeus-plo") and "--steps" in out and "--n-gpus" in out
    with pytest.raises(SystemExit):
        main(["import", "perseus", "--help"])
    out = capsys.readouterr().out
    assert "--idle-power-w" in out and "--steps" not in out


def test_export_target_help_is_the_targets(capsys):
    with pytest.raises(SystemExit) as e:
        main(["export", "zeus-pfo", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ecal export zeus-pfo") and "PointSolution" in out


def test_import_options_reach_the_reader(tmp_path, capsys):
    csv = tmp_path / "profile.csv"
    csv.write_text("stage,instruction,frequency,time,energy\n0,forward,1980,0.01,3.0\n"
                   "0,forward,1500,0.012,2.5\n")
    out = tmp_path / "p.json"
    assert main(["import", "perseus", str(csv), "--idle-power-w", "60", "-o", str(out)]) == 0
    sigs = json.loads(out.read_text())["signatures"]
    assert sorted(sigs) == ["stage0/forward@1500MHz", "stage0/forward@1980MHz"]
    assert {s["s_w"] for s in sigs.values()} == {60.0}

    plo = tmp_path / "plo.json"
    plo.write_text(json.dumps({"measurements": [{"power_limit": 300, "energy": 100.0, "time": 2.0}]}))
    out2 = tmp_path / "b.json"
    assert main(["import", "zeus-plo", str(plo), "--name", "train", "--steps", "10",
                 "--n-gpus", "2", "-o", str(out2)]) == 0
    (key, sig), = json.loads(out2.read_text())["signatures"].items()
    assert key == "train@300W" and sig["time_s"] == pytest.approx(0.2)
    assert sig["energy_j"] == pytest.approx(10.0) and sig["devices"] == ["gpu0", "gpu1"]


@pytest.mark.parametrize("argv,needle", [
    (["zeus-plo", "{plo}", "--n-gpus", "0"], "--n-gpus 0"),
    (["zeus-plo", "{plo}", "--steps", "-3"], "--steps -3"),
    (["nv-dvfs", "{plo}", "--static-power-w", "nan"], "--static-power-w"),
    (["perseus", "{plo}", "--idle-power-w", "-1"], "--idle-power-w -1"),
])
def test_bad_import_options_are_one_line_and_write_nothing(tmp_path, capsys, argv, needle):
    plo = tmp_path / "plo.json"
    plo.write_text(json.dumps({"measurements": [{"power_limit": 300, "energy": 1.0, "time": 1.0}]}))
    out = tmp_path / "o.json"
    argv = ["import", *(a.format(plo=plo) for a in argv), "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert not out.exists()


def test_an_option_of_another_kind_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["import", "perseus", "x.csv", "--steps", "3", "-o", str(tmp_path / "o.json")])
    assert e.value.code == 2 and "--steps" in capsys.readouterr().err
