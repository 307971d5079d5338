"""Kernel traces beyond one file and one timeline: launch gaps as tasks, collectives joining
devices, one file per rank, and Nsight Systems' SQLite export (measure.trace_group,
measure.nsys_trace). Every expectation is worked out by hand from the events written here."""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
import sys

import pytest

from ecal.cli import main
from frontier.errors import InputError
from frontier.formats import content, validate
from frontier.operating_point import OperatingPoint
from measure.nsys_trace import read_nsys_sqlite
from measure.sim import SimulatedGPU, preset
from measure.torch_trace import (
    TraceError,
    collective_kind,
    group_trace,
    join_traces,
    parse_torch_trace,
)

T0 = 1_733_400_000_000.0


def _k(name, dev, stream, ts, dur, cat="kernel", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": dev, "tid": stream, "ts": T0 + ts,
            "dur": dur, "args": {"device": dev, "stream": stream, **args}}


# -- launch gaps -------------------------------------------------------------------------------

def test_launch_gaps_by_hand_on_one_lane():
    # a [0,10], b [30,40] (waits 20 us), c [42,50] (waits 2 us: short), d [150,160] (waits 100)
    ev = [_k("a", 0, 7, 0, 10), _k("b", 0, 7, 30, 10), _k("c", 0, 7, 42, 8), _k("d", 0, 7, 150, 10)]
    w = group_trace(parse_torch_trace(ev))
    assert [(t.name, t.element, t.kernels) for t in w.tasks] == [
        ("gpu0/0", "gpu0/a", 1), ("gpu0/1.gap", "gpu0/gap_20us", 0), ("gpu0/1", "gpu0/b", 1),
        ("gpu0/2", "gpu0/c", 1), ("gpu0/3.gap", "gpu0/gap_100us", 0), ("gpu0/3", "gpu0/d", 1)]
    gaps = {e.name: (e.roofline, e.work, e.tasks) for e in w.elements if e.roofline == "gap"}
    assert gaps == {"gpu0/gap_20us": ("gap", "traced_gap_20us", 1),
                    "gpu0/gap_100us": ("gap", "traced_gap_100us", 1)}
    assert (w.gap_tasks, w.gap_time_s, w.short_gap_time_s) == (2, pytest.approx(120e-6),
                                                                pytest.approx(2e-6))
    # busy + kept gaps + short gaps = the span: nothing of the step is lost but the short waits
    assert w.kernel_time_s + w.gap_time_s + w.short_gap_time_s == pytest.approx(w.span_s)
    # two significant digits: 20 and 21 us waits are two elements, 123 and 124 us one
    ev2 = [_k("a", 0, 7, 0, 1), _k("a", 0, 7, 22, 1), _k("a", 0, 7, 146, 1), _k("a", 0, 7, 271, 1)]
    w2 = group_trace(parse_torch_trace(ev2))
    assert sorted(e.name for e in w2.elements if e.roofline == "gap") == [
        "gpu0/gap_120us", "gpu0/gap_21us"]
    assert group_trace(parse_torch_trace(ev), min_gap_s=None).gap_tasks == 0
    assert group_trace(parse_torch_trace(ev), min_gap_s=50e-6).gap_tasks == 1
    with pytest.raises(InputError, match="minimum gap"):
        group_trace(parse_torch_trace(ev), min_gap_s=-1.0)


def test_a_wait_for_another_stream_is_not_a_launch_gap():
    # lanes: s1 a [0,50]; s2 b [0,10], then c [60,70] waits for a (edge a -> c): the gap is
    # 60 - max(10, 50) = 10 us, and the edge into c moves to c's gap
    ev = [_k("a", 0, 1, 0, 50), _k("b", 0, 2, 0, 10), _k("c", 0, 2, 60, 10)]
    w = group_trace(parse_torch_trace(ev), streams="lanes")
    assert [t.name for t in w.tasks] == ["gpu0.s1/0", "gpu0.s2/0", "gpu0.s2/1.gap", "gpu0.s2/1"]
    assert w.edges == (("gpu0.s1/0", "gpu0.s2/1.gap"),)
    assert [e.name for e in w.elements if e.roofline == "gap"] == ["gpu0/gap_10us"]


def test_a_gap_waits_on_the_simulator_whatever_the_clock():
    g = SimulatedGPU(read_only=True)
    k = preset("traced_gap_40us")
    hi = g.kernel_state(k, OperatingPoint(sm_clock_mhz=1980))
    lo = g.kernel_state(k, OperatingPoint(sm_clock_mhz=1200))
    assert hi.time_s == pytest.approx(40e-6) and lo.time_s == pytest.approx(40e-6)
    # no SM works: lower at the lower clock (lower voltage), and below a memory kernel
    assert lo.power_w < hi.power_w < g.kernel_state(preset("traced_memory_40us")).power_w


# -- collectives and ranks -------------------------------------------------------------------

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _rank(tmp_path, r, events):
    p = tmp_path / f"rank{r}.json"
    p.write_text(json.dumps({"traceEvents": events}))
    return p


def test_collective_kinds_by_name():
    assert collective_kind(AR) == "allreduce" and collective_kind(AG) == "allgather"
    assert collective_kind("ncclKernel_ReduceScatter_RING_LL_Sum_float") == "reducescatter"
    assert collective_kind("ncclDevKernel_SendRecv(ncclDevComm*)") is None     # no peer named
    assert collective_kind("reduce_kernel<512>") is None                       # not NCCL


def test_ranks_are_joined_by_their_collectives(tmp_path):
    # rank 0: g [0,100], allreduce [100,150]; rank 1: g [0,50], allreduce [60,110]; each file
    # one device (both say device 0): they become gpu0 and gpu1
    r0 = parse_torch_trace([_k("g", 0, 7, 0, 100), _k(AR, 0, 9, 100, 50)], "rank0.json")
    r1 = parse_torch_trace([_k("g", 0, 7, 0, 50), _k(AR, 0, 9, 60, 50)], "rank1.json")
    t = join_traces([r0, r1])
    assert sorted({k.device for k in t.kernels}) == ["0", "1"] and t.file == "rank0.json, rank1.json"
    w = group_trace(t, min_gap_s=None)
    assert w.gpus == ("gpu0", "gpu1") and w.collectives == 1
    # the allreduce of each rank waits for the other rank's task before its allreduce
    assert sorted(w.edges) == [("gpu0/0", "gpu1/1"), ("gpu1/0", "gpu0/1")]
    assert w.collective_edges == 2
    assert group_trace(t, collectives=False, min_gap_s=None).edges == ()
    # with gaps: rank 1 waited 10 us after its g (by its own clock; rank 0's times are on
    # another host's clock and do not count); the edge from rank 0 stays on the allreduce
    wg = group_trace(t)
    assert [t.name for t in wg.tasks if t.device == "gpu1"] == ["gpu1/0", "gpu1/1.gap", "gpu1/1"]
    assert sorted(wg.edges) == [("gpu0/0", "gpu1/1"), ("gpu1/0", "gpu0/1")]


def test_unmatched_and_misordered_collectives(caplog):
    a = parse_torch_trace([_k("g", 0, 7, 0, 10), _k(AR, 0, 7, 10, 5), _k(AR, 0, 7, 20, 5)])
    b = parse_torch_trace([_k("g", 0, 7, 0, 10), _k(AR, 0, 7, 10, 5)])
    with caplog.at_level(logging.WARNING, logger="measure.trace_group"):
        w = group_trace(join_traces([a, b]), min_gap_s=None)
    assert w.collectives == 0 and w.edges == ()
    assert "allreduce is called 2/1 times" in caplog.text
    # rank 0: AllReduce then AllGather; rank 1 the other way round: a cycle, refused
    c = parse_torch_trace([_k("g", 0, 7, 0, 10), _k(AR, 0, 7, 10, 5), _k(AG, 0, 7, 20, 5)])
    d = parse_torch_trace([_k("g", 0, 7, 0, 10), _k(AG, 0, 7, 10, 5), _k(AR, 0, 7, 20, 5)])
    with pytest.raises(InputError, match="different orders.*--no-collectives"):
        group_trace(join_traces([c, d]), min_gap_s=None)
    assert group_trace(join_traces([c, d]), collectives=False, min_gap_s=None).edges == ()


def test_files_with_several_devices_are_named_rank_dot_device():
    a = parse_torch_trace([_k("g", 0, 7, 0, 10), _k("g", 1, 7, 0, 10)])
    b = parse_torch_trace([_k("g", 0, 7, 0, 10)])
    w = group_trace(join_traces([a, b]), min_gap_s=None)
    assert w.gpus == ("gpu0.0", "gpu0.1", "gpu1.0")


def test_import_one_file_per_rank(tmp_path, capsys):
    from execution.workload import load_workload
    from execution.workload_models import WorkloadFile

    p0 = _rank(tmp_path, 0, [_k("gemm_a", 0, 7, 0, 100), _k(AR, 0, 9, 100, 50)])
    p1 = _rank(tmp_path, 1, [_k("gemm_a", 0, 7, 0, 50), _k(AR, 0, 9, 60, 50)])
    out = tmp_path / "step.json"
    assert main(["import", "torch-trace", str(p0), str(p1), "-o", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["devices"] == ["gpu0", "gpu1"] and res["collectives"] == 1
    assert res["collective_edges"] == 2 and res["gap_tasks"] == 1 and res["trace"] == [str(p0), str(p1)]
    assert any("one per rank" in a for a in res["assumed"])
    doc = json.loads(out.read_text())
    validate(WorkloadFile, content(str(out), doc, "workload")[1], str(out))
    # the printed characterize (a small grid: this is a test), then the workload plans with
    # the cross-device edges in it
    import shlex
    argv = shlex.split(res["next"][0])[1:]
    assert main([*argv, "--grid", "sm_clock_mhz=1980,1380"]) == 0
    capsys.readouterr()
    wl = load_workload(out)
    assert len(wl.problem.tasks) == 5
    assert main(["plan", str(out), "--deadline", "1.2x", "-o", str(tmp_path / "plan.json")]) == 0
    capsys.readouterr()
    assert main(["import", "torch-trace", str(p0), str(p0), "-o", str(tmp_path / "x.json")]) == 2
    assert "named twice" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


# -- Nsight Systems SQLite --------------------------------------------------------------------

def nsys_db(path, *, nvtx=True, runtime=True):
    """A small export with the tables and columns `nsys export --type sqlite` writes (the ones
    read). Device 0, stream 7: gemm [1000,101000] ns, memcpy HtoD [101000,151000], gemm
    [200000,300000]; NVTX ProfilerStep#0 [0,160000] and #1 [160000,400000] (launches at start-500)."""
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER,
            globalPid INTEGER, demangledName INTEGER, shortName INTEGER, gridX INTEGER,
            gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER,
            globalPid INTEGER, bytes INTEGER, copyKind INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER,
            globalPid INTEGER, value INTEGER, bytes INTEGER);
        INSERT INTO StringIds VALUES (1, 'sm90_xmma_gemm_bf16bf16_bf16f32'), (2, 'gemm'),
            (3, 'ProfilerStep#0'), (4, 'ProfilerStep#1');
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
            (1000, 101000, 0, 1, 7, 11, 1, 1, 2, 132, 1, 1, 128, 1, 1),
            (200000, 300000, 0, 1, 7, 13, 1, 1, 2, 132, 1, 1, 128, 1, 1);
        INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (101000, 151000, 0, 1, 7, 12, 1, 4096, 1);
    """)
    if nvtx:
        con.executescript("""
            CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER,
                text TEXT, textId INTEGER, globalTid INTEGER);
            INSERT INTO NVTX_EVENTS VALUES (0, 160000, 59, NULL, 3, 1), (160000, 400000, 59, NULL, 4, 1),
                (0, 90000, 59, 'fwd', NULL, 1), (150000, 400000, 59, 'fwd', NULL, 1);
        """)
    if runtime:
        con.executescript("""
            CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
                eventClass INTEGER, globalTid INTEGER, correlationId INTEGER, nameId INTEGER);
            INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (500, 900, 0, 1, 11, 0),
                (100500, 100900, 0, 1, 12, 0), (170000, 170400, 0, 1, 13, 0);
        """)
    con.commit()
    con.close()
    return path


def test_nsys_export_reads_kernels_copies_and_steps(tmp_path):
    db = nsys_db(tmp_path / "report.sqlite")
    t = read_nsys_sqlite(db)
    assert [(k.name, k.category, k.device, k.stream) for k in t.kernels] == [
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", "0", "7"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", "0", "7"),
        ("Memcpy HtoD", "gpu_memcpy", "0", "7")]
    assert [round(k.start_s * 1e6, 6) for k in t.kernels] == [0.0, 199.0, 100.0]
    assert [round(k.duration_s * 1e6, 6) for k in t.kernels] == [100.0, 100.0, 50.0]
    assert t.kernels[0].identity == (("grid", "[132,1,1]"), ("block", "[128,1,1]"))
    assert t.source == "nsys"
    # the second gemm was launched (170000 ns) in ProfilerStep#1
    assert [k.name for k in read_nsys_sqlite(db, step=1).kernels] == ["sm90_xmma_gemm_bf16bf16_bf16f32"]
    assert len(read_nsys_sqlite(db, step=0).kernels) == 2
    # the K-th range named "fwd" (from 0): #1 is [150000, 400000]
    assert len(read_nsys_sqlite(db, step=1, nvtx_range="fwd").kernels) == 1
    w = group_trace(t)
    assert [e.name for e in w.elements] == ["gpu0/sm90_xmma_gemm_bf16bf16_bf16f32",
                                            "gpu0/Memcpy_HtoD", "gpu0/gap_49us"]
    assert w.span_s == pytest.approx(299e-6)


def test_nsys_refusals_are_one_line_and_leave_the_file_alone(tmp_path):
    db = nsys_db(tmp_path / "report.sqlite", nvtx=False)
    before = db.read_bytes()
    with pytest.raises(TraceError, match="no NVTX_EVENTS table"):
        read_nsys_sqlite(db, step=0)
    with pytest.raises(TraceError, match="needs --step"):
        read_nsys_sqlite(db, nvtx_range="fwd")
    db2 = nsys_db(tmp_path / "r2.sqlite")
    with pytest.raises(TraceError, match=r"no NVTX range ProfilerStep#5 \(the report's: ProfilerStep#0, ProfilerStep#1"):
        read_nsys_sqlite(db2, step=5)
    with pytest.raises(TraceError, match="'fwd' #2: the report has 2 such range"):
        read_nsys_sqlite(db2, step=2, nvtx_range="fwd")
    text = tmp_path / "notdb.sqlite"
    text.write_text("{}")
    with pytest.raises(TraceError, match="not an SQLite database: export the report"):
        read_nsys_sqlite(text)
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).executescript("CREATE TABLE StringIds (id INTEGER, value TEXT);")
    with pytest.raises(TraceError, match="no CUPTI_ACTIVITY_KIND_KERNEL table"):
        read_nsys_sqlite(empty)
    bad = nsys_db(tmp_path / "bad.sqlite")
    con = sqlite3.connect(bad)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = 0 WHERE start = 1000")
    con.commit()
    con.close()
    with pytest.raises(TraceError, match="ends .* before it starts"):
        read_nsys_sqlite(bad)
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bad.sqlite", "empty.sqlite", "notdb.sqlite", "r2.sqlite", "report.sqlite"]


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0,
                    reason="root reads a read-only folder's files anyway")
def test_nsys_export_in_a_read_only_folder_is_read(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    db = nsys_db(d / "report.sqlite")
    d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert len(read_nsys_sqlite(db).kernels) == 3
    finally:
        d.chmod(stat.S_IRWXU)


def test_reading_an_export_writes_nothing_beside_it(tmp_path):
    # opened immutable: no journal, WAL or lock file appears beside it (a shared folder, or
    # another user's, is left as it was)
    db = nsys_db(tmp_path / "report.sqlite")
    read_nsys_sqlite(db, step=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.sqlite"]


def test_import_nsys_end_to_end(tmp_path, capsys):
    from execution.workload_models import WorkloadFile

    db = nsys_db(tmp_path / "report.sqlite")
    out = tmp_path / "step.json"
    assert main(["import", "nsys", str(db), "-o", str(out), "--step", "0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"nsys: {db}, ProfilerStep#0")
    assert "kernels     2 (1 memory copies/fills) on 1 device(s)" in text
    doc = json.loads(out.read_text())
    validate(WorkloadFile, content(str(out), doc, "workload")[1], str(out))
    assert "imported by ecal import nsys" in doc["description"]
    assert main(["import", "nsys", str(tmp_path / "none.sqlite"), "-o", str(out)]) == 2
    assert "none.sqlite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["import", "nsys", "--help"])
    assert e.value.code == 0
    assert "--nvtx-range" in capsys.readouterr().out
