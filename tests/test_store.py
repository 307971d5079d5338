"""The SQLite results store: lossless round trips, filters, JSON import/export, concurrent writers."""

import json
import multiprocessing as mp
import sqlite3

import pytest

from frontier.errors import FormatError
from frontier.io import load_signatures, save_signatures
from frontier.operating_point import OperatingPoint
from frontier.pareto import signature_to_dict
from frontier.signature import Signature
from measure.results_log import ResultsLog
from measure.store import (
    ResultsStore,
    StoreError,
    is_store_path,
    model_matches,
    read_signatures,
)
from measure.store_io import (
    export_results_log,
    export_signature_file,
    import_results_log,
    import_signature_file,
)


def _measured(n=3):
    """A few real simulated measurements (full metadata, exact variances)."""
    from measure.protocol import Protocol
    from measure.sim import PRESETS, SimulatedGPU
    from measure.sweep import sweep

    p = Protocol(window_s=0.1, warmup_s=0.0, min_windows=2, max_windows=3, ready_window_s=0.2,
                 ready_windows=1, target_rse=0.05)
    clocks = ",".join(str(1980 - 300 * i) for i in range(n))
    return sweep(SimulatedGPU(seed=0), {None: PRESETS["copy_2GiB"]}, "copy_2GiB",
                 grid=f"sm_clock_mhz={clocks}", protocol=p, progress=None).signatures


def test_a_point_reads_back_bit_for_bit(tmp_path):
    sigs = _measured()
    with ResultsStore(tmp_path / "r.sqlite") as st:
        for s in sigs:
            st.add(s, gpu_model="simulated H200")
        assert st.count() == 3
    back = read_signatures(tmp_path / "r.sqlite")["copy_2GiB"]
    assert [json.dumps(signature_to_dict(s), sort_keys=True) for s in back] == \
        [json.dumps(signature_to_dict(s), sort_keys=True) for s in sorted(sigs, key=lambda s: s.omega)]
    assert {s.var_energy_j2 for s in back} == {s.var_energy_j2 for s in sigs}


def test_the_key_separates_cards_protocols_and_hosts(tmp_path):
    s = Signature("g", s_w=100.0, time_s=1.0, d_j=5.0, omega=OperatingPoint(sm_clock_mhz=1980))
    with ResultsStore(tmp_path / "r.sqlite") as st:
        st.add(s, gpu_model="NVIDIA H200", uuid="GPU-a", host="n1")
        st.add(s, gpu_model="NVIDIA H200", uuid="GPU-b", host="n1")
        st.add(s, gpu_model="NVIDIA H200", uuid="GPU-b", host="n1", protocol={"window_s": 5})
        st.add(s, gpu_model="NVIDIA H200", uuid="GPU-a", host="n1")        # same key: replaced
        st.add(s, gpu_model="simulated H200", uuid="SIM-H200-0")
        st.add(Signature("h", s_w=90.0, time_s=2.0, d_j=1.0), gpu_model="V100")
        assert st.count() == 5
        assert st.gpu_models() == ["NVIDIA H200", "V100", "simulated H200"]
    assert len(read_signatures(tmp_path / "r.sqlite", gpu_model="H200")["g"]) == 3
    assert len(read_signatures(tmp_path / "r.sqlite", gpu_model="simulated H200")["g"]) == 1
    assert list(read_signatures(tmp_path / "r.sqlite", element="h")) == ["h"]
    assert read_signatures(tmp_path / "r.sqlite", gpu_model="A100") == {}
    assert model_matches("NVIDIA H200", "h200") and not model_matches("simulated H200", "H200")


def test_a_file_that_is_not_a_store_is_refused_unchanged(tmp_path):
    p = tmp_path / "notes.db"
    p.write_bytes(b"my notes, not a database\n" * 100)
    before = p.read_bytes()
    with pytest.raises(FormatError, match="not an energy-calculus store"):
        ResultsStore(p)
    assert p.read_bytes() == before
    with pytest.raises(FileNotFoundError):
        read_signatures(tmp_path / "missing.sqlite")
    assert not (tmp_path / "missing.sqlite").exists()
    assert is_store_path("x.SQLITE") and is_store_path("a/b.db") and not is_store_path("x.json")


def test_signature_files_import_and_export(tmp_path):
    sigs = _measured()
    save_signatures(tmp_path / "in.json", {f"copy@{s.omega.label()}": s for s in sigs})
    with ResultsStore(tmp_path / "r.sqlite") as st:
        assert import_signature_file(st, tmp_path / "in.json", gpu_model="simulated H200") == 3
        assert import_signature_file(st, tmp_path / "in.json", gpu_model="simulated H200") == 3
        assert st.count() == 3                      # the same points: one row each
        row = st.rows()[0]
        assert row.key.uuid == "SIM-H200" and row.key.driver == "simulator"
        assert export_signature_file(st, tmp_path / "out.json") == 3
    out = load_signatures(tmp_path / "out.json")
    assert {s.energy_j for s in out.values()} == {s.energy_j for s in sigs}
    assert all(k.startswith("copy@") for k in out)          # the element of the keys read in


def test_results_files_import_and_export(tmp_path):
    from measure.protocol import Protocol
    from measure.sim import PRESETS, SimulatedGPU
    from measure.sweep import sweep

    p = Protocol(window_s=0.1, warmup_s=0.0, min_windows=2, max_windows=3, ready_window_s=0.2,
                 ready_windows=1, target_rse=0.05)
    res = sweep(SimulatedGPU(seed=0), {None: PRESETS["copy_2GiB"]}, "copy_2GiB",
                grid="sm_clock_mhz=1980,1680", protocol=p, progress=None,
                results_path=str(tmp_path / "r.jsonl"))
    with ResultsStore(tmp_path / "s.sqlite") as st:
        assert import_results_log(st, tmp_path / "r.jsonl") == 2
        k = st.rows()[0].key
        assert (k.uuid, k.driver, json.loads(k.protocol)["window_s"]) == ("SIM-H200", "simulator", 0.1)
        assert export_results_log(st, tmp_path / "back.jsonl", "copy_2GiB") == 2
        assert export_results_log(st, tmp_path / "back.jsonl", "copy_2GiB") == 0   # extended, not doubled
        with pytest.raises(StoreError, match="no points"):
            export_results_log(st, tmp_path / "x.jsonl", "nothing")
    back = ResultsLog(tmp_path / "back.jsonl").points
    orig = ResultsLog(tmp_path / "r.jsonl").points
    assert set(back) == set(orig)
    assert all(back[k].energy_j == orig[k].energy_j and back[k].var_time_s2 == orig[k].var_time_s2
               for k in orig)
    assert len(res.signatures) == 2


def _writer(path, who, n, barrier):
    with ResultsStore(path) as st:
        barrier.wait()
        for i in range(n):
            s = Signature(f"el{who}", s_w=100.0, time_s=1.0 + i, d_j=2.0,
                          omega=OperatingPoint(sm_clock_mhz=1000 + i))
            st.add(s, gpu_model="simulated H200", uuid=f"SIM-{who}")
            # every writer also races for the same units: exactly one may commit each
            shared = Signature("shared", s_w=100.0, time_s=1.0, d_j=2.0,
                               omega=OperatingPoint(sm_clock_mhz=1000 + i % 5))
            st.commit_unit("shared", f"u{i % 5}", {"by": who},
                           [(shared, {"gpu_model": "simulated H200", "uuid": f"SIM-{who}"})])


def test_concurrent_writers_do_not_corrupt_the_store(tmp_path):
    path = tmp_path / "r.sqlite"
    ResultsStore(path).close()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_writer, args=(str(path), w, 40, barrier)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    with ResultsStore(path) as st:
        assert len(st.done_units("shared")) == 5            # each unit committed exactly once
        per = {r.key.element: 0 for r in st.rows()}
        for r in st.rows():
            per[r.key.element] += 1
        assert all(per[f"el{w}"] == 40 for w in range(4))
        assert sum(1 for r in st.rows() if r.campaign == "shared") == 5


def test_ecal_frontier_reads_a_store_by_gpu_model(tmp_path, capsys):
    from ecal.cli import main

    with ResultsStore(tmp_path / "r.sqlite") as st:
        for s in _measured():
            st.add(s, gpu_model="simulated H200")
    assert main(["frontier", str(tmp_path / "r.sqlite"), "--gpu-model", "simulated H200",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["copy_2GiB"]
    assert main(["frontier", str(tmp_path / "r.sqlite"), "--gpu-model", "A100"]) == 2
    assert "no signatures of GPU model 'A100'" in capsys.readouterr().err
    assert main(["frontier", str(tmp_path / "nope.sqlite")]) == 2
