"""Nothing mixed or lost on a shared, failing machine (issue 27, part B): results logs, the
SQLite store and output files.

* a results log has exactly one header: two logs joined with ``cat`` (two headers, different
  seeds) or a point of another element is refused with the line, on resume and in ``ecal store
  import``, and the file is left byte for byte;
* every number entering the store is finite (``energy_j`` = s·T + d overflowing included); a
  stored row that cannot be decoded is skipped with an ``ecal: warning:`` line naming it and
  the good rows are still read;
* SQLite errors (a damaged page, a full disk) are one line naming the store, exit 2, in
  ``ecal store``, ``ecal frontier STORE`` and ``ecal campaign`` (real CLI, child processes);
* disk errors (ENOSPC, EROFS, EACCES) name the file;
* ``-o`` and ``--results`` never write through a symlink another user planted, nor into
  another user's file (run as root: the links are ``lchown``-ed to ``nobody``);
* an existing ``data.jsonl.lock`` with content that is not ours is left untouched.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_bad_input import assert_one_line, cli
from test_campaign import ROOT, write_campaign
from test_store_cli import FAST, _contents, _integrity

import measure.results_log as rl
from ecal.cli import _error_line
from frontier.errors import FormatError
from frontier.files import UnsafePathError, atomic_write, check_own_path
from frontier.io import save_signatures
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature
from measure.results_log import ResultsLog
from measure.store import ResultsStore, StoreError

GEMM = "gemm_bf16_8192"
GRID = "sm_clock_mhz=1980,1500"
#: Another user than the test's (as root, links and files are handed to ``nobody``).
OTHER_UID = 65534
ROOT_ONLY = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                               reason="planting a file owned by another user needs root")


def _characterize(capsys, results, *, seed=0, element=GEMM, grid=GRID, extra=()):
    """``ecal characterize`` on the simulator in-process: (exit code, stderr lines)."""
    return cli(capsys, "characterize", element, "--grid", grid, *FAST, "--seed", str(seed),
               "--results", str(results), *extra)


def _ecal(cwd, *args, pre=("-m", "ecal")):
    """The real CLI in a child process: (exit code, stdout, stderr lines)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, *pre, *map(str, args)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, [ln for ln in p.stderr.splitlines() if ln.strip()]


def _stamp(path):
    """What 'untouched' compares: the bytes and the modification time."""
    st = os.lstat(path)
    return Path(path).read_bytes(), st.st_mtime_ns


def _old(path):
    """Give ``path`` an mtime in the past, so a rewrite within the same second shows."""
    os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))


# -- one header --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """Results logs of the simulator: gemm with seed 0 and seed 1, copy with seed 0."""
    from ecal.cli import main

    d = tmp_path_factory.mktemp("logs")
    for name, element, seed in (("a", GEMM, 0), ("b", GEMM, 1), ("c", "copy_2GiB", 0)):
        assert main(["characterize", element, "--grid", GRID, *FAST, "--seed", str(seed),
                     "--results", str(d / f"{name}.jsonl")]) == 0
    return d


def test_two_results_logs_joined_are_refused_on_resume_and_import_and_left_unchanged(
        tmp_path, logs, capsys):
    a, b = (logs / "a.jsonl").read_bytes(), (logs / "b.jsonl").read_bytes()
    joined = tmp_path / "joined.jsonl"
    joined.write_bytes(a + b)
    _old(joined)
    before = _stamp(joined)
    second = a.count(b"\n") + 1
    for seed in (0, 1):            # whichever measurement the resume claims to be
        rc, err = _characterize(capsys, joined, seed=seed)
        assert_one_line(rc, err, f"{joined}: line {second}", "second header")
        assert _stamp(joined) == before
    assert not Path(f"{joined}.lock").exists()          # nothing left beside it
    store = tmp_path / "s.sqlite"
    rc, err = cli(capsys, "store", "import", str(store), str(joined))
    assert_one_line(rc, err, f"{joined}: line {second}", "second header")
    assert not store.exists() and _stamp(joined) == before
    with pytest.raises(FormatError) as e:
        ResultsLog(joined)
    assert (e.value.file, e.value.path) == (str(joined), f"line {second}")


def test_a_point_of_another_element_is_refused_with_its_line(tmp_path, logs, capsys):
    a = (logs / "a.jsonl").read_bytes().splitlines(keepends=True)
    alien = next(ln for ln in (logs / "c.jsonl").read_bytes().splitlines(keepends=True)
                 if b'"kind": "point"' in ln)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"".join(a[:2]) + alien + b"".join(a[2:]))
    before = _stamp(mixed)
    rc, err = _characterize(capsys, mixed)
    assert_one_line(rc, err, f"{mixed}: line 3.key", "'copy_2GiB'", GEMM)
    rc, err = cli(capsys, "store", "import", str(tmp_path / "s.sqlite"), str(mixed))
    assert_one_line(rc, err, f"{mixed}: line 3.key")
    assert _stamp(mixed) == before


def test_a_resume_on_another_host_is_accepted_as_documented(tmp_path, logs, capsys):
    """docs/guarantees.md and the results-log docstring agree: the host is recorded, not
    checked (the GPU's UUID identifies the card; a simulator's results do not depend on it)."""
    lines = (logs / "a.jsonl").read_text().splitlines(keepends=True)
    head = json.loads(lines[0])
    head["host"] = "another-node"
    moved = tmp_path / "moved.jsonl"
    moved.write_text(json.dumps(head) + "\n" + "".join(lines[1:]))
    before = moved.read_bytes()
    rc, err = _characterize(capsys, moved)
    assert rc == 0, err
    assert moved.read_bytes() == before          # every point resumed, nothing measured again
    assert ResultsLog(moved).header["host"] == "another-node"


# -- finite numbers in, undecodable rows skipped ----------------------------------------------

def _sig(clock, t=1.0, d=5.0):
    return Signature("g", s_w=100.0, time_s=t, d_j=d, omega=OperatingPoint(sm_clock_mhz=clock))


def test_an_overflowing_signature_is_refused_at_import_and_nothing_is_added(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    good = tmp_path / "good.json"
    save_signatures(good, {"g@1410": _sig(1410), "g@1500": _sig(1500, 0.8, 9.0)})
    assert cli(capsys, "store", "import", str(store), str(good), "--gpu-model", "V100")[0] == 0
    before = _contents(store)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": 1, "units": {"time": "s", "energy": "J", "power": "W"},
                               "signatures": {
                                   "g@1600": {"s_w": 100.0, "time_s": 0.7, "d_j": 11.0,
                                              "omega": {"sm_clock_mhz": 1600}},
                                   "g@1700": {"s_w": 100.0, "time_s": 1e308, "d_j": 1e308,
                                              "omega": {"sm_clock_mhz": 1700}}}}))
    rc, err = cli(capsys, "store", "import", str(store), str(bad), "--gpu-model", "V100")
    assert_one_line(rc, err, f"{bad}: signatures.g@1700", "energy_j is inf", "overflows")
    assert _contents(store) == before                 # all or nothing: g@1600 is not added either
    # the store refuses it through the library too
    with ResultsStore(store) as st, pytest.raises(StoreError, match="energy_j is inf"):
        st.add(_sig(1800, 1e308, 1e308), gpu_model="V100")
    assert _contents(store) == before


def _plant_bad_rows(store):
    """An 'old store' row whose energy was stored as null (what the overflow used to leave),
    and a damaged row whose signature text is not UTF-8. Returns their row ids."""
    db = sqlite3.connect(store)
    try:
        rid = db.execute("SELECT id FROM signatures WHERE omega LIKE '%1500%'").fetchone()[0]
        body = json.loads(db.execute("SELECT signature FROM signatures WHERE id = ?",
                                     (rid,)).fetchone()[0])
        body["energy_j"] = None
        db.execute("UPDATE signatures SET signature = ? WHERE id = ?", (json.dumps(body), rid))
        cur = db.execute(
            "INSERT INTO signatures (element, kappa, theta, omega, gpu_model, uuid, driver, "
            "protocol, host, time_s, energy_j, signature, stored_at_s) VALUES ('g', '', '', "
            "'{\"sm_clock_mhz\":1600.0}', 'V100', 'u', 'd', 'p', 'h', 1, 1, "
            "CAST(X'7B226E616D65223AFF' AS TEXT), 0)")
        db.commit()
        return rid, cur.lastrowid
    finally:
        db.close()


def test_a_row_that_fails_to_decode_is_skipped_with_a_warning_and_the_rest_is_read(tmp_path):
    store = tmp_path / "s.sqlite"
    with ResultsStore(store) as st:
        for c, t, d in ((1410, 1.0, 5.0), (1500, 0.8, 9.0), (1980, 0.6, 30.0)):
            st.add(_sig(c, t, d), gpu_model="V100")
    old, damaged = _plant_bad_rows(store)
    rc, out, err = _ecal(tmp_path, "frontier", store, "--gpu-model", "V100", "--json")
    assert rc == 0, err
    assert len(json.loads(out)["g"]["points"]) >= 1
    for rid in (old, damaged):
        warn = [ln for ln in err if f"row {rid} " in ln]
        assert len(warn) == 1 and warn[0].startswith(f"ecal: warning: {store}: row {rid} ("), err
        assert "skipped" in warn[0]
    assert "energy_j" in next(ln for ln in err if f"row {old} " in ln)
    rc, out, err = _ecal(tmp_path, "store", "export", store, "-o", tmp_path / "out.json")
    assert rc == 0, err
    assert sum("ecal: warning:" in ln for ln in err) == 2          # once per bad row
    doc = json.loads((tmp_path / "out.json").read_text())
    assert sorted(doc["signatures"]) == ["g@1410MHz", "g@1980MHz"]
    rc, out, err = _ecal(tmp_path, "store", "list", store)
    assert rc == 0 and "4 point(s)" in out, err


# -- SQLite errors: one line naming the store, exit 2 -------------------------------------------

def _damage(store):
    """Overwrite one page of the store, the root page of its signatures table, with garbage
    (a damaged sector): SQLite then reports 'database disk image is malformed'."""
    db = sqlite3.connect(store)
    try:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'signatures'").fetchone()[0]
    finally:
        db.close()
    with open(store, "r+b") as fh:
        fh.seek((root - 1) * size)
        fh.write(b"\xa5" * size)


@pytest.fixture
def damaged(tmp_path):
    store = tmp_path / "d.sqlite"
    with ResultsStore(store) as st:
        for c in range(300, 1300, 10):
            st.add(_sig(c, 1.0 + c / 1e4), gpu_model="V100")
    _damage(store)
    return store


@pytest.mark.parametrize("cmd", [
    ["store", "list", "{s}"],
    ["frontier", "{s}", "--gpu-model", "V100"],
    ["store", "export", "{s}", "-o", "out.json"],
    ["store", "import", "{s}", "more.json", "--gpu-model", "V100"],
])
def test_a_damaged_store_is_one_line_and_exit_2(tmp_path, damaged, cmd):
    save_signatures(tmp_path / "more.json", {"g@2000": _sig(2000)})
    rc, _, err = _ecal(tmp_path, *[c.format(s=damaged) for c in cmd])
    assert_one_line(rc, err, f"ecal {cmd[0]}: error: {damaged}:", "malformed")
    assert not (tmp_path / "out.json").exists()


def test_a_campaign_on_a_damaged_store_is_one_line_and_exit_2(tmp_path, damaged):
    camp = write_campaign(tmp_path / "c.json", elements=["copy_2GiB"])
    env_state = tmp_path / "state"
    rc, _, err = _ecal(tmp_path, "campaign", camp, "--store", damaged, "--gpus", "1", "--quiet",
                       pre=("-c", _WITH_STATE.format(state=str(env_state))))
    assert_one_line(rc, err, f"ecal campaign: error: {damaged}:", "malformed")


#: ``python -m ecal`` with ECAL_STATE_DIR set (a campaign's workers open the simulated GPU).
_WITH_STATE = """
import os, runpy, sys
os.environ["ECAL_STATE_DIR"] = {state!r}
sys.argv = ["ecal"] + sys.argv[1:]
runpy.run_module("ecal", run_name="__main__", alter_sys=True)
"""

#: ``python -m ecal`` on a full disk: every SQLite connection may not grow the database past
#: the pages it has when opened (``PRAGMA max_page_count``), so the first write that needs a
#: new page fails with SQLITE_FULL, "database or disk is full", exactly as on a full disk.
_FULL_DISK = """
import os, runpy, sqlite3, sys
os.environ["ECAL_STATE_DIR"] = {state!r}
real = sqlite3.connect
def connect(*a, **k):
    db = real(*a, **k)
    n = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {{max(n, 1)}}")
    return db
sqlite3.connect = connect
sys.argv = ["ecal"] + sys.argv[1:]
runpy.run_module("ecal", run_name="__main__", alter_sys=True)
"""


def test_a_full_disk_is_one_line_and_exit_2_and_the_store_keeps_what_it_held(tmp_path):
    """A full disk is simulated in the child by ``PRAGMA max_page_count`` on every connection
    (see ``_FULL_DISK``): SQLite's own SQLITE_FULL, raised where a real full disk raises it."""
    store = tmp_path / "f.sqlite"
    with ResultsStore(store) as st:
        st.add(_sig(1410), gpu_model="V100")
    before = _contents(store)
    big = tmp_path / "big.json"
    save_signatures(big, {f"g@{c}": _sig(c) for c in range(300, 1300)})
    full = ("-c", _FULL_DISK.format(state=str(tmp_path / "state")))
    rc, _, err = _ecal(tmp_path, "store", "import", store, big, "--gpu-model", "V100", pre=full)
    assert_one_line(rc, err, f"ecal store: error: {store}:", "database or disk is full")
    assert _contents(store) == before and _integrity(store) == "ok"
    camp = write_campaign(tmp_path / "c.json", elements=["copy_2GiB", "gemm_bf16_4096"])
    rc, _, err = _ecal(tmp_path, "campaign", camp, "--store", store, "--gpus", "1", "--quiet",
                       pre=full)
    assert_one_line(rc, err, f"ecal campaign: error: {store}:", "database or disk is full")
    assert _integrity(store) == "ok"


def test_store_errors_name_the_store_in_the_library(tmp_path, damaged):
    with pytest.raises(StoreError, match=f"^{damaged}: .*malformed"):
        with ResultsStore(damaged) as st:
            st.rows()


# -- disk errors name the file ------------------------------------------------------------------

DISK_ERRORS = [(errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system"),
               (errno.EACCES, "Permission denied")]


@pytest.mark.parametrize("code, text", DISK_ERRORS)
def test_atomic_write_names_the_file_on_a_disk_error(tmp_path, code, text, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text("old\n")

    def full(tmp):
        with open(tmp, "w") as fh:
            fh.write("half")
        raise OSError(code, text)          # what write()/close() raise: no file name

    with pytest.raises(OSError) as e:
        atomic_write(path, full)
    assert e.value.filename == str(path) and _error_line(e.value) == f"{path}: {text}"
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["out.json"]
    # creating the temp file fails (a read-only or full folder): named too, never the temp
    import frontier.files as fio

    def no_temp(prefix, suffix, dir):
        raise OSError(code, text, os.path.join(dir, f"{prefix}x1y2{suffix}"))

    monkeypatch.setattr(fio.tempfile, "mkstemp", no_temp)
    with pytest.raises(OSError) as e:
        atomic_write(path, full)
    assert _error_line(e.value) == f"{path}: {text}"


class _FailingWrites:
    """``os`` for :mod:`measure.results_log` whose ``write`` fails with ``code`` from call
    ``at`` on, after writing half of what that call was given (a disk filling mid-record)."""

    def __init__(self, code, at):
        self.code, self.at, self.n = code, at, 0

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        self.n += 1
        if self.n >= self.at:
            if self.n == self.at:
                os.write(fd, bytes(data[:len(data) // 2]))
            raise OSError(self.code, os.strerror(self.code))
        return os.write(fd, data)


@pytest.mark.parametrize("code, text", DISK_ERRORS)
def test_a_results_log_write_that_fails_names_the_file_and_keeps_every_complete_point(
        tmp_path, logs, monkeypatch, capsys, code, text):
    path = tmp_path / "r.jsonl"
    monkeypatch.setattr(rl, "os", _FailingWrites(code, at=4))   # header, ready, point, then
    rc, err = _characterize(capsys, path, grid="sm_clock_mhz=1980,1500,1200")
    assert rc == 2 and not any("Traceback" in ln for ln in err), err
    assert err[-1] == f"ecal characterize: error: {path}: {text}"   # after the progress lines
    monkeypatch.undo()
    data = path.read_bytes()
    assert data.endswith(b"\n")                       # the half record was cut off again
    log = ResultsLog(path)
    assert not log.dropped_partial_line and len(log.points) == 1
    rc, err = _characterize(capsys, path, grid="sm_clock_mhz=1980,1500,1200")   # resumes
    assert rc == 0, err
    assert len(ResultsLog(path).points) == 3


def test_an_output_that_cannot_be_written_names_the_file(tmp_path, monkeypatch, capsys):
    import ecal.output as eo

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(eo, "_fsync_file", full)
    out = tmp_path / "plan.json"
    rc, err = cli(capsys, "plan", str(ROOT / "ecal" / "examples" / "pipeline_4x8.csv"),
                  "--deadline", "1.05x", "-o", str(out))
    assert_one_line(rc, err, f"{out}: No space left on device")
    assert not out.exists() and os.listdir(tmp_path) == []


# -- symlinks planted by another user -----------------------------------------------------------

@pytest.fixture
def planted(tmp_path):
    """A root-only secret, and a folder ``alice`` another user owns and writes."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"root's secret\n")
    os.chmod(secret, 0o600)
    _old(secret)
    alice = tmp_path / "alice"
    alice.mkdir()
    os.chown(alice, OTHER_UID, OTHER_UID)
    return secret, alice


def _link(link, target, uid):
    link.symlink_to(target)
    os.lchown(link, uid, uid)
    return link


def _signature_file(tmp_path):
    f = tmp_path / "sigs.json"
    save_signatures(f, {"g@1410": _sig(1410), "g@1500": _sig(1500, 0.8, 9.0)})
    return f


def _output_cmd(tmp_path, which, out):
    if which == "plan":
        return ["plan", str(ROOT / "ecal" / "examples" / "pipeline_4x8.csv"), "--deadline",
                "1.05x", "-o", str(out)]
    return ["frontier", str(_signature_file(tmp_path)), "-o", str(out)]


@ROOT_ONLY
@pytest.mark.parametrize("which", ["plan", "frontier"])
def test_o_through_a_link_another_user_planted_leaves_the_target_untouched(
        tmp_path, planted, capsys, which):
    secret, alice = planted
    link = _link(alice / "plan.json", secret, OTHER_UID)
    before = _stamp(secret)
    rc, err = cli(capsys, *_output_cmd(tmp_path, which, link))
    assert_one_line(rc, err, str(link), "symlink owned by another user")
    assert _stamp(secret) == before and os.stat(secret).st_mode & 0o777 == 0o600
    assert link.is_symlink() and os.readlink(link) == str(secret)


@ROOT_ONLY
@pytest.mark.parametrize("which", ["plan", "frontier"])
def test_o_through_own_link_into_another_users_file_is_refused(tmp_path, capsys, which):
    theirs = tmp_path / "theirs.json"
    theirs.write_text('{"their": "file"}\n')
    os.chown(theirs, OTHER_UID, OTHER_UID)
    _old(theirs)
    before = _stamp(theirs)
    link = tmp_path / "out.json"
    link.symlink_to(theirs)                               # the caller's own link
    rc, err = cli(capsys, *_output_cmd(tmp_path, which, link))
    assert_one_line(rc, err, str(link), "owned by another user")
    assert _stamp(theirs) == before


@ROOT_ONLY
def test_a_folder_link_another_user_planted_is_not_followed(tmp_path, planted, capsys):
    secret, alice = planted
    _link(alice / "sub", tmp_path, OTHER_UID)             # alice/sub -> the folder of secret
    before = _stamp(secret)
    rc, err = cli(capsys, *_output_cmd(tmp_path, "plan", alice / "sub" / "secret"))
    assert_one_line(rc, err, "symlink owned by another user")
    with pytest.raises(UnsafePathError):                  # the library writer refuses it too
        atomic_write(alice / "sub" / "secret", lambda tmp: Path(tmp).write_text("x"))
    assert _stamp(secret) == before


@ROOT_ONLY
@pytest.mark.parametrize("content", [b"", b"root's secret\n"])
def test_results_through_a_planted_link_are_refused_before_anything_is_written(
        tmp_path, planted, capsys, content):
    """An empty root-only file would pass for a new results file: the link is refused before
    the file is opened, locked or appended to."""
    secret, alice = planted
    secret.write_bytes(content)
    _old(secret)
    before = _stamp(secret)
    link = _link(alice / "r.jsonl", secret, OTHER_UID)
    rc, err = _characterize(capsys, link)
    assert_one_line(rc, err, f"--results {link}", "symlink owned by another user")
    assert _stamp(secret) == before
    assert not Path(f"{secret}.lock").exists()
    with pytest.raises(UnsafePathError):                  # the library refuses it as well
        ResultsLog.open(link)
    assert _stamp(secret) == before and not Path(f"{secret}.lock").exists()


def test_own_links_are_followed_and_root_links_trusted(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert check_own_path(link) == str(real)
    assert check_own_path(link, through_last=False) == str(link)
    assert check_own_path(tmp_path / "new" / "x.json") == str(tmp_path / "new" / "x.json")
    # atomic_write replaces a final link as a directory entry; the file it named stays
    atomic_write(link, lambda tmp: Path(tmp).write_text('{"new": 1}'))
    assert not link.is_symlink() and real.read_text() == "{}"


# -- the results lock file ---------------------------------------------------------------------

@pytest.mark.parametrize("case", ["new results file", "results of another seed"])
def test_an_existing_lock_file_with_foreign_content_is_untouched(tmp_path, logs, capsys, case):
    """``characterize --results data.jsonl`` beside a ``data.jsonl.lock`` that is not ours:
    refused with one line naming it (exit 2), the lock file and the results file untouched,
    whether the run would have measured (a new file) or failed anyway (another seed)."""
    data = tmp_path / "data.jsonl"
    if case == "results of another seed":
        data.write_bytes((logs / "b.jsonl").read_bytes())          # seed 1; this run: seed 0
        _old(data)
    lock = tmp_path / "data.jsonl.lock"
    lock.write_bytes(b"my notes: not a lock file\n")
    _old(lock)
    before = _stamp(lock)
    data_before = _stamp(data) if data.exists() else None
    rc, err = _characterize(capsys, data, seed=0)
    assert_one_line(rc, err, str(lock))
    assert _stamp(lock) == before
    assert (_stamp(data) if data.exists() else None) == data_before
