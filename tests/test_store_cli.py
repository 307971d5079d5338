"""``ecal store import|export|list``: round trips, idempotent imports, bad inputs leave the store
as it was, list output, and imports killed mid-way (all through ``ecal.cli.main``)."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ecal.cli import main
from frontier.io import save_signatures
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature
from measure.store import ResultsStore

FAST = ["--window-s", "0.1", "--warmup-s", "0", "--min-windows", "2", "--max-windows", "3"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One simulated characterization, kept both ways: ``g.json`` (-o) and ``g.jsonl``
    (--results), plus a second element's signature file ``c.json``."""
    d = tmp_path_factory.mktemp("sweep")
    assert main(["characterize", "gemm_bf16_8192", "--grid", "sm_clock_mhz=1980:1500:-120",
                 *FAST, "-o", str(d / "g.json"), "--results", str(d / "g.jsonl")]) == 0
    assert main(["characterize", "copy_2GiB", "--grid", "sm_clock_mhz=1980,1500", *FAST,
                 "-o", str(d / "c.json")]) == 0
    return d


def _contents(path):
    with ResultsStore(path, create=False) as st:
        return st.contents()


def _integrity(path):
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


def _store(tmp_path, sweep, name="runs.sqlite"):
    """A store with points from a signature file, a results log and a campaign unit."""
    path = tmp_path / name
    assert main(["store", "import", str(path), str(sweep / "g.json"), str(sweep / "c.json"),
                 "--host", "node1"]) == 0
    assert main(["store", "import", str(path), str(sweep / "g.jsonl")]) == 0
    s = Signature("attn", s_w=90.0, time_s=2.0, d_j=3.0, omega=OperatingPoint(sm_clock_mhz=1410))
    with ResultsStore(path) as st:
        st.register_campaign("c1", {"elements": ["attn"]})
        st.commit_unit("c1", "u0", {"by": "test"},
                       [(s, {"gpu_model": "NVIDIA H200", "uuid": "GPU-a", "host": "n2"}),
                        (s, {"gpu_model": "NVIDIA H200", "uuid": "GPU-b", "host": "n2"})])
    return path


def test_import_reports_added_then_already_present(tmp_path, sweep, capsys):
    path = tmp_path / "runs.sqlite"
    assert main(["store", "import", str(path), str(sweep / "g.json")]) == 0
    out = capsys.readouterr().out
    assert "g.json (signatures): 5 added, 0 already present" in out
    before = _contents(path)
    assert main(["store", "import", str(path), str(sweep / "g.json"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["added"], doc["present"], doc["points_in_store"]) == (0, 5, 5)
    assert _contents(path) == before                       # nothing twice, nothing changed
    # the results log of the same sweep records its host; the -o file does not: --host fills
    # it in and the two files then hold the very same points
    host = json.loads((sweep / "g.jsonl").read_text().splitlines()[0])["host"]
    fresh = tmp_path / "fresh.sqlite"
    assert main(["store", "import", str(fresh), str(sweep / "g.json"), "--host", host]) == 0
    capsys.readouterr()
    assert main(["store", "import", str(fresh), str(sweep / "g.jsonl")]) == 0
    assert "g.jsonl (results-log): 0 added, 5 already present" in capsys.readouterr().out


def test_a_different_measurement_under_a_stored_key_is_kept_unless_replace(tmp_path, capsys):
    om = OperatingPoint(sm_clock_mhz=1980)
    a, b = (tmp_path / "a.json"), (tmp_path / "b.json")
    save_signatures(a, {"g@1980MHz": Signature("g", s_w=100.0, time_s=1.0, d_j=5.0, omega=om)})
    save_signatures(b, {"g@1980MHz": Signature("g", s_w=100.0, time_s=1.1, d_j=5.0, omega=om)})
    path = tmp_path / "r.sqlite"
    assert main(["store", "import", str(path), str(a), "--gpu-model", "V100"]) == 0
    assert main(["store", "import", str(path), str(b), "--gpu-model", "V100"]) == 0
    assert "1 differ from the stored point (kept the stored one" in capsys.readouterr().out
    with ResultsStore(path) as st:
        assert [r.signature.time_s for r in st.rows()] == [1.0]
    assert main(["store", "import", str(path), str(b), "--gpu-model", "V100", "--replace"]) == 0
    assert "1 replaced" in capsys.readouterr().out
    with ResultsStore(path) as st:
        assert [r.signature.time_s for r in st.rows()] == [1.1]


def test_signature_export_then_import_gives_equal_contents(tmp_path, sweep, capsys):
    path = _store(tmp_path, sweep)
    assert main(["store", "export", str(path), "-o", str(tmp_path / "all.json")]) == 0
    assert "all.json (signatures): 14 point(s) of 3 element(s)" in capsys.readouterr().out
    back = tmp_path / "back.sqlite"
    assert main(["store", "import", str(back), str(tmp_path / "all.json")]) == 0
    assert _contents(back) == _contents(path)               # keys, bodies, campaign units
    # the export is an ordinary signature file: ecal frontier reads it
    assert main(["frontier", str(tmp_path / "all.json"), "--element", "attn"]) == 0
    capsys.readouterr()
    # filtered: one GPU model
    assert main(["store", "export", str(path), "-o", str(tmp_path / "h.json"),
                 "--gpu-model", "H200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["elements"] == ["attn"]


def test_results_log_export_then_import_gives_equal_contents(tmp_path, sweep, capsys):
    path = tmp_path / "log.sqlite"
    assert main(["store", "import", str(path), str(sweep / "g.jsonl")]) == 0
    assert main(["store", "export", str(path), "-o", str(tmp_path / "back.jsonl")]) == 0
    assert "back.jsonl (results-log): 5 point(s)" in capsys.readouterr().out
    assert not list(tmp_path.glob(".back.jsonl*")) and not list(tmp_path.glob("*.lock"))
    back = tmp_path / "back.sqlite"
    assert main(["store", "import", str(back), str(tmp_path / "back.jsonl")]) == 0
    assert _contents(back) == _contents(path)


def test_results_log_export_needs_one_element_and_one_card(tmp_path, sweep, capsys):
    path = _store(tmp_path, sweep)
    out = tmp_path / "x.jsonl"
    assert main(["store", "export", str(path), "-o", str(out)]) == 2
    assert "a results log holds one element; pick one with --element" in capsys.readouterr().err
    assert main(["store", "export", str(path), "-o", str(out), "--element", "attn"]) == 2
    assert "pick with --uuid and --host" in capsys.readouterr().err
    assert main(["store", "export", str(path), "-o", str(out), "--element", "attn",
                 "--uuid", "GPU-a"]) == 0
    assert not out.with_name("x.jsonl.lock").exists()


def test_list_shows_points_campaigns_units_hosts_and_uuids(tmp_path, sweep, capsys):
    path = _store(tmp_path, sweep)
    capsys.readouterr()
    assert main(["store", "list", str(path)]) == 0
    text = capsys.readouterr().out
    assert "14 point(s) of 3 element(s) on 2 GPU model(s)" in text
    assert "campaign c1: 1 unit(s) done, 2 point(s)" in text
    assert main(["store", "list", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {(g["gpu_model"], g["element"]): g for g in doc["groups"]}
    attn = by[("NVIDIA H200", "attn")]
    assert (attn["points"], attn["campaigns"], attn["units"]) == (2, ["c1"], 1)
    assert (attn["hosts"], attn["uuids"]) == (["n2"], ["GPU-a", "GPU-b"])
    gemm = by[("simulated H200", "gemm_bf16_8192")]
    assert gemm["points"] == 10 and gemm["units"] == 0 and "node1" in gemm["hosts"]
    assert doc["points"] == 14 and doc["campaigns"][0]["units_done"] == 1


def _bad_inputs(tmp_path):
    bad = {}
    bad["missing"] = (tmp_path / "nope.json", "no such file")
    (tmp_path / "broken.json").write_text('{"schema_version": 1, "signatures": {')
    bad["malformed"] = (tmp_path / "broken.json", "invalid JSON")
    (tmp_path / "v9.json").write_text('{"schema_version": 9, "signatures": {}}')
    bad["schema"] = (tmp_path / "v9.json", "unsupported version")
    (tmp_path / "plan.json").write_text('{"format": "ecal.plan/1", "tasks": []}')
    bad["other format"] = (tmp_path / "plan.json", "is not a file of signatures")
    (tmp_path / "notes.txt").write_text("just some notes\n")
    bad["text"] = (tmp_path / "notes.txt", "neither a signature file")
    (tmp_path / "empty.json").write_text("")
    bad["empty"] = (tmp_path / "empty.json", "is empty")
    ResultsStore(tmp_path / "other.db").close()
    bad["a store"] = (tmp_path / "other.db", "is an SQLite database")
    return bad


def test_bad_inputs_fail_with_one_line_and_leave_the_store_unchanged(tmp_path, sweep, capsys):
    path = tmp_path / "runs.sqlite"
    assert main(["store", "import", str(path), str(sweep / "c.json")]) == 0
    before = _contents(path)
    for what, (f, msg) in _bad_inputs(tmp_path).items():
        capsys.readouterr()
        # a good file before the bad one: all or nothing
        assert main(["store", "import", str(path), str(sweep / "g.json"), str(f)]) == 2, what
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1 and err.startswith("ecal store: error:"), (what, err)
        assert _contents(path) == before, what
    # nothing is created for a failed import into a new store
    assert main(["store", "import", str(tmp_path / "new.sqlite"), str(tmp_path / "v9.json")]) == 2
    assert not (tmp_path / "new.sqlite").exists()
    # a store must be named like one
    assert main(["store", "import", str(tmp_path / "runs.json"), str(sweep / "g.json")]) == 2
    assert "a store's name ends in .sqlite" in capsys.readouterr().err
    assert main(["store", "import", str(path), str(sweep / "c.json"), "--protocol", "fast"]) == 2
    assert "--protocol must be a JSON object" in capsys.readouterr().err
    for action in (["list"], ["export", "-o", str(tmp_path / "o.json")]):
        assert main(["store", *action, str(tmp_path / "missing.sqlite")]) == 2
        assert "missing.sqlite: no such file" in capsys.readouterr().err
    assert not (tmp_path / "missing.sqlite").exists()


def test_a_signature_file_without_gpu_model_needs_gpu_model(tmp_path, sweep, capsys):
    f = tmp_path / "v100.json"
    save_signatures(f, {"g@1380MHz": Signature("g", s_w=60.0, time_s=1.0, d_j=5.0,
                                               omega=OperatingPoint(sm_clock_mhz=1380))})
    path = tmp_path / "r.sqlite"
    assert main(["store", "import", str(path), str(f)]) == 2
    err = capsys.readouterr().err
    assert "signatures.g@1380MHz: no GPU model recorded" in err and "--gpu-model" in err
    assert not path.exists()                                  # nothing written
    assert main(["store", "import", str(path), str(f), "--gpu-model", "V100", "--uuid", "GPU-v"]) == 0
    with ResultsStore(path) as st:
        k = st.rows()[0].key
    assert (k.gpu_model, k.uuid, k.driver) == ("V100", "GPU-v", "unknown")
    # a flag never overrides what a file records (here: the simulator's model)
    capsys.readouterr()
    assert main(["store", "import", str(path), str(sweep / "c.json"), "--gpu-model", "H200"]) == 2
    assert "records gpu_model 'simulated H200', not 'H200'" in capsys.readouterr().err


def test_a_results_log_with_a_torn_last_line(tmp_path, sweep, capsys):
    lines = (sweep / "g.jsonl").read_bytes().splitlines(keepends=True)
    points = [ln for ln in lines if b'"kind": "point"' in ln]
    # a kill while the last point was written: that point is left out, with a warning
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b"".join(lines[:-1]) + lines[-1][:40])
    before = torn.read_bytes()
    path = tmp_path / "r.sqlite"
    assert main(["store", "import", str(path), str(torn)]) == 0
    io = capsys.readouterr()
    assert "last line is cut short" in io.err
    assert f"{len(points) - 1} added" in io.out
    assert torn.read_bytes() == before                        # the input is only read
    # a last line that cannot be what a kill left is refused
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"".join(lines) + b"garbage")
    assert main(["store", "import", str(path), str(junk)]) == 2
    assert "incomplete last line that is not a record cut short" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(lines) + b'{"kind": "point", "key": \n')
    assert main(["store", "import", str(path), str(bad)]) == 2
    assert len(_contents(path)) == len(points) - 1


def test_an_exception_inside_the_transaction_leaves_the_store_unchanged(tmp_path, sweep,
                                                                         monkeypatch, capsys):
    from measure.store import StoreError

    path = tmp_path / "runs.sqlite"
    assert main(["store", "import", str(path), str(sweep / "c.json")]) == 0
    before = _contents(path)
    real, n = ResultsStore.merge, [0]

    def failing(self, *a, **k):
        n[0] += 1
        if n[0] == 3:
            raise StoreError("disk full (injected)")
        return real(self, *a, **k)

    monkeypatch.setattr(ResultsStore, "merge", failing)
    assert main(["store", "import", str(path), str(sweep / "g.json")]) == 2
    assert "disk full (injected)" in capsys.readouterr().err
    assert n[0] == 3 and _contents(path) == before and _integrity(path) == "ok"


_KILLER = textwrap.dedent("""
    import os, signal, sys
    from measure.store import ResultsStore
    real, n = ResultsStore.merge, [0]
    def dying(self, *a, **k):
        n[0] += 1
        if n[0] == int(os.environ["KILL_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *a, **k)
    ResultsStore.merge = dying
    from ecal.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_an_import_killed_mid_way_leaves_the_store_unchanged_and_whole(tmp_path, sweep):
    path = tmp_path / "runs.sqlite"
    assert main(["store", "import", str(path), str(sweep / "c.json")]) == 0
    before = _contents(path)
    big = tmp_path / "big.json"       # many points, so the kill lands well inside the transaction
    save_signatures(big, {f"g@{c}MHz": Signature("g", s_w=100.0, time_s=1.0 + c / 1e4, d_j=5.0,
                                                 omega=OperatingPoint(sm_clock_mhz=c))
                          for c in range(300, 2300)})
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "KILL_AT": "1500", "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", _KILLER, "store", "import", str(path), str(big),
                           "--gpu-model", "V100"], env=env, cwd=root, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert _integrity(path) == "ok"
    assert _contents(path) == before                          # unchanged, not half-written
    # the next import completes it
    assert main(["store", "import", str(path), str(big), "--gpu-model", "V100"]) == 0
    assert len(_contents(path)) == len(before) + 2000 and _integrity(path) == "ok"


def test_an_export_killed_while_writing_leaves_the_old_file(tmp_path, sweep):
    path = _store(tmp_path, sweep)
    out = tmp_path / "out.json"
    out.write_text('{"old": true}\n')
    killer = textwrap.dedent("""
        import os, signal, sys
        import measure.store_io as ms
        def dying(store, tmp, **k):
            with open(tmp, "w") as fh:
                fh.write('{"schema_version": 1, "signatures": {"half')
            os.kill(os.getpid(), signal.SIGKILL)
        ms.export_signature_file = dying
        from ecal.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", killer, "store", "export", str(path), "-o",
                           str(out)], env={**os.environ, "PYTHONPATH": str(root)}, cwd=root,
                          capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert out.read_text() == '{"old": true}\n'
    # a failed export (nothing selected) changes nothing either
    assert main(["store", "export", str(path), "-o", str(out), "--element", "none"]) == 2
    assert out.read_text() == '{"old": true}\n'


def test_frontier_reads_what_the_cli_imported(tmp_path, sweep, capsys):
    path = tmp_path / "runs.sqlite"
    assert main(["store", "import", str(path), str(sweep / "g.json"), str(sweep / "c.json")]) == 0
    capsys.readouterr()
    assert main(["frontier", str(path), "--gpu-model", "simulated H200", "--json"]) == 0
    assert sorted(json.loads(capsys.readouterr().out)) == ["copy_2GiB", "gemm_bf16_8192"]
