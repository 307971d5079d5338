"""Bad input never hangs, never tracebacks, and is named (issue 18, "Bad input").

* k-fold repeats are closed-form: ``repeat(e, k)`` equals ``seq([e] * k)`` exactly and a
  10^9-fold repeat builds one composite over one leaf (no expansion);
* nothing else in a workbook expands without bound (evaluation and depth limits);
* overflowing numbers, NaN/Infinity literals, a UTF-8 BOM, binary and non-UTF-8 files,
  duplicate CSV rows and NaN/negative CSV values are one-line errors naming the file and the
  field, through the libraries and through the CLI (exit 2, not check's "flagged" 1).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import frontier.workbook as fwb
from ecal.cli import main
from frontier import Signature, par, repeat, seq
from frontier.compose import MAX_REPEAT
from frontier.errors import CompositionError, FormatError
from frontier.files import read_json
from frontier.io import load_signatures
from frontier.workbook import load_workbook, parse_workbook
from measure import replay
from solvers.io import load_problem, problem_from_dict
from solvers.perseus import load_perseus_profile

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_CSV = ROOT / "ecal" / "examples" / "pipeline_4x8.csv"
SHARED = replay.shared_data_dir()
BOM = b"\xef\xbb\xbf"
BILLION = 10**9


def leaf(name: str, s_w: float = 50.0, t: float = 1e-3, d: float = 0.3, var_t: float = 1e-12,
         var_e: float = 1e-6, **kw) -> Signature:
    return Signature(name, s_w=s_w, time_s=t, d_j=d, var_time_s2=var_t, var_energy_j2=var_e, **kw)


def state(x: Signature) -> tuple:
    """Everything a later composition or report reads from a signature (not ``meta``)."""
    return (x.name, x.s_w, x.time_s, x.d_j, x.energy_j, x.var_time_s2, x.var_energy_j2, x.n,
            x.devices, x.omega, x.composed, dict(x.terms), x.extra_var_time_s2,
            x.extra_var_energy_j2, x.bias_sigma_j, x.head_sigma_j, x.all_sigma_j, x.runtime_sigma_j)


def cli(capsys, *args: str) -> tuple[int, list[str]]:
    """Run ``ecal ARGS`` in-process: (exit code, non-empty stderr lines)."""
    rc = main(list(args))
    err = capsys.readouterr().err
    return rc, [ln for ln in err.splitlines() if ln.strip()]


def assert_one_line(rc: int, lines: list[str], *needles: str) -> None:
    assert rc == 2, (rc, lines)
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])


# -- repeat: closed form ------------------------------------------------------------------------

def test_billion_fold_repeat_is_closed_form_without_expansion():
    a = leaf("gemm", var_t=4e-12, var_e=1e-6)
    tracemalloc.start()
    try:
        r = repeat(a, BILLION)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.time_s == BILLION * a.time_s and r.energy_j == pytest.approx(BILLION * a.energy_j)
    assert r.d_j == BILLION * a.d_j and r.s_w == a.s_w
    # one shared measurement: σ grows as k (k²·var), not √k
    assert r.var_time_s2 == pytest.approx(BILLION**2 * a.var_time_s2, rel=1e-12)
    assert r.var_energy_j2 == pytest.approx(BILLION**2 * a.var_energy_j2, rel=1e-12)
    # no expansion: one leaf term, one part recorded, and far less memory than 10^9 references
    assert list(r.terms) == [a.key] and r.terms[a.key].dT_dT == BILLION
    assert r.meta["op"] == "repeat" and r.meta["parts"] == ["gemm"] and r.meta["times"] == BILLION
    assert peak < 5_000_000


def test_repeat_of_composite_with_shared_leaves_scales_every_leaf():
    a, b = leaf("a"), leaf("b", t=2e-3, d=0.1)
    c = seq(a, b, a)
    r = repeat(c, BILLION)
    assert set(r.terms) == {a.key, b.key}
    assert r.terms[a.key].dT_dT == 2 * BILLION and r.terms[b.key].dT_dT == BILLION
    assert r.var_energy_j2 == pytest.approx(BILLION**2 * c.var_energy_j2, rel=1e-12)
    assert r.bias_bound_j() == pytest.approx(
        1.96 * (BILLION * c.bias_sigma_j + (BILLION - 1) * c.head_sigma_j), rel=1e-12)


_ids = iter(range(10**9))


@st.composite
def leaves(draw):
    t = draw(st.floats(1e-5, 5.0))
    var_t = (draw(st.floats(0.0, 0.05)) * t) ** 2
    s = draw(st.sampled_from([0.0, 75.0, 123.0]))
    return leaf(f"l{next(_ids)}", s_w=s, t=t, d=draw(st.floats(0.0, 900.0)), var_t=var_t,
                var_e=s * s * var_t + draw(st.floats(0.0, 1.0)) ** 2)


@st.composite
def elements(draw):
    """A leaf or a composite in which leaves are shared (same measurement used again)."""
    pool = draw(st.lists(leaves(), min_size=1, max_size=3))
    pick = st.sampled_from(pool)
    kind = draw(st.sampled_from(["leaf", "seq", "par", "clark", "nested"]))
    if kind == "leaf":
        return draw(pick)
    parts = draw(st.lists(pick, min_size=2, max_size=5))
    if kind == "seq":
        return seq(parts)
    if kind == "nested":
        return seq(repeat(parts[0], draw(st.integers(1, 4))), par(parts[1], draw(pick)), parts[0])
    return par(parts, max_method="dominant" if kind == "par" else "clark")


@settings(max_examples=80, deadline=None)
@given(elements(), st.integers(1, 12), leaves())
def test_repeat_equals_seq_of_copies(e, k, other):
    r, s = repeat(e, k), seq([e] * k)
    assert state(r) == state(s)
    assert r == s
    # ... so every later composition is the same too
    assert state(seq(r, other)) == state(seq(s, other))
    assert state(par(r, other)) == state(par(s, other))
    assert state(repeat(r, 3)) == state(seq([s] * 3))
    named = repeat(e, k, name="x")
    assert named.name == ("x" if k > 1 else e.name)


@pytest.mark.parametrize("k", [0, -1, True, 2.0, "3", None, MAX_REPEAT + 1])
def test_repeat_count_must_be_a_positive_integer(k):
    with pytest.raises(CompositionError, match="repeat"):
        repeat(leaf("a"), k)


def test_repeat_accepts_numpy_integers_and_k1_is_identity():
    a = leaf("a")
    assert state(repeat(a, np.int64(7))) == state(seq([a] * 7))
    assert repeat(a, 1) is a


# -- workbooks ----------------------------------------------------------------------------------

SIG_A = {"s_w": 50, "time_s": 0.001, "energy_j": 0.2, "sd_time_s": 1e-6, "sd_energy_j": 0.001}


def workbook(compositions, sigs=None) -> dict:
    return {"schema_version": 1, "signatures": sigs or {"a": dict(SIG_A)},
            "compositions": compositions}


def write(path: Path, doc) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_workbook_billion_fold_repeat(tmp_path, capsys):
    f = write(tmp_path / "wb.json", workbook([{"name": "r", "expr": {"repeat": "a", "times": BILLION}}]))
    p = load_workbook(f)["r"].predicted
    a = load_workbook(f).signatures["a"]
    assert p.time_s == pytest.approx(1e6) and p.energy_j == pytest.approx(2e8)
    assert p.sd_energy_j == pytest.approx(BILLION * a.sd_energy_j, rel=1e-12)
    assert p.meta["op"] == "repeat" and len(p.terms) == 1
    rc = main(["compose", str(f), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["compositions"][0]["predicted"]["time_s"] == pytest.approx(1e6)


def test_cli_billion_fold_repeat_subprocess(tmp_path):
    f = write(tmp_path / "wb.json", workbook([
        {"name": "r", "expr": {"repeat": "a", "times": BILLION},
         "measured": {"time_s": 1e6, "energy_j": 2e8, "sd_time_s": 1.0, "sd_energy_j": 1e6}}]))
    r = subprocess.run([sys.executable, "-m", "ecal", "check", str(f), "--json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    pred = json.loads(r.stdout)["compositions"][0]["predicted"]
    assert pred["time_s"] == pytest.approx(1e6) and pred["sd_energy_j"] == pytest.approx(1e6, rel=1e-9)


@pytest.mark.parametrize("times", [0, -1, True, 2.0, "3", None, 10**13, 10**400])
def test_workbook_repeat_count_is_checked(tmp_path, capsys, times):
    doc = json.dumps(workbook([{"name": "r", "expr": {"repeat": "a", "times": 1}}]))
    doc = doc.replace('"times": 1', f'"times": {json.dumps(times) if times != 10**400 else times}')
    f = write(tmp_path / "wb.json", doc)
    with pytest.raises(FormatError) as ei:
        load_workbook(f)
    assert str(ei.value).startswith(f"{f}: compositions[0].expr.times: ")
    assert_one_line(*cli(capsys, "compose", str(f)), "wb.json", "compositions[0].expr.times")


def test_nested_moves_are_evaluated_once_per_target():
    # c_i = (c_{i-1} on gpu1) ⊗ (c_{i-1} on gpu1): 2^40 leaves if expanded, linear here
    comps = [{"name": "c0", "expr": {"seq": ["a", "a"]}}]
    for i in range(1, 41):
        moved = {"on": "gpu1", "expr": f"c{i - 1}"}
        comps.append({"name": f"c{i}", "expr": {"seq": [moved, moved]}})
    w = parse_workbook(workbook(comps), "wb.json")
    top = w["c40"].predicted
    assert top.time_s == pytest.approx(2**41 * 1e-3) and top.devices == {"gpu1"}
    assert len(top.terms) == 1 and len(top.name) < 10


def test_expansion_and_depth_limits(monkeypatch):
    monkeypatch.setattr(fwb, "MAX_EVALUATIONS", 50)
    with pytest.raises(FormatError, match=r"wb.json: compositions\[0\]\.expr\.seq\[\d+\]: .*more than 50"):
        parse_workbook(workbook([{"name": "w", "expr": {"seq": ["a"] * 60}}]), "wb.json")
    monkeypatch.undo()
    deep: object = "a"
    for _ in range(fwb.MAX_EXPR_DEPTH + 5):
        deep = {"seq": [deep]}
    with pytest.raises(FormatError, match="nest deeper than"):
        parse_workbook(workbook([{"name": "d", "expr": deep}]), "wb.json")


def test_json_nested_too_deep_is_named(tmp_path, capsys):
    f = write(tmp_path / "deep.json", "[" * 50_000 + "]" * 50_000)
    with pytest.raises(FormatError, match="deep.json: .*nested"):
        read_json(f)
    assert_one_line(*cli(capsys, "compose", str(f)), "deep.json")


# -- overflow and NaN in JSON -------------------------------------------------------------------

HUGE = "1" + "0" * 400
NUMBER_FAULTS = {
    "int_overflow": (HUGE, "overflows"),
    "float_overflow": ("1e999", "overflows"),
    "nan": ("NaN", "NaN"),
    "inf": ("Infinity", "Infinity"),
    "minus_inf": ("-Infinity", "Infinity"),
    "very_long_int": ("9" * 5000, "overflows"),
}
# Where a bad number lands in a workbook, and the path the error must name.
WORKBOOK_SPOTS = {
    "time_s": ('"time_s": 0.001', '"time_s": {}', "signatures.a.time_s"),
    "n": ('"sd_time_s"', '"n": {}, "sd_time_s"', "signatures.a.n"),
    "measured": ('"energy_j": 0.4}', '"energy_j": {}}', "compositions[0].measured.energy_j"),
    "times": ('"times": 2', '"times": {}', "compositions[0].expr.times"),
}


def measured_workbook() -> str:
    return json.dumps(workbook([{"name": "r", "expr": {"repeat": "a", "times": 2},
                                 "measured": {"time_s": 0.002, "energy_j": 0.4}}]))


@pytest.mark.parametrize("fault", sorted(NUMBER_FAULTS))
@pytest.mark.parametrize("spot", sorted(WORKBOOK_SPOTS))
def test_bad_numbers_in_workbooks(tmp_path, capsys, fault, spot):
    literal, why = NUMBER_FAULTS[fault]
    old, new, field = WORKBOOK_SPOTS[spot]
    text = measured_workbook()
    assert old in text
    f = write(tmp_path / "wb.json", text.replace(old, new.replace("{}", literal), 1))
    with pytest.raises(FormatError) as ei:
        load_workbook(f)
    assert str(ei.value).startswith(f"{f}: {field}: ") and why in str(ei.value)
    for cmd in ("compose", "check"):     # check's exit 1 means "flagged": bad input is 2
        assert_one_line(*cli(capsys, cmd, str(f)), "wb.json", field)


def test_overflow_in_check_subprocess_exits_2(tmp_path):
    f = write(tmp_path / "wb.json", measured_workbook().replace('"time_s": 0.001', f'"time_s": {HUGE}'))
    r = subprocess.run([sys.executable, "-m", "ecal", "check", str(f)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert_one_line(r.returncode, lines, "wb.json", "signatures.a.time_s", "overflows")


def test_overflow_through_the_dict_api_is_named():
    doc = workbook([], {"a": {**SIG_A, "time_s": 10**400}})
    with pytest.raises(FormatError, match=r"x.json: signatures\.a\.time_s: .*overflows"):
        parse_workbook(doc, "x.json")
    for field, v in (("n", 10**400), ("n", float("nan")), ("sd_time_s", 1e200)):
        with pytest.raises(FormatError, match=rf"signatures\.a\.{field}: "):
            parse_workbook(workbook([], {"a": {**SIG_A, field: v}}), "x.json")
    with pytest.raises(FormatError, match=r"signatures\.a\.omega\.sm_clock_mhz: .*overflows"):
        parse_workbook(workbook([], {"a": {**SIG_A, "omega": {"sm_clock_mhz": 10**400}}}), "x.json")


def test_signature_files_bom_binary_nan(tmp_path, capsys):
    good = json.dumps({"schema_version": 1, "signatures": {"a@1980MHz": dict(SIG_A)}})
    f = tmp_path / "sigs.json"
    f.write_bytes(BOM + good.encode())
    assert load_signatures(f)["a@1980MHz"].time_s == 0.001
    rc, lines = cli(capsys, "frontier", str(f))
    assert rc == 0 and not lines
    cases = {"nan": good.replace("0.001", "NaN", 1).encode(), "huge": good.replace("0.001", HUGE, 1).encode(),
             "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "latin1": "{\"é\": 1}".encode("latin-1")}
    for what, raw in cases.items():
        f.write_bytes(raw)
        with pytest.raises(FormatError) as ei:
            load_signatures(f)
        assert str(ei.value).startswith(str(f)) and "\n" not in str(ei.value), what
        assert_one_line(*cli(capsys, "frontier", str(f)), "sigs.json")


def test_workbook_with_bom_loads_like_without(tmp_path):
    text = measured_workbook()
    plain, bom = tmp_path / "plain.json", tmp_path / "bom.json"
    plain.write_text(text)
    bom.write_bytes(BOM + text.encode())
    assert state(load_workbook(plain)["r"].predicted) == state(load_workbook(bom)["r"].predicted)


# -- problem JSON (solvers) ---------------------------------------------------------------------

def problem_doc() -> dict:
    return {"schema_version": "ecal.problem/1", "name": "two",
            "devices": {"g0": {"idle_power_w": 75.0,
                               "transitions": {"constant": {"time_s": 0.001, "energy_j": 0.1}}}},
            "tasks": [{"name": "a", "device": "g0",
                       "options": [{"time_s": 0.010, "energy_j": 2.0, "s_w": 75.0, "sm_clock_mhz": 1980},
                                   {"time_s": 0.012, "energy_j": 1.8, "s_w": 75.0, "sm_clock_mhz": 1500}]}],
            "edges": []}


PROBLEM_SPOTS = {
    "option": ('"time_s": 0.01,', '"time_s": {},', "tasks[0].options[0].time_s"),
    "idle": ('"idle_power_w": 75.0', '"idle_power_w": {}', "devices.g0.idle_power_w"),
    "transition": ('"time_s": 0.001', '"time_s": {}', "devices.g0.transitions.constant.time_s"),
}


@pytest.mark.parametrize("fault", ["int_overflow", "nan", "float_overflow"])
@pytest.mark.parametrize("spot", sorted(PROBLEM_SPOTS))
def test_bad_numbers_in_problem_files(tmp_path, capsys, fault, spot):
    old, new, field = PROBLEM_SPOTS[spot]
    text = json.dumps(problem_doc())
    assert old in text
    f = write(tmp_path / "prob.json", text.replace(old, new.replace("{}", NUMBER_FAULTS[fault][0]), 1))
    with pytest.raises(FormatError) as ei:
        load_problem(f)
    assert str(ei.value).startswith(f"{f}: {field}: ")
    assert_one_line(*cli(capsys, "plan", str(f), "--deadline", "1.5x"), "prob.json", field)


def test_problem_dict_api_names_overflow_and_negative():
    for v, why in ((10**400, "overflows"), (float("nan"), "finite"), (-1.0, "non-negative"), ("x", "number")):
        d = problem_doc()
        d["tasks"][0]["options"][1]["energy_j"] = v
        with pytest.raises(FormatError, match=rf"p.json: tasks\[0\]\.options\[1\]\.energy_j: .*{why}"):
            problem_from_dict(d, "p.json")


# -- CSV inputs ---------------------------------------------------------------------------------

# kind -> (header, rows, a numeric column for NaN/negative faults)
CSV_KINDS = {
    "zeus-trace": ("dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power",
                   ["cifar100,resnet,128,adam,100,27.1,106.8", "cifar100,resnet,128,adam,150,20.5,140.2",
                    "cifar100,resnet,128,adam,200,18.0,170.9"], "time_per_epoch"),
    "zeus-log": ("start_time,window_name,elapsed_time,gpu0_energy",
                 ["1.0,__GlobalPowerLimitOptimizer_300,9.2,2053.6",
                  "12.0,__GlobalPowerLimitOptimizer_250,10.4,2079.3",
                  "24.0,__GlobalPowerLimitOptimizer_200,11.0,1835.9"], "gpu0_energy"),
    "nv-dvfs": ("benchmark,kernel,argNo,core_frequency,memory_frequency,time,average_power,extra",
                ["bench,k1,0,1380,877,2.5,180.0,x", "bench,k1,0,1200,877,2.8,150.0,y",
                 "bench,k2,0,1380,877,1.1,120.0,z"], "time"),
    "perseus": ("stage,instruction,frequency,time,energy",
                ["0,forward,1980,0.0348,18.08", "0,forward,1500,0.0400,15.20",
                 "0,backward,1980,0.0700,36.10", "0,backward,1500,0.0810,30.90"], "time"),
}
LOADERS = {"zeus-trace": replay.load_zeus_trace, "zeus-log": replay.load_zeus_profile,
           "nv-dvfs": replay.load_nvdvfs, "perseus": replay.load_perseus}


def csv_text(kind: str, rows: list[str] | None = None) -> str:
    header, good, _ = CSV_KINDS[kind]
    return "\n".join([header, *(good if rows is None else rows)]) + "\n"


def bad_csv(kind: str, fault: str) -> tuple[bytes, str]:
    """(file bytes, text the one-line error must hold besides the file name)."""
    header, rows, col = CSV_KINDS[kind]
    idx = header.split(",").index(col)

    def with_cell(value: str) -> bytes:
        cells = rows[1].split(",")
        cells[idx] = value
        return csv_text(kind, [rows[0], ",".join(cells), *rows[2:]]).encode()

    if fault == "duplicate":
        return csv_text(kind, rows + [rows[1]]).encode(), f"line {len(rows) + 2}: duplicate row"
    if fault == "conflicting_duplicate":
        cells = rows[1].split(",")
        cells[idx] = str(float(cells[idx]) * 1.5)
        return csv_text(kind, rows + [",".join(cells)]).encode(), "already at line 3 (with other values)"
    if fault == "nan":
        return with_cell("NaN"), f"line 3, column {col}"
    if fault == "inf":
        return with_cell("inf"), f"line 3, column {col}"
    if fault == "negative":
        return with_cell("-1.5"), f"line 3, column {col}"
    if fault == "huge":
        return with_cell("1e999"), f"line 3, column {col}"
    if fault == "binary":
        return b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "binary file"
    if fault == "latin1":
        return csv_text(kind).replace(rows[0].split(",")[1], "caf\xe9", 1).encode("latin-1"), "not UTF-8"
    raise AssertionError(fault)


CSV_FAULTS = ["duplicate", "conflicting_duplicate", "nan", "inf", "negative", "huge", "binary", "latin1"]


@pytest.mark.parametrize("kind", sorted(CSV_KINDS))
def test_csv_with_bom_loads_like_without(tmp_path, kind):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain, bom = tmp_path / "a" / "data.csv", tmp_path / "b" / "data.csv"   # zeus-log: element = stem
    plain.write_text(csv_text(kind))
    bom.write_bytes(BOM + csv_text(kind).encode())
    a, b = LOADERS[kind](plain), LOADERS[kind](bom)
    assert sorted(a) == sorted(b) and a
    for el in a:
        assert [(s.time_s, s.energy_j, s.omega) for s in a[el]] == [(s.time_s, s.energy_j, s.omega) for s in b[el]]


@pytest.mark.parametrize("fault", CSV_FAULTS)
@pytest.mark.parametrize("kind", sorted(CSV_KINDS))
def test_bad_csv_is_named_by_library_and_cli(tmp_path, capsys, kind, fault):
    raw, needle = bad_csv(kind, fault)
    f = tmp_path / f"{kind}.csv"
    f.write_bytes(raw)
    with pytest.raises(FormatError) as ei:
        LOADERS[kind](f)
    msg = str(ei.value)
    assert msg.startswith(str(f)) and needle in msg and "\n" not in msg, msg
    out = tmp_path / "out.json"
    assert_one_line(*cli(capsys, "import", kind, str(f), "-o", str(out)), f.name, needle)
    assert not out.exists()


@pytest.mark.parametrize("fault", CSV_FAULTS)
def test_bad_perseus_profile_for_the_solvers(tmp_path, capsys, fault):
    raw, needle = bad_csv("perseus", fault)
    f = tmp_path / "prof.csv"
    f.write_bytes(raw)
    with pytest.raises(FormatError) as ei:
        load_problem(f)
    assert str(ei.value).startswith(str(f)) and needle in str(ei.value)
    assert_one_line(*cli(capsys, "plan", str(f), "--deadline", "1.05x"), "prof.csv", needle)


def test_perseus_profile_with_bom_plans_like_without(tmp_path, capsys):
    f = tmp_path / "bom.csv"
    f.write_bytes(BOM + EXAMPLE_CSV.read_bytes())
    a, b = load_problem(EXAMPLE_CSV, n_microbatches=4), load_problem(f, n_microbatches=4)
    assert [[o.time_s for o in t.options] for t in a.tasks] == [[o.time_s for o in t.options] for t in b.tasks]
    # the strict reader builds the same problem as the pipeline's reader on a clean file
    c = load_perseus_profile(EXAMPLE_CSV, n_microbatches=4)
    assert [(t.name, t.options) for t in a.tasks] == [(t.name, t.options) for t in c.tasks]
    assert a.edges == c.edges
    small = tmp_path / "small.csv"   # a 1-stage profile: the plan itself takes no time
    small.write_bytes(BOM + csv_text("perseus").encode())
    rc, lines = cli(capsys, "plan", str(small), "--deadline", "1.05x", "--microbatches", "2")
    assert rc == 0 and not lines


def test_option_p2p_power_must_be_finite(tmp_path):
    with pytest.raises(FormatError, match="option p2p_power_w"):
        load_problem(EXAMPLE_CSV, p2p_power_w=float("nan"))


def test_repeated_zeus_window_at_another_time_is_a_run(tmp_path):
    header, rows, _ = CSV_KINDS["zeus-log"]
    again = "40.0,__GlobalPowerLimitOptimizer_300,9.4,2071.0"
    f = tmp_path / "log.csv"
    f.write_text(csv_text("zeus-log", rows + [again]))
    sigs = replay.load_zeus_profile(f)["log"]
    at300 = next(s for s in sigs if s.omega.power_limit_w == 300)
    assert at300.n == 2 and at300.time_s == pytest.approx((9.2 + 9.4) / 2)


def test_csv_header_problems_are_named(tmp_path):
    f = tmp_path / "p.csv"
    f.write_text("stage,instruction,frequency,time,time,energy\n0,forward,1980,0.03,0.03,18\n")
    with pytest.raises(FormatError, match=r"p.csv: header: column 'time' appears more than once"):
        replay.load_perseus(f)
    f.write_text("stage,instruction,frequency,time,energy\n0,forward,1980,0.03,18,99\n")
    with pytest.raises(FormatError, match=r"p.csv: line 2: 6 cells"):
        load_problem(f)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data folder {SHARED} not present")
def test_real_data_has_no_duplicates_and_loads_with_a_bom(tmp_path):
    files = {"zeus-trace": sorted((SHARED / "zeus" / "nsdi23-traces").glob("*.csv")),
             "zeus-log": sorted((SHARED / "zeus" / "profile_data").glob("*.csv")),
             "nv-dvfs": sorted((SHARED / "nv-dvfs").glob("*.csv")), "perseus": [EXAMPLE_CSV]}
    assert all(files.values())
    for kind, paths in files.items():
        for p in paths:
            sigs = LOADERS[kind](p)
            assert sigs, p
        # a BOM (as Excel writes) changes nothing
        copy = tmp_path / paths[0].name
        copy.write_bytes(BOM + paths[0].read_bytes())
        assert sorted(LOADERS[kind](copy)) == sorted(LOADERS[kind](paths[0]))


@pytest.mark.skipif(not (SHARED / "h200" / "measurements.json").is_file(),
                    reason=f"shared data folder {SHARED} not present")
def test_h200_json_import_bom_and_overflow(tmp_path, capsys):
    src = (SHARED / "h200" / "measurements.json").read_bytes()
    bom = tmp_path / "bom.json"
    bom.write_bytes(BOM + src)
    assert sorted(replay.load_h200(bom)) == sorted(replay.load_h200())
    bad = tmp_path / "huge.json"
    bad.write_bytes(src.replace(b'"static_power_W"', b'"x": ' + HUGE.encode() + b', "static_power_W"', 1))
    out = tmp_path / "out.json"
    assert_one_line(*cli(capsys, "import", "h200", str(bad), "-o", str(out)), "huge.json: x: ", "overflows")
    assert not out.exists()


@pytest.mark.parametrize("fault", CSV_FAULTS)
def test_pipeline_reader_is_the_strict_reader(tmp_path, fault):
    # experiments read profiles through solvers.pipeline: the same checks must hold there
    raw, needle = bad_csv("perseus", fault)
    f = tmp_path / "prof.csv"
    f.write_bytes(raw)
    with pytest.raises(FormatError) as ei:
        load_perseus_profile(f)
    assert str(ei.value).startswith(str(f)) and needle in str(ei.value)


def test_dict_apis_name_an_overflowing_integer():
    from frontier.pareto import Frontier, pareto_frontier
    from solvers import Problem
    from solvers.model import ProblemError

    with pytest.raises(ProblemError, match="overflows"):
        Problem.build([("t", "g", [{"time_s": 10**400, "energy_j": 1.0}])], [], {"g": 1.0})
    doc = pareto_frontier([leaf("a"), leaf("b", t=2e-3, d=0.1)]).to_dict()
    doc["points"][0]["time_s"] = 10**400
    with pytest.raises(FormatError, match="overflows"):
        Frontier.from_dict(doc, file="f.json")
