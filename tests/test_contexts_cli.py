"""``ecal contexts``: every option of every device of a workload characterized at two or more
entry temperatures on the simulator (a 2-stage 1F1B of the bundled elements, reduced to two
operating points each), the file read back by ``read_contexts``, the seeding per device,
``characterize_device``'s two modes, and bad input (exit 2, one line, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ecal.cli import main
from execution.contexts import characterize_contexts, plan_contexts_keys
from execution.reorder import characterize_device, option_keys, read_contexts
from execution.workload import load_workload
from frontier.errors import InputError
from measure.factory import open_device

EXAMPLES = Path(__file__).resolve().parents[1] / "ecal" / "examples"
KEEP = ("1980MHz", "1380MHz")


def _reduce(src: Path, dst: Path, rename: str | None = None) -> None:
    """``src``'s signature file with the points at :data:`KEEP` only (element renamed)."""
    doc = json.loads(src.read_text())
    sigs = {k: v for k, v in doc["signatures"].items() if k.endswith(KEEP)}
    if rename is not None:
        sigs = {rename + k[k.index("@"):]: {**v, "name": rename} for k, v in sigs.items()}
        doc["meta"]["elements"] = [rename]
    doc["signatures"] = sigs
    dst.write_text(json.dumps(doc))


@pytest.fixture
def wl_file(tmp_path: Path) -> Path:
    _reduce(EXAMPLES / "workload_fwd.json", tmp_path / "fwd.json")
    _reduce(EXAMPLES / "workload_bwd.json", tmp_path / "bwd.json")
    doc = json.loads((EXAMPLES / "workload_1f1b.json").read_text())
    doc["elements"] = {"fwd": {"source": "fwd.json", "element": "stage_forward"},
                       "bwd": {"source": "bwd.json", "element": "stage_backward"}}
    doc["shape"].update(stages=2, microbatches=2)
    p = tmp_path / "w.json"
    p.write_text(json.dumps(doc))
    return p


def _cli(capsys, *args):
    rc = main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, [ln for ln in cap.err.splitlines() if ln.strip()]


def test_every_option_of_every_device_at_two_entries(wl_file, tmp_path, capsys) -> None:
    out = tmp_path / "ctx.json"
    rc, text, err = _cli(capsys, "contexts", str(wl_file), "--device", "sim", "-o", str(out), "--json")
    assert rc == 0, err
    summary = json.loads(text)
    chars = read_contexts(out)                  # validates ecal.contexts/1
    want = plan_contexts_keys(load_workload(wl_file))
    assert set(chars) == set(want) == {"stage0", "stage1"}
    for dev, keys in want.items():
        assert keys == {f"{el}@{w}" for el in ("fwd", "bwd") for w in KEEP}
        c = chars[dev]
        assert set(c.contexts) == keys
        m = c.mechanism
        assert m.tau_s > 0 and m.r_th_c_per_w > 0 and 0.0 < m.ambient_c < 50.0
        assert c.sigma_temp_c > 0
        for k, cs in c.contexts.items():
            temps = sorted(cs.temps_c)
            assert len(temps) >= 2, k
            assert temps[-1] > temps[0] + 15.0, k          # warm entry warmer (≈ 60 vs ≈ 34 °C)
            assert all(s.time_s > 0 and s.energy_j > 0 for s in cs.by_entry_c.values())
        assert set(summary["devices"][dev]["keys"]) == keys
        assert summary["devices"][dev]["tau_s"] == pytest.approx(m.tau_s)
    doc = json.loads(out.read_text())
    assert doc["device"] == "sim" and doc["simulated"] is True


def test_text_output_and_devices_seeded_by_position(wl_file, tmp_path, capsys) -> None:
    # stage1 alone is seeded as in the run of every device (seed + its place): same numbers
    whole = characterize_contexts(wl_file, seed=3)
    out = tmp_path / "one.json"
    rc, text, err = _cli(capsys, "contexts", str(wl_file), "-o", str(out), "--seed", "3",
                         "--devices", "stage1", "--warm-c", "55", "--quiet")
    assert rc == 0, err
    lines = text.splitlines()
    assert lines[0].startswith("stage1: thermal model ambient ") and "4 option(s)" in lines[0]
    assert len(lines) == 5 and all(" % E " in ln and ln.endswith(" °C") for ln in lines[1:])
    assert set(read_contexts(out)) == {"stage1"}
    again = characterize_contexts(wl_file, seed=3, devices=["stage1"])
    a, b = whole["stage1"].contexts["fwd@1980MHz"], again["stage1"].contexts["fwd@1980MHz"]
    assert a.by_entry_c == b.by_entry_c


def test_characterize_device_all_options_measures_each_key_once(wl_file) -> None:
    wl = load_workload(wl_file)
    keys = option_keys(wl, "stage0")
    assert list(keys) == ["fwd@1980MHz", "fwd@1380MHz", "bwd@1980MHz", "bwd@1380MHz"]
    gpu = open_device("sim", seed=0)
    # reorder's mode keeps refusing several ω per element
    with pytest.raises(InputError, match="2 operating points"):
        characterize_device(wl, gpu, "stage0", warm_c=(60.0,), repeats=2)
    events: list = []
    ch = characterize_device(wl, gpu, "stage0", warm_c=(50.0, 60.0), repeats=2, all_options=True,
                             progress=events.append)
    assert len(events) == len(keys) * 3 and events[-1].done == events[-1].total == 12
    assert all(len(cs.temps_c) == 3 for cs in ch.contexts.values())


@pytest.mark.parametrize("case, extra, match", [
    ("missing", [], "No such file"),
    ("no-work", [], "no work to run"),
    ("ok", ["--repeats", "1"], "--repeats must be >= 2"),
    ("ok", ["--warm-c", ","], "--warm-c"),
    ("ok", ["--device", "tpu"], "--device 'tpu'"),
    ("ok", ["--devices", "stage7"], "no device 'stage7'"),
    ("unwritable", [], "cannot write -o"),
])
def test_bad_input_exit_2_one_line_nothing_written(wl_file, tmp_path, capsys, case, extra,
                                                   match) -> None:
    path, out = wl_file, tmp_path / "ctx.json"
    if case == "missing":
        path = tmp_path / "nope.json"
    elif case == "no-work":               # an element whose name is no simulated preset
        _reduce(EXAMPLES / "workload_fwd.json", tmp_path / "fwd.json", rename="my_forward")
        doc = json.loads(wl_file.read_text())
        doc["elements"]["fwd"]["element"] = "my_forward"
        wl_file.write_text(json.dumps(doc))
    elif case == "unwritable":
        (tmp_path / "afile").write_text("x")
        out = tmp_path / "afile" / "ctx.json"
    rc, _out, err = _cli(capsys, "contexts", str(path), "-o", str(out), *extra)
    assert rc == 2 and not out.exists()
    assert len(err) == 1 and match in err[0], err
    assert err[0].startswith("ecal contexts: error: ")


def test_the_bundled_example_names_its_work() -> None:
    # every element of the bundled 1F1B runs on the simulator (stage_forward, stage_backward)
    wl = load_workload(EXAMPLES / "workload_1f1b.json")
    keys = plan_contexts_keys(wl)
    assert len(keys) == 4 and all(len(k) == 10 for k in keys.values())
    assert set(wl.works) == {"fwd", "bwd"}


def test_refuses_writing_over_its_input(wl_file, capsys) -> None:
    before = wl_file.read_text()
    rc, _out, err = _cli(capsys, "contexts", str(wl_file), "-o", str(wl_file))
    assert rc == 2 and wl_file.read_text() == before and "input file" in err[0]
