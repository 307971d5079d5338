"""Resume is faithful: an interrupted-and-resumed sweep equals an uninterrupted one bit for bit;
results files carry the measurement's identity and refuse another; one writer per file.

Faults are injected into the real code: a progress callback or a device call raising
KeyboardInterrupt, a fork child SIGKILLed in the middle of writing a record, a fork child
holding the results file while a second sweep starts, and the CLI interrupted by SIGINT.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frontier.errors import EnergyCalculusError, FormatError
from frontier.pareto import signature_to_dict
from measure import Protocol, SimulatedGPU, characterize, preset, sweep
from measure.locks import LockedError
from measure.results_log import ResultsLog, ResultsMismatchError, point_key
from measure.sim import with_spec

FAST = Protocol(window_s=0.3, min_windows=2, max_windows=3, warmup_s=0.05, ready_windows=1)
GRID = "sm_clock_mhz=1980:1500:-120,power_limit_w=700,500"      # 10 points, 2 ω_dev caps
SEED = 11
ROOT = Path(__file__).resolve().parents[1]


def _kernel():
    return preset("gemm_bf16_8192")


def _run(path=None, progress=None, device=None, grid=GRID, protocol=FAST, element="gemm", works=None):
    return sweep(device or SimulatedGPU(seed=SEED), works or {None: _kernel()}, element, grid=grid,
                 protocol=protocol, results_path=None if path is None else str(path), progress=progress)


def _dicts(res):
    return [signature_to_dict(s) for s in res.signatures]


@pytest.fixture(scope="module")
def uninterrupted():
    return _run()


def _assert_same(res, ref):
    assert _dicts(res) == _dicts(ref)       # every field: T, E, d, variances, ω, κ, name, meta
    assert [s.key for s in res.signatures] == [s.key for s in ref.signatures]
    assert [s.energy_j for s in res.signatures] == [s.energy_j for s in ref.signatures]
    from measure.characterize import frontier_of

    assert ([s.key for s in frontier_of(res.signatures).points]
            == [s.key for s in frontier_of(ref.signatures).points])


class _Stop(BaseException):
    pass


def _stop_after(k):
    """A progress callback that interrupts the sweep after its k-th newly measured point."""
    seen = []

    def cb(p):
        if p.measured:
            seen.append(p)
            if len(seen) == k:
                raise KeyboardInterrupt
    return cb


@pytest.mark.parametrize("cuts", [(1,), (3, 2, 4), (9,)])
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, uninterrupted, cuts):
    path = tmp_path / "r.jsonl"
    for k in cuts:
        with pytest.raises(KeyboardInterrupt):
            _run(path, _stop_after(k))
    res = _run(path)
    assert res.resumed == sum(cuts) and res.measured == 10 - sum(cuts)
    _assert_same(res, uninterrupted)
    assert {s.name for s in res.signatures} == {"gemm"}
    # a resume that measures nothing returns the same again
    _assert_same(_run(path), uninterrupted)


class _InterruptAt(SimulatedGPU):
    """Ctrl-C inside the n-th run of work (mid-point: that point is lost, then re-measured)."""

    def __init__(self, n, **kw):
        super().__init__(**kw)
        self.n_runs, self.at = 0, n

    def _run(self, *args):     # under run() and run_and_read()
        self.n_runs += 1
        if self.n_runs == self.at:
            raise KeyboardInterrupt
        super()._run(*args)


def test_interrupt_inside_a_point_then_resume_equals_uninterrupted(tmp_path, uninterrupted):
    path = tmp_path / "r.jsonl"
    for at in (17, 30):   # a sweep makes 70 runs
        with pytest.raises(KeyboardInterrupt):
            _run(path, device=_InterruptAt(at, seed=SEED))
    done = ResultsLog(path).points
    assert 0 < len(done) < 10
    _assert_same(_run(path), uninterrupted)


def _kill_mid_write(path, k, kind="point"):
    """Fork a sweep that is SIGKILLed halfway through writing its k-th ``kind`` record."""
    pid = os.fork()
    if pid == 0:
        try:
            n = [0]
            real = ResultsLog._append

            def torn(self, rec):
                if rec.get("kind") == kind:
                    n[0] += 1
                    if n[0] == k:
                        line = json.dumps(rec) + "\n"
                        with open(self.path, "a", encoding="utf-8") as fh:
                            fh.write(line[: len(line) // 2])
                            fh.flush()
                            os.fsync(fh.fileno())
                        os.kill(os.getpid(), signal.SIGKILL)
                return real(self, rec)

            ResultsLog._append = torn
            _run(path)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_kill_mid_write_leaves_a_torn_line_and_still_resumes_faithfully(tmp_path, uninterrupted):
    path = tmp_path / "r.jsonl"
    _kill_mid_write(path, 4)
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] and not lines[-1].endswith(b"}")            # the torn record is there
    assert sum(b'"point"' in x for x in lines[:-1]) == 3
    res = _run(path)
    assert res.meta["dropped_partial_line"] is True and res.resumed == 3 and res.measured == 7
    _assert_same(res, uninterrupted)
    keys = [json.loads(x)["key"] for x in path.read_text().splitlines() if '"point"' in x]
    assert len(keys) == len(set(keys)) == 10


def test_resumed_points_keep_their_name_kappa_and_meta(tmp_path):
    works = {"flash": preset("attention_flash"), "cudnn": preset("attention_cudnn")}
    path = tmp_path / "r.jsonl"
    grid = "sm_clock_mhz=1980,1500"
    with pytest.raises(KeyboardInterrupt):
        _run(path, _stop_after(2), works=works, element="attention", grid=grid)
    res = _run(path, works=works, element="attention", grid=grid)
    ref = _run(works=works, element="attention", grid=grid)
    _assert_same(res, ref)
    assert [s.name for s in res.signatures] == ["attention"] * 4
    assert [s.kappa for s in res.signatures] == ["flash", "cudnn"] * 2
    # every record names its element: `ecal frontier` sees one element
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert {r["signature"]["name"] for r in recs if r["kind"] == "point"} == {"attention"}


def test_grid_change_resumes_the_shared_points_and_measures_the_rest(tmp_path, uninterrupted):
    path = tmp_path / "r.jsonl"
    _run(path, grid="sm_clock_mhz=1980,1740,power_limit_w=700")
    res = _run(path)
    assert res.resumed == 2 and res.measured == 8
    # equal to the uninterrupted sweep except for the grid each point was measured in
    strip = [{**d, "meta": {k: v for k, v in d["meta"].items() if k != "grid"}} for d in _dicts(res)]
    ref = [{**d, "meta": {k: v for k, v in d["meta"].items() if k != "grid"}} for d in _dicts(uninterrupted)]
    assert strip == ref


def test_header_records_identity(tmp_path):
    path = tmp_path / "r.jsonl"
    _run(path, grid="sm_clock_mhz=1980")
    head = json.loads(path.read_text().splitlines()[0])
    assert head["kind"] == "header" and head["element"] == "gemm" and head["kappas"] == [None]
    assert head["device"]["device"] == "simulated H200" and head["device"]["uuid"] == "SIM-H200"
    assert head["device"]["driver"] == "simulator" and head["device"]["seed"] == SEED
    assert head["protocol"] == json.loads(json.dumps(FAST.to_dict()))
    assert head["grid"] == {"sm_clock_mhz": [1980.0]} and head["host"]


class _OtherCard(SimulatedGPU):
    def __init__(self, field, value, **kw):
        super().__init__(**kw)
        self.field, self.value = field, value

    def describe(self):
        return {**super().describe(), self.field: self.value}


@pytest.mark.parametrize("change, field, found, ours", [
    (dict(device=SimulatedGPU(seed=SEED + 1)), "device.seed", SEED, SEED + 1),
    (dict(device=SimulatedGPU(seed=SEED, spec=with_spec(name="H100"))), "device.device",
     "simulated H200", "simulated H100"),
    (dict(device=_OtherCard("uuid", "SIM-OTHER", seed=SEED)), "device.uuid", "SIM-H200", "SIM-OTHER"),
    (dict(device=_OtherCard("driver", "570.1", seed=SEED)), "device.driver", "simulator", "570.1"),
    (dict(protocol=Protocol(**{**FAST.to_dict(), "target_rse": 0.02})), "protocol.target_rse", 0.01, 0.02),
    (dict(element="other"), "element", "gemm", "other"),
])
def test_resume_with_another_gpu_seed_protocol_or_element_is_refused(tmp_path, change, field, found, ours):
    path = tmp_path / "r.jsonl"
    _run(path, grid="sm_clock_mhz=1980")
    before = path.read_bytes()
    with pytest.raises(ResultsMismatchError) as ei:
        _run(path, grid="sm_clock_mhz=1980,1860", **change)
    e = ei.value
    assert isinstance(e, EnergyCalculusError)            # the CLI exits 2
    assert (e.file, e.field, e.found, e.this_run) == (str(path), field, found, ours)
    msg = str(e)
    assert str(path) in msg and field in msg and repr(found) in msg and repr(ours) in msg
    assert "another results file" in msg
    assert path.read_bytes() == before                   # nothing written


def test_old_results_file_without_identity_or_names_is_resumed(tmp_path, uninterrupted):
    """Files from before the identity fields: checked on what they record; names come back."""
    path = tmp_path / "old.jsonl"
    full = _run(path, grid="sm_clock_mhz=1980,1860,power_limit_w=700")
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    head = recs[0]
    for k in ("format", "version", "host"):
        head.pop(k, None)                   # "version": only beside the older format name
    head["device"] = {k: head["device"][k] for k in ("device", "simulated", "read_only", "seed_model")}
    head["protocol"].pop("poll_s")          # a setting added later: counts as its default
    for r in recs:
        if r["kind"] == "point":
            r["signature"].pop("name")      # what the old writer (frontier.io's codec) left out
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = _run(path, grid="sm_clock_mhz=1980,1860,power_limit_w=700", device=SimulatedGPU(seed=SEED + 5))
    assert res.resumed == 2 and res.measured == 0
    assert [s.name for s in res.signatures] == ["gemm", "gemm"]
    assert _dicts(res) == _dicts(full)
    with pytest.raises(ResultsMismatchError, match="device.device"):
        _run(path, device=SimulatedGPU(spec=with_spec(name="H100")))
    with pytest.raises(ResultsMismatchError, match="protocol.poll_s"):
        _run(path, protocol=Protocol(**{**FAST.to_dict(), "poll_s": 0.01}))


@contextlib.contextmanager
def _holding(path):
    """A fork child sweeping into ``path``, paused after two points with its locks held;
    yields its PID, then lets it finish and checks it exited 0."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(ready_r)
            os.close(go_w)

            def hold(p):
                if p.done == 2:         # two points written, the sweep (and its lock) still on
                    os.write(ready_w, b"x")
                    os.read(go_r, 1)
            _run(path, hold)
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(go_r)
    try:
        assert os.read(ready_r, 1) == b"x"
        yield pid
    finally:
        os.write(go_w, b"x")
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _assert_one_sweep(path):
    recs = [json.loads(x) for x in Path(path).read_text().splitlines()]
    keys = [r["key"] for r in recs if r["kind"] == "point"]
    assert [r["kind"] for r in recs].count("header") == 1 and len(keys) == len(set(keys)) == 10


def test_a_second_concurrent_sweep_on_one_results_file_is_refused(tmp_path):
    path = tmp_path / "r.jsonl"
    with _holding(path) as pid:
        before = path.read_bytes()
        with pytest.raises(LockedError, match=f"process {pid}") as ei:
            characterize(_kernel(), device=SimulatedGPU(seed=SEED), grid=GRID, results_path=str(path),
                         protocol=FAST, name="gemm", progress=None)
        assert ei.value.holder_pid == pid and str(path) in str(ei.value)
        assert path.read_bytes() == before          # the second run read, wrote, truncated nothing
    _assert_one_sweep(path)
    # the lock went with the holder: the file can be resumed now
    assert _run(path).resumed == 10


def _alias(tmp_path, path, how):
    if how == "symlink":
        alias = tmp_path / "link.jsonl"
        alias.symlink_to(path)
    else:
        folder = tmp_path / ("elsewhere" if how == "hard link in another folder" else ".")
        folder.mkdir(exist_ok=True)
        alias = folder / "hard.jsonl"
        os.link(path, alias)
    return alias


@pytest.mark.parametrize("how", ["symlink", "hard link", "hard link in another folder"])
def test_a_second_sweep_through_another_name_of_the_file_is_refused(tmp_path, how):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"")              # an empty file is a new results file (and can be linked)
    alias = _alias(tmp_path, path, how)
    with _holding(path) as pid:
        before = path.read_bytes()
        assert before.count(b"\"kind\": \"point\"") == 2
        with pytest.raises(LockedError, match=f"process {pid}") as ei:
            _run(alias)
        assert ei.value.holder_pid == pid and str(alias) in str(ei.value)
        assert path.read_bytes() == before
    _assert_one_sweep(path)
    assert _run(alias).resumed == 10


def test_a_sweep_through_a_symlink_holds_the_real_files_lock(tmp_path):
    path = tmp_path / "r.jsonl"
    _alias(tmp_path, path, "symlink")            # dangling: the sweep creates its target
    with _holding(tmp_path / "link.jsonl") as pid:
        with pytest.raises(LockedError, match=f"process {pid}"):
            _run(path)
        assert Path(f"{os.path.realpath(path)}.lock").exists()
        assert not (tmp_path / "link.jsonl.lock").exists()    # the lock is the real file's
    _assert_one_sweep(path)


# -- files that are not ours are never changed -------------------------------------------------------

def _gz():
    import gzip

    return gzip.compress(b"my notes\n" * 50, mtime=0)


NOT_OURS = {
    "a note with no newline": b"my precious notes, no newline",
    "a gzip file": _gz(),
    "NUL bytes and a newline": b"\x00\x01\x02\nabc\n",
    "invalid UTF-8 and a newline": b'{"kind": "header", "format": "energy-calculus/results"}\xff\n',
    "text": b"notes\nmore notes\n",
    "JSON lines of another tool": b'{"a": 1}\n{"a": 2}\n',
    "another tool's header": b'{"kind": "header", "format": "other/results"}\n',
    "a record but no header": b'{"kind": "ready", "omega_dev": "{}", "ready_power_w": 1.0}\n',
    "blank lines only": b"\n\n",
    "a torn record with no header": b'{"kind": "point", "key": "[',
    "a JSON header with no newline, not ours": b'{"kind": "header", "format": "other"}',
    "whitespace with no newline": b"   ",
}


@pytest.mark.parametrize("content", NOT_OURS.values(), ids=NOT_OURS.keys())
def test_a_file_that_is_not_a_results_file_is_refused_and_left_unchanged(tmp_path, content):
    path = tmp_path / "r.jsonl"
    path.write_bytes(content)
    with pytest.raises(FormatError) as ei:
        _run(path, grid="sm_clock_mhz=1980")
    assert isinstance(ei.value, EnergyCalculusError) and ei.value.file == str(path)
    msg = str(ei.value)
    assert str(path) in msg
    assert ("not an energy-calculus results file" in msg and "refusing to change it" in msg
            or "invalid JSON" in msg)
    assert path.read_bytes() == content
    assert sorted(os.listdir(tmp_path)) == ["r.jsonl"]       # no lock file left beside it
    with pytest.raises(FormatError):
        ResultsLog(path)                            # the reader refuses it too
    assert path.read_bytes() == content


def test_binary_and_foreign_files_get_the_not_ours_message(tmp_path):
    for name in ("a note with no newline", "a gzip file", "NUL bytes and a newline",
                 "invalid UTF-8 and a newline", "another tool's header", "a record but no header"):
        path = tmp_path / "r.jsonl"
        path.write_bytes(NOT_OURS[name])
        with pytest.raises(FormatError, match="not an energy-calculus results file.*refusing to "
                                              "change it"):
            _run(path, grid="sm_clock_mhz=1980")


@pytest.mark.parametrize("tail", [b"\x00\x00\x00", b"\xff\xfe", b"notes", b"\t{\"kind\": "])
def test_a_tail_that_no_kill_of_ours_leaves_is_refused_on_our_file(tmp_path, tail):
    path = tmp_path / "r.jsonl"
    _run(path, grid="sm_clock_mhz=1980")
    path.write_bytes(path.read_bytes() + tail)
    before = path.read_bytes()
    with pytest.raises(FormatError, match="line 4: an incomplete last line that is not a record"):
        _run(path, grid="sm_clock_mhz=1980")
    assert path.read_bytes() == before


def test_a_complete_invalid_last_line_is_an_error_not_dropped(tmp_path):
    path = tmp_path / "r.jsonl"
    _run(path, grid="sm_clock_mhz=1980")
    path.write_bytes(path.read_bytes() + b'{"kind": "point", "ke\n')
    before = path.read_bytes()
    with pytest.raises(FormatError, match="line 4: invalid JSON"):
        _run(path, grid="sm_clock_mhz=1980")
    assert path.read_bytes() == before


def test_cli_refuses_a_file_that_is_not_ours_with_exit_2(tmp_path, monkeypatch, capsys):
    from ecal.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ECAL_STATE_DIR", str(tmp_path / "state"))
    for name, content in (("nn.txt", NOT_OURS["a note with no newline"]), ("n.gz", _gz())):
        Path(name).write_bytes(content)
        assert main(["characterize", "gemm_bf16_8192", "--grid", "sm_clock_mhz=1980",
                     "--results", name]) == 2
        err = capsys.readouterr().err
        assert f"{name}: content: not an energy-calculus results file" in err, err
        assert "refusing to change it" in err and len(err.strip().splitlines()) == 1
        assert Path(name).read_bytes() == content


def test_an_empty_existing_file_is_a_new_results_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"")
    res = _run(path, grid="sm_clock_mhz=1980")
    assert res.measured == 1 and res.meta["dropped_partial_line"] is False
    assert json.loads(path.read_text().splitlines()[0])["format"] == "ecal.results/2"


@pytest.mark.parametrize("cut", [1, 5, 30, 60, -1])
def test_a_kill_during_the_first_write_leaves_a_header_prefix_that_is_dropped(tmp_path, cut):
    path = tmp_path / "r.jsonl"
    ref = tmp_path / "ref.jsonl"
    _run(ref, grid="sm_clock_mhz=1980")
    head = ref.read_bytes().split(b"\n")[0]          # the header line as we write it, no newline
    path.write_bytes(head[:cut] if cut > 0 else head)
    assert ResultsLog(path).dropped_partial_line is True
    assert path.read_bytes() == (head[:cut] if cut > 0 else head)   # the reader changes nothing
    res = _run(path, grid="sm_clock_mhz=1980")
    assert res.meta["dropped_partial_line"] is True and res.measured == 1
    assert path.read_bytes().split(b"\n")[0] == head
    _assert_same(res, _run(grid="sm_clock_mhz=1980"))


def test_kill_in_the_first_write_of_a_real_sweep_then_resume_equals_uninterrupted(tmp_path, uninterrupted):
    path = tmp_path / "r.jsonl"
    _kill_mid_write(path, 1, kind="header")
    data = path.read_bytes()
    assert data and b"\n" not in data                 # a header prefix, nothing else
    res = _run(path)
    assert res.meta["dropped_partial_line"] is True and res.measured == 10
    _assert_same(res, uninterrupted)


def test_point_keys_are_stable():
    from frontier.operating_point import OperatingPoint

    # keys of files written before this change must still match
    assert point_key("gemm", None, OperatingPoint(1980.0, None, 700.0)) == (
        '["gemm", null, {"mem_clock_mhz": null, "power_limit_w": 700.0, "sm_clock_mhz": 1980.0, '
        '"sm_count": null}]')


# -- the CLI, as a user runs it --------------------------------------------------------------------

CLI_ARGS = ["characterize", "gemm_bf16_8192", "--grid", GRID, "--results", "r.jsonl", "-o", "out.json"]

# Runs `python -m ecal ...` with one injected fault: after K measured points, the next point
# announces itself (a marker file) and waits, so that the test's SIGINT lands inside a point.
_PAUSING = """
import os, runpy, sys, time
import measure.sweep
sw = sys.modules["measure.sweep"]     # (the package re-exports the function under that name)
k, marker = int(sys.argv[1]), sys.argv[2]
real, n = sw.measure_point, [0]
def pausing(*a, **kw):
    n[0] += 1
    if n[0] == k + 1:
        open(marker, "w").close()
        time.sleep(60)
    return real(*a, **kw)
sw.measure_point = pausing
sys.argv = ["ecal"] + sys.argv[3:]
runpy.run_module("ecal", run_name="__main__", alter_sys=True)
"""


def _cli(cwd, *pre):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ECAL_STATE_DIR": str(cwd / "state")}
    return subprocess.Popen([sys.executable, *pre, *CLI_ARGS], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_cli_characterize_interrupted_by_sigint_then_rerun_equals_uninterrupted(tmp_path):
    a, b = tmp_path / "uninterrupted", tmp_path / "interrupted"
    a.mkdir()
    b.mkdir()
    ref = _cli(a, "-m", "ecal")
    marker = b / "paused"
    p = _cli(b, "-c", _PAUSING, "4", str(marker))
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "the sweep never reached its 5th point"
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert not (b / "out.json").exists()
    assert len(ResultsLog(b / "r.jsonl").points) == 4
    again = _cli(b, "-m", "ecal")
    out2, err2 = again.communicate(timeout=120)
    assert again.returncode == 0, err2
    assert err2.count("resumed") == 4 and err2.count(" measured ") == 6
    out1, err1 = ref.communicate(timeout=120)
    assert ref.returncode == 0, err1
    assert (b / "out.json").read_bytes() == (a / "out.json").read_bytes()
    assert out1 == out2
    # and `ecal frontier` on it sees one element
    fr = subprocess.run([sys.executable, "-m", "ecal", "frontier", "out.json", "--json"], cwd=b,
                        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                        timeout=60)
    assert fr.returncode == 0, fr.stderr
    assert list(json.loads(fr.stdout)) == ["gemm_bf16_8192"]


def test_cli_resume_with_another_seed_or_target_rse_exits_2(tmp_path, monkeypatch, capsys):
    from ecal.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ECAL_STATE_DIR", str(tmp_path / "state"))
    args = ["characterize", "copy_2GiB", "--grid", "sm_clock_mhz=1980", "--results", "r.jsonl", "--json"]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--seed", "1"]) == 2
    assert "device.seed is 0 in this results file but 1 in this run" in capsys.readouterr().err
    assert main([*args, "--target-rse", "0.02"]) == 2
    assert "protocol.target_rse" in capsys.readouterr().err


def test_resume_on_another_card_of_the_same_model_is_refused(tmp_path, monkeypatch):
    from measure import NVMLDevice
    from tests.fake_pynvml import FakeGPU, make_fake_pynvml

    monkeypatch.setenv("ECAL_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "r.jsonl"
    cards = []
    for _ in range(2):
        fake = make_fake_pynvml(FakeGPU())
        dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
        cards.append((dev, fake))
    try:
        (a, fa), (b, fb) = cards
        assert a.describe()["device"] == b.describe()["device"] and a.uuid != b.uuid
        sweep(a, {None: lambda: fa.busy(0.003, 400.0)}, "w", protocol=FAST, results_path=str(path),
              progress=None)
        assert json.loads(path.read_text().splitlines()[0])["device"]["uuid"] == a.uuid
        with pytest.raises(ResultsMismatchError, match="device.uuid") as ei:
            sweep(b, {None: lambda: fb.busy(0.003, 400.0)}, "w", protocol=FAST, results_path=str(path),
                  progress=None)
        assert (ei.value.found, ei.value.this_run) == (a.uuid, b.uuid)
        assert sweep(a, {None: lambda: fa.busy(0.003, 400.0)}, "w", protocol=FAST,
                     results_path=str(path), progress=None).resumed == 1
    finally:
        for dev, _ in cards:
            dev.close()
