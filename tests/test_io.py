"""File formats: signature files, workbooks, atomic writes, error messages (frontier.io)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from frontier import FormatError, Signature, par, seq
from frontier.files import read_json, write_json_atomic
from frontier.io import load_signatures, save_signatures, signature_from_dict
from frontier.workbook import Workbook, load_workbook, parse_workbook

EXAMPLES = Path(__file__).resolve().parents[1] / "ecal" / "examples"
HEAD = {"schema_version": 1, "units": {"time": "s", "energy": "J", "power": "W"}}


def wb(sigs, comps, **extra):
    return parse_workbook({**HEAD, "signatures": sigs, "compositions": comps, **extra}, "wb.json")


SIGS = {"a": {"s_w": 100.0, "time_s": 1.0, "energy_j": 150.0, "sd_time_s": 0.01, "sd_energy_j": 2.0},
        "b": {"s_w": 100.0, "time_s": 2.0, "d_j": 30.0, "sd_time_s": 0.02, "sd_energy_j": 3.0}}


# -- JSON files ---------------------------------------------------------------------------------------

def test_write_json_atomic_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "out.json"
    write_json_atomic(p, {"x": 1})
    write_json_atomic(p, {"x": 2, "inf": float("inf"), "set": {"b", "a"}})
    assert read_json(p) == {"x": 2, "inf": None, "set": ["a", "b"]}
    assert sorted(os.listdir(p.parent)) == ["out.json"]


def test_write_json_atomic_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "out.json"
    write_json_atomic(p, {"x": 1})
    with pytest.raises(TypeError):
        write_json_atomic(p, {"x": object()})
    assert read_json(p) == {"x": 1}
    assert os.listdir(tmp_path) == ["out.json"]


def test_invalid_json_names_line_and_column(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{\n  "schema_version": 1,\n  "signatures": {,}\n}\n')
    with pytest.raises(FormatError) as ei:
        read_json(p)
    assert str(ei.value).startswith(f"{p}: line 3 column")
    with pytest.raises(FormatError, match="cannot read"):
        read_json(tmp_path / "missing.json")


# -- signatures ---------------------------------------------------------------------------------------

def test_signature_round_trip_keeps_identity(tmp_path):
    a = Signature("gemm", s_w=123.0, time_s=1.6e-3, d_j=0.98, var_time_s2=1e-12, var_energy_j2=1e-4,
                  n=5, devices={"gpu1"}, kappa="cuBLAS", meta={"protocol": "tick"})
    c = seq(a, a, name="two")
    save_signatures(tmp_path / "s.json", [a, c])
    doc = read_json(tmp_path / "s.json")
    assert doc["format"] == "ecal.signatures/1" and doc["units"]["energy"] == "J"
    back = load_signatures(tmp_path / "s.json")
    assert back["gemm"] == a and back["gemm"].key == a.key
    assert back["gemm"].devices == {"gpu1"} and back["gemm"].kappa == "cuBLAS"
    # A composite keeps its shared-leaf structure: seq(a, two) has 3 uses of one leaf.
    assert back["two"].composed and back["two"].sd_energy_j == pytest.approx(c.sd_energy_j)
    assert seq(back["gemm"], back["two"]).sd_energy_j == pytest.approx(3 * a.sd_energy_j)


def test_signature_from_runs_and_alternative_sd_fields():
    s = signature_from_dict({"s_w": 10.0, "runs": {"times_s": [1.0, 1.2], "energies_j": [20.0, 22.0]}},
                            "f.json", "signatures.x", name="x")
    assert s.n == 2 and s.time_s == pytest.approx(1.1) and s.meta["source"] == "measured"
    r = signature_from_dict({"s_w": 0.0, "time_s": 1.0, "energy_j": 5.0, "run_sd_energy_j": 2.0, "n": 4},
                            name="r")
    assert r.sd_energy_j == pytest.approx(1.0)          # per-run 2.0 / sqrt(4)
    v = signature_from_dict({"s_w": 0.0, "time_s": 1.0, "d_j": 5.0, "var_energy_j2": 0.25}, name="v")
    assert v.sd_energy_j == pytest.approx(0.5)


@pytest.mark.parametrize("body, path, problem", [
    ({"s_w": 1.0, "time_s": "abc", "energy_j": 1.0}, "signatures.gemm.time_s",
     'must be a non-negative number, got "abc"'),
    ({"s_w": -1.0, "time_s": 1.0, "energy_j": 1.0}, "signatures.gemm.s_w", "non-negative"),
    ({"s_w": 1.0, "time_s": 1.0}, "signatures.gemm.energy_j", "missing"),
    ({"time_s": 1.0, "energy_j": 1.0}, "signatures.gemm.s_w", "missing"),
    ({"s_w": 1.0, "time_s": 1.0, "energy_j": 5.0, "colour": "red"}, "signatures.gemm.colour", "unknown field"),
    ({"s_w": 1.0, "time_s": 1.0, "energy_j": 5.0, "run_sd_time_s": 1, "var_time_s2": 1}, "signatures.gemm",
     "only one"),
    ({"s_w": 100.0, "time_s": 1.0, "energy_j": 5.0}, "signatures.gemm", "negative beyond noise"),
    ({"s_w": 1.0, "runs": {"times_s": [1.0], "energies_j": [1.0, 2.0]}}, "signatures.gemm.runs", "1 runs"),
    ({"s_w": 1.0, "time_s": 1.0, "energy_j": 5.0, "omega": {"warp": 3}}, "signatures.gemm.omega", "unknown"),
])
def test_signature_errors_name_file_path_and_problem(body, path, problem):
    with pytest.raises(FormatError) as ei:
        wb({"gemm": body}, [])
    msg = str(ei.value)
    assert msg.startswith("wb.json: ") and path in msg and problem in msg, msg


def test_header_checks(tmp_path):
    with pytest.raises(FormatError, match="format: missing"):
        parse_workbook({"signatures": {}}, "x.json")
    with pytest.raises(FormatError, match="unsupported version 2"):
        parse_workbook({"schema_version": 2}, "x.json")
    with pytest.raises(FormatError, match="units.time"):
        parse_workbook({"schema_version": 1, "units": {"time": "ms"}}, "x.json")


# -- workbooks ----------------------------------------------------------------------------------------

def test_workbook_expressions():
    w = wb(SIGS, [
        {"name": "s", "expr": {"seq": ["a", "b"]}},
        {"name": "p", "expr": {"par": ["a", "b"], "offsets_s": [0.5, 0.0]}},
        {"name": "r", "expr": {"repeat": "a", "times": 3}},
        {"name": "moved", "expr": {"on": "gpu1", "expr": "s"}},
        {"name": "m", "expr": {"par_multi": ["s", "moved"]}},
        {"name": "i", "expr": {"seq": ["a", {"idle": {"device": "gpu0", "duration_s": 0.5, "s_w": 40}}]}},
        {"name": "i1", "expr": {"on": "gpu1", "expr": "i"}},
        {"name": "g", "expr": {"dag": {"tasks": {"x": "a", "y": {"on": "gpu1", "expr": "b"}},
                                        "deps": [["x", "y"]]}}},
    ])
    a, b = w.signatures["a"], w.signatures["b"]
    assert isinstance(w, Workbook) and len(w.entries) == 8
    assert w["i1"].predicted.devices == {"gpu1"}
    assert w["s"].predicted.energy_j == pytest.approx(seq(a, b).energy_j)
    assert w["p"].predicted.time_s == pytest.approx(2.0) and w["p"].predicted.energy_j == pytest.approx(
        par(a, b, offsets_s=[0.5, 0.0]).energy_j)
    assert w["r"].predicted.sd_energy_j == pytest.approx(3 * a.sd_energy_j)
    assert w["moved"].predicted.devices == {"gpu1"}
    # The moved copy shares its leaves' error with the original: σ doubles, not √2.
    assert w["m"].predicted.sd_energy_j > 1.9 * w["s"].predicted.sd_energy_j
    assert w["i"].predicted.energy_j == pytest.approx(a.energy_j + 20.0)
    assert w["g"].predicted.time_s == pytest.approx(3.0)
    assert w["g"].predicted.devices == {"gpu0", "gpu1"}
    lines = w.summary_lines()
    assert len(lines) == 8 and lines[0].startswith("s: T = ") and "bias bound" in lines[0]
    json.dumps(w.to_dict(bias_aware=True), allow_nan=False)


@pytest.mark.parametrize("expr, path, problem", [
    ({"seq": ["a", {"par": ["b", "nope"]}]}, "compositions[0].expr.seq[1].par[1]", "unknown element 'nope'"),
    ({"mul": ["a"]}, "compositions[0].expr", "exactly one operator"),
    ({"seq": []}, "compositions[0].expr.seq", "non-empty list"),
    ({"repeat": "a"}, "compositions[0].expr.times", "missing"),
    ({"repeat": "a", "times": 0}, "compositions[0].expr.times", "integer >= 1"),
    ({"seq": ["a"], "offsets_s": [1]}, "compositions[0].expr.offsets_s", "unknown field"),
    ({"par_multi": ["a", "b"]}, "compositions[0].expr", "disjoint devices"),
    ({"dag": {"tasks": {"x": "a"}, "deps": [["x", "q"]]}}, "compositions[0].expr", "unknown task 'q'"),
])
def test_expression_errors_name_the_path(expr, path, problem):
    with pytest.raises(FormatError) as ei:
        wb(SIGS, [{"name": "c", "expr": expr}])
    msg = str(ei.value)
    assert f"wb.json: {path}: " in msg and problem in msg, msg


def test_composition_name_clash_and_missing_expr():
    with pytest.raises(FormatError, match=r"compositions\[0\].name: 'a' is already"):
        wb(SIGS, [{"name": "a", "expr": "b"}])
    with pytest.raises(FormatError, match=r"compositions\[0\].expr: missing"):
        wb(SIGS, [{"name": "c"}])


def test_measured_values_and_runs_and_check():
    w = wb(SIGS, [
        {"name": "s", "expr": {"seq": ["a", "b"]},
         "measured": {"time_s": 3.0, "energy_j": 380.0, "sd_time_s": 0.01, "sd_energy_j": 2.0, "n": 5}},
        {"name": "t", "expr": {"seq": ["a", "b"]},
         "measured": {"runs": {"times_s": [3.0, 3.02, 2.98], "energies_j": [400.0, 402.0, 398.0]}}},
        {"name": "u", "expr": "a"},
    ])
    assert w["s"].measured.energy_j == pytest.approx(380.0) and w["s"].measured.n == 5
    assert w["t"].measured.n == 3
    results = w.check()
    assert [r.name for r in results] == ["s", "t"]
    # predicted: 150 J + (200 + 30) J = 380 J over 3 s
    assert not results[0].flagged and results[1].flagged_energy and not results[1].flagged_time
    assert w["u"].deviation() is None


def test_measured_errors():
    with pytest.raises(FormatError, match=r"compositions\[0\].measured.energy_j: missing"):
        wb(SIGS, [{"name": "s", "expr": "a", "measured": {"time_s": 1.0}}])
    with pytest.raises(FormatError, match=r"measured.runs.times_s\[1\]: must be a non-negative number"):
        wb(SIGS, [{"name": "s", "expr": "a", "measured": {"runs": {"times_s": [1, "x"], "energies_j": [1, 2]}}}])


def test_defaults_are_merged_under_signatures():
    w = wb({"a": {"time_s": 1.0, "d_j": 1.0}, "b": {"time_s": 1.0, "d_j": 1.0, "devices": ["gpu7"]}}, [],
           defaults={"s_w": 50.0, "devices": ["gpu3"]})
    assert w.signatures["a"].s_w == 50.0 and w.signatures["a"].devices == {"gpu3"}
    assert w.signatures["b"].devices == {"gpu7"}


# -- bundled examples ---------------------------------------------------------------------------------

def test_bundled_examples_load():
    att = load_workbook(EXAMPLES / "attention_tp2.json")
    assert att["layer_tp2"].predicted.devices == {"gpu0", "gpu1"}
    assert all(e.measured is None for e in att.entries)
    h = load_workbook(EXAMPLES / "h200_compositions.json")
    assert [e.name for e in h.entries] == ["par_gemm8192_copy", "par_gemm8192_axpy_sm4",
                                           "seq_gemm8192_copy", "seq_gemm8192_axpy_sm4"]
    flags = {r.name: (r.flagged_time, r.flagged_energy) for r in h.check()}
    assert flags == {"par_gemm8192_copy": (True, True), "par_gemm8192_axpy_sm4": (True, True),
                     "seq_gemm8192_copy": (True, False), "seq_gemm8192_axpy_sm4": (True, True)}


def test_atomic_write_gives_usual_permissions(tmp_path):
    from frontier.files import file_mode

    p = write_json_atomic(tmp_path / "m.json", {})
    assert p.stat().st_mode & 0o777 == file_mode()


def test_save_signatures_extra_blocks_are_kept_and_never_replace_the_files_own(tmp_path):
    from frontier.io import load_signatures, save_signatures

    s = Signature("g", s_w=100.0, time_s=2.0, d_j=50.0)
    p = save_signatures(tmp_path / "x.json", [s], extra={"store": {"format": "f", "keys": {}}})
    doc = json.loads(Path(p).read_text())
    assert doc["store"] == {"format": "f", "keys": {}}
    assert load_signatures(p)["g"].energy_j == s.energy_j
    with pytest.raises(ValueError, match="signatures"):
        save_signatures(tmp_path / "y.json", [s], extra={"signatures": {}})
    assert not (tmp_path / "y.json").exists()


def test_a_duplicate_json_key_is_refused(tmp_path):
    from frontier.files import read_json

    f = tmp_path / "dup.json"
    f.write_text('{"schema_version": 1, "signatures": {}, "signatures": {"a": 1}}')
    with pytest.raises(FormatError, match="signatures: given twice"):
        read_json(f)
