"""Safe on a shared, failing machine (issue 27, the device side): the GPU comes back even when
the disk does not, root follows no planted file, and no journal can run away.

Every scenario runs the real code (``measure.sweep`` over ``NVMLDevice``, or ``ecal restore``
through the CLI's ``main``) in a forked child process over the *file-backed* fake pynvml of
:mod:`tests.test_faults` (its helpers are reused: the card is found at 650 W, no clock locks),
and reads the card from the parent afterwards.

How the disk faults are made (each scenario runs both ways where it can):

* ``mount``: the state folder is a real 256 KiB tmpfs (needs root and ``mount``; skipped
  otherwise). *Full*: a filler file is written into it until the kernel answers ENOSPC.
  *Read-only*: the folder is bind-mounted onto itself and that bind remounted read-only
  (``mount --bind`` + ``mount -o remount,bind,ro``), so later opens, renames and unlinks there
  get EROFS, while a file opened before (the held GPU lock) stays writable — as on a real
  folder remounted read-only. (``chmod 0500`` would not do: the tests run as root.)
* ``inject``: in the child only, the ``os`` calls a full or read-only file system refuses fail
  that way for paths under the state folder — a full one: ``os.write``/``os.pwrite`` on files
  opened there (ENOSPC; creating, renaming and unlinking still work, as on a full tmpfs); a
  read-only one: opening for writing or creating, ``os.replace``/``os.rename``,
  ``os.unlink`` and ``os.mkdir`` there (EROFS).
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import stat
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from frontier.operating_point import OperatingPoint
from measure import journal as jr
from measure import sweep
from measure.locks import ProcessLock, UnsafeFileError, UnsafeStateDirError, lock_dir
from tests import test_faults
from tests.fake_pynvml import FakeGPU, load_cards, make_fake_pynvml, save_cards
from tests.test_faults import FAST, FOUND, GRID, Card, in_child, reap, run_sweep, spawn

#: test_faults' ``tmp_path`` fixture: a fresh folder on tmpfs holding the state folder.
tmp_path = test_faults.tmp_path

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(os, "geteuid"),
                                reason="forks child processes; POSIX ownership")

CHANGED = {"limit_mw": 450_000, "locked_sm": (1200, 1200), "locked_mem": (2201, 2201)}
DEFAULTS = {"limit_mw": 700_000, "locked_sm": None, "locked_mem": None}
OTHER_UID = 12345


def state() -> Path:
    return Path(os.environ["ECAL_STATE_DIR"])


# -- the disk faults --------------------------------------------------------------------------

def _can_mount() -> bool:
    return os.geteuid() == 0 and subprocess.run(["which", "mount"], capture_output=True).returncode == 0


class Folder:
    """The state folder and its faults (module doc): ``how`` is "mount" or "inject"."""

    def __init__(self, how: str, path: Path):
        self.how, self.path = how, path
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if how == "mount":
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs",
                                str(path)], capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")

    def fault(self, kind: str) -> None:
        """Make the folder ``kind`` ("full" or "read-only") — from inside the child."""
        if self.how == "inject":
            inject(self.path, errno.ENOSPC if kind == "full" else errno.EROFS)
        elif kind == "full":
            try:
                with open(self.path / "filler", "ab") as fh:
                    while True:
                        fh.write(b"\0" * 4096)
                        fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        elif not self._read_only():
            for cmd in (["mount", "--bind", str(self.path), str(self.path)],
                        ["mount", "-o", "remount,bind,ro", str(self.path)]):
                subprocess.run(cmd, check=True, capture_output=True)

    def _read_only(self) -> bool:
        return bool(os.statvfs(self.path).f_flag & os.ST_RDONLY)

    def clear(self) -> None:
        """End the fault (from the parent): unmount the read-only bind, remove the filler."""
        if self.how == "mount":
            while self._read_only():
                subprocess.run(["umount", str(self.path)], check=True)
            (self.path / "filler").unlink(missing_ok=True)

    def close(self) -> None:
        if self.how == "mount":
            while os.path.ismount(self.path):
                subprocess.run(["umount", "-l", str(self.path)], check=True)


def inject(folder: Path, code: int) -> None:
    """In this (child) process, fail what a full (ENOSPC) or read-only (EROFS) file system
    refuses, for paths under ``folder`` (module doc)."""
    root = os.path.realpath(folder) + os.sep
    real = {n: getattr(os, n) for n in ("open", "write", "pwrite", "replace", "rename",
                                        "unlink", "mkdir")}
    mine: set[int] = set()
    full, ro = code == errno.ENOSPC, code == errno.EROFS

    def under(p) -> bool:
        return not isinstance(p, int) and os.path.realpath(os.fsdecode(p)).startswith(root)

    def fail(p=None):
        raise OSError(code, os.strerror(code), *(() if p is None else (os.fspath(p),)))

    def open_(path, flags, mode=0o777, *, dir_fd=None):
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        if ro and writing and under(path):
            fail(path)
        fd = real["open"](path, flags, mode, dir_fd=dir_fd)
        (mine.add if under(path) else mine.discard)(fd)
        return fd

    def write_(fd, data):
        if full and fd in mine:
            fail()
        return real["write"](fd, data)

    def pwrite_(fd, data, offset):
        if full and fd in mine:
            fail()
        return real["pwrite"](fd, data, offset)

    def two(name):
        def call(src, dst, *a, **kw):
            if ro and (under(src) or under(dst)):
                fail(dst)
            return real[name](src, dst, *a, **kw)
        return call

    def one(name):
        def call(path, *a, **kw):
            if ro and under(path):
                fail(path)
            return real[name](path, *a, **kw)
        return call

    os.open, os.write, os.pwrite = open_, write_, pwrite_
    os.replace, os.rename = two("replace"), two("rename")
    os.unlink, os.mkdir = one("unlink"), one("mkdir")


@pytest.fixture(params=["mount", "inject"])
def folder(request, tmp_path):
    if request.param == "mount" and not _can_mount():
        pytest.skip("needs root and mount(8) for a real tmpfs")
    f = Folder(request.param, state())
    yield f
    f.close()


# -- children ---------------------------------------------------------------------------------

def ecal_in_child(argv: list[str], card: Card, before: Callable[[], None] = lambda: None,
                  out_dir: Path | None = None) -> tuple[int, str, str]:
    """``ecal ARGV`` through the CLI's ``main`` in a forked child whose pynvml is ``card``'s
    fake: (exit code, stdout, stderr). ``before()`` runs first in the child (a fault)."""
    d = out_dir or card.path.parent
    out, err = d / "cli.out", d / "cli.err"
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the child
        code = 99
        try:
            sys.stdout = io.TextIOWrapper(open(out, "wb"), write_through=True)
            sys.stderr = io.TextIOWrapper(open(err, "wb"), write_through=True)
            before()
            import measure.nvml as mn
            from ecal.cli import main

            mn._load_pynvml = card.fake
            code = main(argv)
        except BaseException:  # noqa: BLE001 - a traceback is what the test looks for
            sys.stderr.write(traceback.format_exc())
            code = 98
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return reap(pid), out.read_text(), err.read_text()


def child(body: Callable[[], object], tmp: Path) -> tuple[int, dict]:
    """``body()`` in a forked child (test_faults' ``in_child``): (exit code, what it saw)."""
    out = tmp / "seen.json"
    out.unlink(missing_ok=True)
    code = in_child(body, out)
    return code, json.loads(out.read_text()) if out.exists() else {}


def sweep_keeping_calls(card: Card, calls: Path, results: Path | None = None,
                        before: Callable[[], None] = lambda: None):
    """A body: ``before()``, then the real sweep; the fake's setter calls go to ``calls``."""
    def body():
        box = []
        try:
            before()
            return run_sweep(card, box.append) if results is None else _sweep_to(card, box, results)
        finally:
            calls.write_text(json.dumps([c[0] for c in box[0].gpu.setter_calls] if box
                                       else "not opened"))
    return body


def _sweep_to(card: Card, box: list, results: Path):
    fake = card.fake()
    box.append(fake)
    dev = card.open(fake)
    try:
        return sweep(dev, {None: lambda: fake.busy(0.01, 400.0)}, "w", grid=GRID, protocol=FAST,
                     progress=None, results_path=str(results))
    finally:
        dev.close()


def set_card(card: Card, settings: dict) -> None:
    save_cards(card.path, [FakeGPU(uuid=card.uuid, limit_mw=settings["limit_mw"],
                                   locked_sm=settings["locked_sm"],
                                   locked_mem=settings["locked_mem"], energy_read_cost_s=0.02)])


def write_journal(card: Card, restore_mw: int = 650_000, **extra) -> Path:
    """A journal as a killed run of ours leaves it (all three settings changed)."""
    path = card.journal()
    doc = {"format": jr.FORMAT, "version": 1, "uuid": card.uuid, "index": 0, "name": "NVIDIA H200",
           "pid": 2 ** 22 + 7, "uid": os.geteuid(), "host": "h", "boot_id": "",
           "started_unix_s": 1.0, "entries": [
               {"setting": "gpu_locked_clocks", "restore": "reset", "restore_mw": None},
               {"setting": "mem_locked_clocks", "restore": "reset", "restore_mw": None},
               {"setting": "power_limit", "restore": "value", "restore_mw": restore_mw}], **extra}
    jr.write_atomic(path, json.dumps(doc))
    return path


def one_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def secret(tmp: Path, name: str = "secret") -> tuple[Path, tuple]:
    """A root-only file a planted symlink points at, and its (content, mtime, mode)."""
    p = tmp / name
    p.write_text("root only\n")
    os.chmod(p, 0o600)
    os.utime(p, ns=(10**18, 10**18))
    return p, snap(p)


def snap(p: Path) -> tuple:
    st = os.stat(p)
    return p.read_bytes(), st.st_mtime_ns, stat.S_IMODE(st.st_mode), st.st_size


def lock_path(card: Card) -> Path:
    return state() / f"{jr.safe_name(card.uuid)}.lock"


# -- a full or read-only state folder -----------------------------------------------------------

@pytest.mark.parametrize("kind", ["full", "read-only"])
def test_a_full_or_read_only_state_folder_from_the_start_changes_nothing(tmp_path, folder, kind):
    card = Card(tmp_path)
    calls = tmp_path / "calls.json"
    code, seen = child(sweep_keeping_calls(card, calls, before=lambda: folder.fault(kind)), tmp_path)
    assert card.settings() == FOUND and json.loads(calls.read_text()) == [], seen
    assert code == 3 and seen["error"] in ("JournalWriteError", "DeviceError"), seen
    msg = seen["message"]
    assert "\n" not in msg and str(state()) in msg and "nothing was changed" in msg
    assert ("No space left" if kind == "full" else "Read-only") in msg
    assert json.loads(calls.read_text()) == []     # no setter ever ran
    assert card.settings() == FOUND
    assert not os.path.lexists(card.journal()) and not os.path.lexists(lock_path(card))


@pytest.mark.parametrize("kind", ["full", "read-only"])
def test_a_full_or_read_only_state_folder_mid_sweep_leaves_the_card_as_found(tmp_path, folder,
                                                                             kind, capfd):
    """The folder fails during a first sweep (all three settings journalled and changed): its
    restore puts the card back whatever the disk does; a second sweep (another element) needs
    a new journal entry, cannot write it, and is refused before changing anything."""
    card = Card(tmp_path)

    def body():
        fake = card.fake()
        fake.after_call("nvmlDeviceGetTotalEnergyConsumption", lambda: folder.fault(kind), nth=10)
        dev = card.open(fake)
        work = {None: lambda: fake.busy(0.01, 400.0)}
        try:
            sweep(dev, work, "first", grid=GRID, protocol=FAST, progress=None)
            assert card.settings() == FOUND and not dev.changed_settings
            sweep(dev, work, "second", grid=GRID, protocol=FAST, progress=None)
        finally:
            dev.close()

    code, seen = child(body, tmp_path)
    assert card.settings() == FOUND, seen
    assert code == 3 and seen["error"] == "JournalWriteError", seen
    assert "nothing was changed" in seen["message"] and str(card.journal()) in seen["message"]
    err = capfd.readouterr().err
    if kind == "full":       # an unlink works on a full disk: nothing is left
        assert not os.path.lexists(card.journal())
        assert "Traceback" not in err
    else:                    # the journal could not be removed: said once, naming it
        assert os.path.lexists(card.journal())
        said = [x for x in err.splitlines() if str(card.journal()) in x]
        assert len(said) == 1 and "ecal restore" in said[0], err
        # `ecal restore` in the still read-only folder: the card is restored (again, harmless),
        # the journal cannot be cleared: one line, exit 2
        set_card(card, CHANGED)
        code, out, err = ecal_in_child(["restore"], card, lambda: folder.fault(kind))
        assert code == 2, (out, err)
        assert card.settings() == FOUND
        line = one_line(err)
        assert "is restored" in line and str(card.journal()) in line and "Read-only" in line
        assert "Traceback" not in out and card.uuid in out
        folder.clear()
        code, out, err = ecal_in_child(["restore"], card)
        assert code == 0 and err == "", (out, err)
        assert card.settings() == FOUND and not os.path.lexists(card.journal())
    assert not os.path.lexists(lock_path(card)) or lock_path(card).read_bytes() == b""


def test_restore_on_a_full_folder_with_a_failing_reset_keeps_a_journal_of_everything(
        tmp_path, folder, capfd):
    """The issue's case (the first journal *rewrite* after a reset used to abort the restore):
    one reset keeps failing while the folder is full, so the journal would have to be
    rewritten with what is left. Every other setting is put back regardless; the journal keeps
    all three (restoring them again is harmless); later ``ecal restore`` finishes the job."""
    card = Card(tmp_path)

    def body():
        fake = card.fake()
        fake.fail_calls("nvmlDeviceResetMemoryLockedClocks", fake.NVML_ERROR_UNKNOWN, count=10**6)
        fake.after_call("nvmlDeviceGetTotalEnergyConsumption", lambda: folder.fault("full"),
                        nth=10)
        dev = card.open(fake)
        try:
            return sweep(dev, {None: lambda: fake.busy(0.01, 400.0)}, "w", grid=GRID,
                         protocol=FAST, progress=None)
        finally:
            dev.close()

    code, seen = child(body, tmp_path)
    s = card.settings()
    assert s["limit_mw"] == FOUND["limit_mw"] and s["locked_sm"] is None and s["locked_mem"], seen
    assert code == 3 and "nvmlDeviceResetMemoryLockedClocks" in seen["message"], seen
    assert set(jr.read_journal(card.journal()).entries) == set(jr.SETTINGS)
    assert "Traceback" not in capfd.readouterr().err
    folder.clear()
    code, out, err = ecal_in_child(["restore"], card)
    assert code == 0 and err == "", (out, err)
    assert card.settings() == FOUND and not os.path.lexists(card.journal())


# -- journals that are not well-formed, or not ours -------------------------------------------

def test_a_deeply_nested_journal_resets_to_defaults_in_one_line(tmp_path):
    card = Card(tmp_path)
    set_card(card, CHANGED)
    path = card.journal()
    jr.write_atomic(path, f'{{"format": "{jr.FORMAT}", "uuid": "{card.uuid}", "entries": '
                          + "[" * 5000 + "]" * 5000 + "}")
    code, out, err = ecal_in_child(["restore"], card)
    assert code == 0 and err == "", (out, err)
    line = one_line(out)
    assert line.startswith(f"restored {card.uuid} (nvml:0)") and str(path) in line
    assert "unreadable device journal (nested too deeply)" in line and "driver default" in line
    assert card.settings() == DEFAULTS and not os.path.lexists(path)


def test_an_out_of_range_journal_sets_the_default_limit_and_says_so(tmp_path):
    card = Card(tmp_path)
    set_card(card, CHANGED)
    path = write_journal(card, restore_mw=7_000_000)          # 10x the card's 700 W maximum
    code, out, err = ecal_in_child(["restore"], card)
    assert code == 0 and err == "", (out, err)
    line = one_line(out)
    assert "7000 W is outside this GPU's range 200-700 W" in line and "default limit" in line
    assert card.settings() == DEFAULTS and not os.path.lexists(path)


def test_an_out_of_range_journal_at_open(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="measure.nvml")     # the recovery's note (ecal shows it)
    card = Card(tmp_path)
    set_card(card, CHANGED)
    write_journal(card, restore_mw=100_000)                   # below the 200 W minimum
    card.open().close()
    line = one_line("\n".join(r.getMessage() for r in caplog.records if r.name == "measure.nvml"))
    assert "100 W is outside" in line and "power limit 700 W" in line
    assert card.settings() == DEFAULTS


@pytest.mark.parametrize("how", ["owner", "uid-field", "mode", "symlink"])
def test_a_journal_planted_by_another_user_is_refused(tmp_path, how):
    card = Card(tmp_path)
    planted = 200_000                                          # the planter's choice
    if how == "uid-field":
        path = write_journal(card, planted, uid=OTHER_UID)
    elif how == "symlink":
        elsewhere = tmp_path / "elsewhere.json"
        jr.write_atomic(elsewhere, write_journal(card, planted).read_text())
        card.journal().unlink()
        card.journal().symlink_to(elsewhere)
        path = card.journal()
    else:
        path = write_journal(card, planted)
        if how == "owner":
            os.chown(path, OTHER_UID, OTHER_UID)
        else:
            os.chmod(path, 0o666)
    before = os.lstat(path)
    code, out, err = ecal_in_child(["restore"], card)
    assert code == 2, (out, err)
    assert card.settings() == FOUND                            # never set to the planted 200 W
    assert "refusing to use this device journal" in one_line(err) and str(path) in err
    assert f"refused {jr.safe_name(card.uuid)}" in one_line(out)
    # opening the GPU for a sweep refuses too, in one line, before any change
    calls = tmp_path / "calls.json"
    code, seen = child(sweep_keeping_calls(card, calls), tmp_path)
    assert code == 3 and seen["error"] == "UntrustedJournalError" and "\n" not in seen["message"]
    assert json.loads(calls.read_text()) == [] and card.settings() == FOUND
    assert os.lstat(path) == before                            # left for a human to look at


def test_a_journal_without_uid_from_an_older_ecal_is_still_restored(tmp_path):
    card = Card(tmp_path)
    set_card(card, CHANGED)
    path = write_journal(card)
    doc = json.loads(path.read_text())
    del doc["uid"]
    jr.write_atomic(path, json.dumps(doc))
    os.chmod(path, 0o644)                                      # as older writers made it
    code, out, err = ecal_in_child(["restore"], card)
    assert code == 0 and err == "" and "power limit 650 W" in out
    assert card.settings() == FOUND


PL = '{"format": "F", "uuid": "G", "entries": [{"setting": "power_limit", "restore_mw": %s}]}'
MALFORMED = [    # (id, text, what the message names)
    ("deep-nesting", "[" * 5000 + "]" * 5000, "nested too deeply"),
    ("well-formed", '{"format": "F", "uuid": "G"}', None),
    ("uuid-type", '{"format": "F", "uuid": 7}', "uuid"),
    ("entries-type", '{"format": "F", "uuid": "G", "entries": {"setting": "power_limit"}}',
     "entries"),
    ("entry-not-object", '{"format": "F", "uuid": "G", "entries": [7]}', "not an object"),
    ("mw-string", PL % '"1"', "restore_mw"),
    ("mw-float", PL % "1e9", "restore_mw"),
    ("mw-bool", PL % "true", "restore_mw"),
    ("mw-huge", PL % (10 ** 20), "restore_mw"),
    ("mw-5000-digits", PL % ("9" * 5000), "digits"),
    ("pid-negative", '{"format": "F", "uuid": "G", "pid": -1}', "pid"),
    ("time-nan", '{"format": "F", "uuid": "G", "started_unix_s": NaN}', "started_unix_s"),
    ("setting-twice", '{"format": "F", "uuid": "G", "entries": [{"setting": "gpu_locked_clocks"}, '
     '{"setting": "gpu_locked_clocks"}]}', "twice"),
    ("set_to-nested", '{"format": "F", "uuid": "G", "entries": [{"setting": "gpu_locked_clocks", '
     '"set_to": [[[[1]]]]}]}', "set_to"),
    ("name-long", '{"format": "F", "uuid": "G", "name": "%s"}' % ("x" * 5000), "name"),
    ("file-too-big", '{"format": "F", "uuid": "G", "x": "%s"}' % ("y" * jr.MAX_JOURNAL_BYTES),
     "bytes"),
]


@pytest.mark.parametrize("text, problem", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_journals_are_corrupt_in_one_line(tmp_path, text, problem):
    p = tmp_path / "G.journal.json"
    p.write_text(text.replace('"F"', f'"{jr.FORMAT}"'))
    if problem is None:                        # well-formed, for contrast
        assert jr.read_journal(p).uuid == "G"
        return
    with pytest.raises(jr.CorruptJournalError) as ei:
        jr.read_journal(p)
    msg = str(ei.value)
    assert "\n" not in msg and len(msg) < 400 and str(p) in msg and problem in msg
    assert "driver default" in msg


# -- planted symlinks: followed nowhere ---------------------------------------------------------

def test_a_planted_device_lock_symlink_is_not_followed(tmp_path):
    card = Card(tmp_path)
    target, before = secret(tmp_path)
    lock_dir()
    lock_path(card).symlink_to(target)
    calls = tmp_path / "calls.json"
    code, seen = child(sweep_keeping_calls(card, calls), tmp_path)
    assert code == 3 and seen["error"] == "UnsafeFileError", seen
    assert "symlink" in seen["message"] and str(lock_path(card)) in seen["message"]
    assert snap(target) == before and card.settings() == FOUND
    assert os.readlink(lock_path(card)) == str(target)         # the link itself is left alone


def test_a_planted_results_lock_symlink_is_not_followed(tmp_path):
    card = Card(tmp_path)
    target, before = secret(tmp_path)
    results = tmp_path / "alice" / "r.jsonl"
    results.parent.mkdir()
    Path(f"{results}.lock").symlink_to(target)
    calls = tmp_path / "calls.json"
    code, seen = child(sweep_keeping_calls(card, calls, results=results), tmp_path)
    assert code == 3 and seen["error"] == "UnsafeFileError", seen
    assert "symlink" in seen["message"] and "\n" not in seen["message"]
    assert snap(target) == before and card.settings() == FOUND
    assert json.loads(calls.read_text()) == []


def test_planted_journal_temp_symlinks_are_not_followed(tmp_path):
    """Symlinks at the temp-file names of killed writers (dead PIDs, and the PID-less legacy
    name) are neither written through nor removed by the stale-temp cleanup; one at this
    process's own temp name refuses the first journal write (nothing changed)."""
    card = Card(tmp_path)
    target, before = secret(tmp_path)
    lock_dir()
    dead = spawn(lambda: None)
    reap(dead)
    links = [jr.temp_path(card.journal(), pid) for pid in (dead, 2 ** 22 + 1)]
    links.append(card.journal().with_name(card.journal().name + ".tmp"))
    for link in links:
        link.symlink_to(target)
    code, seen = child(lambda: run_sweep(card), tmp_path)
    assert code == 0, seen
    assert card.settings() == FOUND and snap(target) == before
    assert all(os.readlink(link) == str(target) for link in links)
    code, out, err = ecal_in_child(["restore", "--json"], card)
    assert code == 0 and json.loads(out)["temp_files_removed"] == [], (out, err)
    assert snap(target) == before
    # at our own temp name (a planter guessing the PID)
    calls = tmp_path / "calls.json"
    code, seen = child(sweep_keeping_calls(card, calls, before=lambda: jr.temp_path(
        card.journal()).symlink_to(target)), tmp_path)
    assert code == 3 and seen["error"] == "UnsafeFileError" and "nothing was written" in \
        seen["message"], seen
    assert json.loads(calls.read_text()) == [] and card.settings() == FOUND
    assert snap(target) == before


def test_stale_temp_cleanup_removes_only_our_regular_files(tmp_path):
    d = tmp_path / "j"
    d.mkdir()
    journal = jr.path_for("GPU-x", d)
    dead = spawn(lambda: None)
    reap(dead)
    ours = jr.temp_path(journal, dead)
    theirs = jr.temp_path(journal, dead + 1 if dead + 1 != os.getpid() else dead + 2)
    link = jr.temp_path(journal, 2 ** 22 + 3)
    for p in (ours, theirs):
        p.write_text("{}")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    target, before = secret(tmp_path)
    link.symlink_to(target)
    assert jr.remove_stale_temp_files("GPU-x", d) == [ours]
    assert theirs.exists() and os.path.islink(link) and snap(target) == before


# -- the state folder ---------------------------------------------------------------------------

def test_under_umask_000_the_state_folder_is_0700_and_the_journal_0600(tmp_path, monkeypatch):
    card = Card(tmp_path)
    monkeypatch.setenv("ECAL_STATE_DIR", str(tmp_path / "new" / "state"))
    modes = tmp_path / "modes.json"

    def body():
        os.umask(0)
        fake = card.fake()
        dev = card.open(fake)

        def look():
            modes.write_text(json.dumps({p.name: stat.S_IMODE(os.lstat(p).st_mode)
                                         for p in (tmp_path / "new", lock_dir(), card.journal(),
                                                   lock_path(card))}))
        fake.after_call("nvmlDeviceSetPowerManagementLimit", look)
        try:
            dev.set_operating_point(OperatingPoint(power_limit_w=500))
        finally:
            dev.close()

    code, seen = child(body, tmp_path)
    assert code == 0, seen
    got = json.loads(modes.read_text())
    assert got == {"new": 0o700, "state": 0o700, card.journal().name: 0o600,
                   lock_path(card).name: 0o644}
    assert card.settings() == FOUND


@pytest.mark.parametrize("how, says", [("mode-770", "chmod 700"), ("mode-707", "chmod 700"),
                                       ("owner", "chown"), ("symlink", "symlink")])
def test_an_unsafe_state_folder_is_refused_in_one_line(tmp_path, monkeypatch, how, says):
    card = Card(tmp_path)
    d = tmp_path / "shared"
    d.mkdir(mode=0o700)
    if how.startswith("mode"):
        os.chmod(d, int(how[-3:], 8))
    elif how == "owner":
        os.chown(d, OTHER_UID, OTHER_UID)
    else:
        real, d = d, tmp_path / "link"
        d.symlink_to(real)
    monkeypatch.setenv("ECAL_STATE_DIR", str(d))
    with pytest.raises(UnsafeStateDirError) as ei:
        lock_dir()
    msg = str(ei.value)
    assert "\n" not in msg and str(d) in msg and says in msg and "ECAL_STATE_DIR" in msg
    calls = tmp_path / "calls.json"
    code, seen = child(sweep_keeping_calls(card, calls), tmp_path)
    assert code == 3 and seen["error"] == "UnsafeStateDirError" and seen["message"] == msg
    code, out, err = ecal_in_child(["restore"], card)
    assert code == 2 and one_line(err).endswith(f"error: {msg}"), (out, err)
    assert card.settings() == FOUND and os.listdir(d) == []


# -- lock files that are not ours ---------------------------------------------------------------

@pytest.mark.parametrize("which", ["results", "device"])
def test_an_existing_lock_file_with_other_content_is_left_untouched(tmp_path, which):
    card = Card(tmp_path)
    results = tmp_path / "r.jsonl"
    lock = Path(f"{results}.lock") if which == "results" else lock_path(card)
    lock_dir()
    lock.write_text("not a lock: someone's notes\n")
    os.utime(lock, ns=(10**18, 10**18))
    before = snap(lock)
    calls = tmp_path / "calls.json"
    code, seen = child(sweep_keeping_calls(card, calls, results=results), tmp_path)
    assert code == 3 and seen["error"] == "UnsafeFileError", seen
    assert "\n" not in seen["message"] and str(lock) in seen["message"]
    assert "not an energy-calculus lock" in seen["message"]
    assert snap(lock) == before and card.settings() == FOUND
    assert json.loads(calls.read_text()) == []


def test_a_lock_file_left_by_a_killed_run_is_taken_over_and_removed(tmp_path):
    card = Card(tmp_path)
    results = tmp_path / "r.jsonl"
    lock_dir()
    for lock in (Path(f"{results}.lock"), lock_path(card)):
        lock.write_text(f"{2 ** 22 + 5}\necal characterize ...\n")   # a dead PID: ours
    code, seen = child(sweep_keeping_calls(card, tmp_path / "c.json", results=results), tmp_path)
    assert code == 0, seen
    assert not Path(f"{results}.lock").exists() and not lock_path(card).exists()
    assert card.settings() == FOUND


def test_process_lock_refuses_hard_links_and_removes_only_its_own_file(tmp_path):
    other = tmp_path / "other"
    other.write_text("")
    os.link(other, tmp_path / "x.lock")
    with pytest.raises(UnsafeFileError, match="hard links"):
        ProcessLock(tmp_path / "x.lock", "x").acquire()
    assert other.exists() and other.read_text() == ""
    lock = ProcessLock(tmp_path / "y.lock", "y", "two\nlines").acquire()
    assert (tmp_path / "y.lock").read_text() == f"{os.getpid()}\ntwo lines\n"
    lock.release()
    assert not (tmp_path / "y.lock").exists()


def test_a_waiting_lock_taker_never_shares_a_removed_lock_file(tmp_path):
    """The releasing holder removes its file while still holding it; a process that opened
    the old file meanwhile gets the flock on a removed file, notices and retries on a new one:
    two takers never both hold the lock."""
    path = tmp_path / "gpu.lock"
    first = ProcessLock(path, "gpu").acquire()
    second = ProcessLock(path, "gpu")
    fd = os.open(path, os.O_RDWR)        # the second taker's open, before the release...
    real_open, opened = os.open, [fd]

    def open_once(p, flags, mode=0o777, **kw):
        return opened.pop() if opened and os.fspath(p) == os.fspath(path) else real_open(p, flags, mode, **kw)
    first.release()                      # ...then the holder removes the file and lets go
    os.open = open_once
    try:
        second.acquire()
    finally:
        os.open = real_open
    third = ProcessLock(path, "gpu")
    with pytest.raises(Exception, match="in use by process"):
        third.acquire()
    assert os.fstat(second._fd).st_ino == os.stat(path).st_ino
    second.release()


# -- the fake's calls are atomic across processes -----------------------------------------------

def test_concurrent_processes_on_the_fake_lose_no_write(tmp_path):
    """Two processes call the file-backed fake at once, 300 times each: one locks and resets
    the SM clock and reads it back, the other the memory clock, and both advance the fake
    clock. Each call holds the fake's flock, so no read-back ever sees another process's stale
    save and the clock ends at exactly the sum of both processes' steps."""
    path = tmp_path / "card.json"
    save_cards(path, [FakeGPU(uuid="GPU-race")])
    n, step = 300, 0.001

    def worker(which: str) -> Callable[[], object]:
        def body():
            fake = make_fake_pynvml(state_path=path)
            fake.nvmlInit()
            h = fake.nvmlDeviceGetHandleByIndex(0)
            lock, reset, kind = (
                (fake.nvmlDeviceSetGpuLockedClocks, fake.nvmlDeviceResetGpuLockedClocks,
                 fake.NVML_CLOCK_SM) if which == "sm" else
                (fake.nvmlDeviceSetMemoryLockedClocks, fake.nvmlDeviceResetMemoryLockedClocks,
                 fake.NVML_CLOCK_MEM))
            lost = 0
            for i in range(n):
                mhz = 1000 + i
                lock(h, mhz, mhz)
                fake.busy(step, 300.0)
                lost += fake.nvmlDeviceGetClockInfo(h, kind) != mhz
                reset(h)
            return f"lost={lost}"
        return body

    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    pids = [spawn(worker(w), o) for w, o in zip(("sm", "mem"), outs)]
    assert [reap(p) for p in pids] == [0, 0]
    assert [json.loads(o.read_text())["result"] for o in outs] == ["'lost=0'", "'lost=0'"]
    s = load_cards(path)[0]
    assert s["t"] == pytest.approx(2 * n * step, abs=1e-9)
    assert s["locked_sm"] is None and s["locked_mem"] is None


def test_getters_do_not_rewrite_the_fakes_file(tmp_path):
    path = tmp_path / "card.json"
    save_cards(path, [FakeGPU(uuid="GPU-get")])
    fake = make_fake_pynvml(state_path=path)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    os.utime(path, ns=(10**18, 10**18))
    fake.nvmlDeviceGetPowerManagementLimit(h)
    fake.nvmlDeviceGetClockInfo(h, fake.NVML_CLOCK_SM)
    fake.time()
    assert os.stat(path).st_mtime_ns == 10**18
    fake.nvmlDeviceSetPowerManagementLimit(h, 500_000)
    assert os.stat(path).st_mtime_ns != 10**18 and load_cards(path)[0]["limit_mw"] == 500_000


# -- the atexit hook on a read-only state folder ------------------------------------------------

def test_atexit_restores_the_card_when_the_journal_cannot_be_written(tmp_path):
    """A process exits (no close) after its state folder turned read-only (EROFS injected in
    that process): the atexit hook puts the card back all the same and names the journal."""
    card = Card(tmp_path)
    script = f"""
import errno, sys
from pathlib import Path
from frontier.operating_point import OperatingPoint
from measure import NVMLDevice
from tests.fake_pynvml import make_fake_pynvml
from tests.test_hostile_device import inject
fake = make_fake_pynvml(state_path={str(card.path)!r})
dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200, mem_clock_mhz=2201, power_limit_w=450))
inject(Path({str(state())!r}), errno.EROFS)
sys.exit(0)
"""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=120, cwd=root)
    assert r.returncode == 0, r.stderr
    assert card.settings() == FOUND
    line = one_line(r.stderr)
    assert str(card.journal()) in line and "Read-only" in line and "ecal restore" in line
    assert set(jr.read_journal(card.journal()).entries) == set(jr.SETTINGS)   # stale, harmless
    card.open().close()                  # the next open redoes it and clears the journal
    assert card.settings() == FOUND and not os.path.lexists(card.journal())
