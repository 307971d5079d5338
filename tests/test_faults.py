"""Fault injection: whatever happens to a run, the GPU ends exactly as it was found.

Every scenario runs the real code (``measure.sweep`` over ``NVMLDevice`` with the strict fake
pynvml, a small grid over SM clocks, a memory clock and two power limits, a protocol with tiny
windows) in a forked child process over a *file-backed* fake card, injects the fault (a
signal inside a chosen NVML call, a failing or transient call, SIGKILL, a user exception),
and then reads the card from the parent: power limit and both clock locks must be as found
(the found limit, 650 W, is deliberately not the 700 W default), and no journal may be left
unless the scenario says so — then the next open or ``ecal restore`` must put the card back.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from frontier.operating_point import OperatingPoint
from measure import LockedError, NVMLDevice, Protocol, restoring, sweep
from measure import journal as jr
from measure.nvml import GpuLostError, RestoreFailedError
from tests.fake_pynvml import FakeGPU, load_cards, make_fake_pynvml, save_cards

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fault tests fork child processes")

ROOT = Path(__file__).resolve().parents[1]
FOUND = {"limit_mw": 650_000, "locked_sm": None, "locked_mem": None}
GRID = "sm_clock_mhz=1500,1200,mem_clock_mhz=2201,power_limit_w=500,450"
FAST = Protocol(window_s=0.05, warmup_s=0.0, min_windows=1, max_windows=1, target_rse=1.0,
                ready_window_s=0.1, ready_windows=1)
TERMINATING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@pytest.fixture
def tmp_path(tmp_path_factory, monkeypatch):
    """A fresh folder on tmpfs where there is one (journal fsyncs on a disk cost ~10 ms each,
    which the hundreds of child runs here would pay), holding the state dir (ECAL_STATE_DIR)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        import shutil
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="ecal-faults-", dir=shm))
    else:
        d, shutil = tmp_path_factory.mktemp("faults"), None
    monkeypatch.setenv("ECAL_STATE_DIR", str(d / "state"))
    yield d
    if shutil is not None:
        shutil.rmtree(d, ignore_errors=True)


class Card:
    """A file-backed fake card shared by the test and its child processes."""

    def __init__(self, tmp_path: Path):
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.path = tmp_path / "card.json"
        self.uuid = f"GPU-faults-{os.getpid()}-{tmp_path.name}"
        self.reset()

    def reset(self) -> None:
        save_cards(self.path, [FakeGPU(uuid=self.uuid, limit_mw=FOUND["limit_mw"],
                                       energy_read_cost_s=0.02)])

    def settings(self) -> dict:
        s = load_cards(self.path)[0]
        return {"limit_mw": s["limit_mw"],
                "locked_sm": tuple(s["locked_sm"]) if s["locked_sm"] else None,
                "locked_mem": tuple(s["locked_mem"]) if s["locked_mem"] else None}

    def fake(self):
        return make_fake_pynvml(state_path=self.path)

    def journal(self) -> Path:
        return jr.path_for(self.uuid)

    def open(self, fake=None, **kw) -> NVMLDevice:
        fake = fake or self.fake()
        return NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None, **kw)


def run_sweep(card: Card, inject: Callable = lambda fake: None, work_fails_at: int | None = None,
              grid: str = GRID):
    """The real sweep over the card; ``inject(fake)`` adds the fault before the device opens."""
    fake = card.fake()
    inject(fake)
    dev = card.open(fake)
    calls = [0]

    def work():
        calls[0] += 1
        if work_fails_at is not None and calls[0] == work_fails_at:
            raise RuntimeError("the user's work failed")
        fake.busy(0.01, 400.0)

    try:
        return sweep(dev, {None: work}, "w", grid=grid, protocol=FAST, progress=None)
    finally:
        dev.close()


def in_child(body: Callable[[], object], out: Path | None = None, sigterm: str = "default") -> int:
    """Run ``body()`` in a forked child with the CLI's signal setup and return its exit code
    (negative: killed by that signal). ``sigterm="cli"`` installs a SIGTERM/SIGHUP handler
    that raises, as ecal's CLI does. The child writes what it saw to ``out`` as JSON."""
    return reap(spawn(body, out, sigterm))


def reap(pid: int) -> int:
    """Wait for child ``pid``; its exit code (negative: the signal that killed it)."""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def spawn(body: Callable[[], object], out: Path | None = None, sigterm: str = "default") -> int:
    """Fork a child running ``body()`` (see :func:`in_child`); its PID."""
    pid = os.fork()
    if pid == 0:   # pragma: no cover - runs in the child
        code = 0
        seen: dict = {}
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # SIGQUIT must not dump a core
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                signal.signal(s, signal.SIG_DFL)
            if sigterm == "cli":
                def cli_handler(signum, frame):
                    seen["cli_handler"] = signum
                    raise SystemExit(130)
                signal.signal(signal.SIGTERM, cli_handler)
                signal.signal(signal.SIGHUP, cli_handler)
            res = body()
            seen["result"] = len(res.signatures) if hasattr(res, "signatures") else repr(res)
        except KeyboardInterrupt:
            code = 130
        except SystemExit as exc:
            code = int(exc.code or 0)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            seen.update(error=type(exc).__name__, message=str(exc),
                        notes=list(getattr(exc, "__notes__", [])), tb=traceback.format_exc())
            code = 3
        finally:
            if out is not None:
                out.write_text(json.dumps(seen))
            os._exit(code)
    return pid


def expected_exit(sig: int) -> int:
    return 130 if sig == signal.SIGINT else -sig


def kill_self(sig: int) -> Callable[[], None]:
    return lambda: os.kill(os.getpid(), sig)


def assert_as_found(card: Card) -> None:
    assert card.settings() == FOUND
    assert not card.journal().exists(), card.journal().read_text()


# -- signals in a window, inside each setter, during the restore ------------------------------

@pytest.mark.parametrize("sig", TERMINATING, ids=lambda s: signal.Signals(s).name)
def test_signal_in_a_window_restores_and_keeps_the_exit_status(tmp_path, sig):
    card = Card(tmp_path)

    def inject(fake):   # the 10th energy read falls inside the first measured window
        fake.after_call("nvmlDeviceGetTotalEnergyConsumption", kill_self(sig), nth=10)

    assert in_child(lambda: run_sweep(card, inject)) == expected_exit(sig)
    assert_as_found(card)


def test_sigterm_in_a_characterize_window(tmp_path):
    from measure import characterize

    card = Card(tmp_path)

    def body():
        fake = card.fake()
        fake.after_call("nvmlDeviceGetTotalEnergyConsumption", kill_self(signal.SIGTERM), nth=25)
        dev = card.open(fake)
        return characterize(lambda: fake.busy(0.01, 400.0), device=dev, grid=GRID, protocol=FAST,
                            name="w", progress=None)

    assert in_child(body) == -signal.SIGTERM
    assert_as_found(card)


@pytest.mark.parametrize("setter", ["nvmlDeviceSetPowerManagementLimit",
                                    "nvmlDeviceSetGpuLockedClocks",
                                    "nvmlDeviceSetMemoryLockedClocks"])
@pytest.mark.parametrize("sig", TERMINATING, ids=lambda s: signal.Signals(s).name)
def test_signal_inside_a_setter(tmp_path, setter, sig):
    card = Card(tmp_path)
    assert in_child(lambda: run_sweep(card, lambda f: f.after_call(setter, kill_self(sig)))) \
        == expected_exit(sig)
    assert_as_found(card)


def test_signal_inside_setter_is_held_back_until_the_journal_has_it(tmp_path):
    card = Card(tmp_path)
    fake = card.fake()
    dev = card.open(fake)
    seen = {}

    def inside():
        seen["blocked"] = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
        seen["journal"] = jr.read_journal(card.journal()).entries
    fake.after_call("nvmlDeviceSetGpuLockedClocks", inside)
    dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200))
    assert set(TERMINATING) <= seen["blocked"]
    assert "gpu_locked_clocks" in seen["journal"]
    assert not set(TERMINATING) & set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    dev.close()
    assert_as_found(card)


def kill_and_check_held(sig: int, out: Path) -> Callable[[], None]:
    """Send ``sig`` to ourselves from inside an NVML call of a restore and record whether the
    kernel holds it back (pending) instead of running a handler in the middle of the restore."""
    def hook():
        os.kill(os.getpid(), sig)
        out.write_text(json.dumps(sig in signal.sigpending()))
    return hook


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_signal_during_the_final_restore(tmp_path, second):
    card = Card(tmp_path)
    held = tmp_path / "held.json"

    def inject(fake):
        fake.after_call("nvmlDeviceResetGpuLockedClocks", kill_and_check_held(second, held))

    assert in_child(lambda: run_sweep(card, inject)) == expected_exit(second)
    assert json.loads(held.read_text()) is True
    assert_as_found(card)


@pytest.mark.parametrize("during", ["nvmlDeviceResetGpuLockedClocks",
                                    "nvmlDeviceResetMemoryLockedClocks",
                                    "nvmlDeviceSetPowerManagementLimit"])
def test_double_ctrl_c(tmp_path, during):
    """A first Ctrl-C in a window; a second one inside an NVML call of the restore the first
    one started (its first, middle or last step)."""
    card = Card(tmp_path)
    held = tmp_path / "held.json"

    def inject(fake):
        def first():
            fake.after_call(during, kill_and_check_held(signal.SIGINT, held),
                            nth=fake.call_count(during) + 1)
            os.kill(os.getpid(), signal.SIGINT)
        fake.after_call("nvmlDeviceGetTotalEnergyConsumption", first, nth=12)

    assert in_child(lambda: run_sweep(card, inject)) == 130
    assert json.loads(held.read_text()) is True
    assert_as_found(card)


def test_ctrl_c_inside_the_restore_of_a_sigterm(tmp_path):
    card = Card(tmp_path)
    held = tmp_path / "held.json"

    def inject(fake):
        fake.after_call("nvmlDeviceGetTotalEnergyConsumption", kill_self(signal.SIGTERM), nth=15)
        fake.after_call("nvmlDeviceResetGpuLockedClocks", kill_and_check_held(signal.SIGINT, held))

    assert in_child(lambda: run_sweep(card, inject)) in (130, -signal.SIGTERM)
    assert json.loads(held.read_text()) is True
    assert_as_found(card)


def test_cli_sigterm_handler_is_called_after_restoring(tmp_path):
    card = Card(tmp_path)
    out = tmp_path / "seen.json"

    def inject(fake):
        fake.after_call("nvmlDeviceGetTotalEnergyConsumption", kill_self(signal.SIGTERM), nth=10)

    assert in_child(lambda: run_sweep(card, inject), out, sigterm="cli") == 130
    assert json.loads(out.read_text())["cli_handler"] == signal.SIGTERM
    assert_as_found(card)


def test_sighup_ignored_under_nohup_keeps_running(tmp_path):
    """A SIGHUP that was ignored before (nohup) is still ignored: the sweep completes."""
    card = Card(tmp_path)
    out = tmp_path / "seen.json"

    def body():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        return run_sweep(card, lambda f: f.after_call("nvmlDeviceGetTotalEnergyConsumption",
                                                      kill_self(signal.SIGHUP), nth=10))

    assert in_child(body, out) == 0
    assert json.loads(out.read_text())["result"] == 4
    assert_as_found(card)


# -- a user exception, failing resets, transient errors, a lost GPU ---------------------------

def test_user_exception_with_a_reset_that_fails_then_succeeds(tmp_path):
    card = Card(tmp_path)
    out = tmp_path / "seen.json"

    def inject(fake):   # 7 failures: more than one restore's retries, fewer than restoring()'s
        fake.fail_calls("nvmlDeviceResetGpuLockedClocks", fake.NVML_ERROR_UNKNOWN, count=7)

    assert in_child(lambda: run_sweep(card, inject, work_fails_at=20), out) == 3
    seen = json.loads(out.read_text())
    assert seen["error"] == "RuntimeError" and seen["message"] == "the user's work failed"
    assert seen["notes"] == []
    assert_as_found(card)


def test_user_exception_with_a_reset_that_keeps_failing(tmp_path, capsys):
    card = Card(tmp_path)
    out = tmp_path / "seen.json"

    def inject(fake):
        fake.fail_calls("nvmlDeviceResetGpuLockedClocks", fake.NVML_ERROR_UNKNOWN, count=10_000)

    assert in_child(lambda: run_sweep(card, inject, work_fails_at=20), out) == 3
    seen = json.loads(out.read_text())
    assert seen["error"] == "RuntimeError" and seen["message"] == "the user's work failed"
    assert len(seen["notes"]) == 1 and "nvmlDeviceResetGpuLockedClocks" in seen["notes"][0]
    assert "ecal restore" in seen["notes"][0]
    # the power limit was restored; the SM lock is still journalled
    assert card.settings()["limit_mw"] == FOUND["limit_mw"] and card.settings()["locked_sm"]
    entries = jr.read_journal(card.journal()).entries
    assert list(entries) == ["gpu_locked_clocks"]
    from ecal.recovery import cmd_restore

    assert cmd_restore(argparse.Namespace(device="nvml:0", json=False), nvml=card.fake()) == 0
    assert card.uuid in capsys.readouterr().out
    assert_as_found(card)


def test_transient_errors_do_not_abort_the_sweep(tmp_path):
    card = Card(tmp_path)
    out = tmp_path / "seen.json"

    def inject(fake):
        t, u = fake.NVML_ERROR_TIMEOUT, fake.NVML_ERROR_UNKNOWN
        fake.fail_calls("nvmlDeviceGetTotalEnergyConsumption", t, count=3, start=5)
        fake.fail_calls("nvmlDeviceGetTotalEnergyConsumption", u, count=2, start=30)
        fake.fail_calls("nvmlDeviceSetGpuLockedClocks", t, count=2)
        fake.fail_calls("nvmlDeviceSetPowerManagementLimit", u, count=1, start=2)
        fake.fail_calls("nvmlDeviceGetClockInfo", t, count=1)
        fake.fail_calls("nvmlDeviceResetMemoryLockedClocks", u, count=3)

    assert in_child(lambda: run_sweep(card, inject), out) == 0
    assert json.loads(out.read_text())["result"] == 4
    assert_as_found(card)


def test_persistent_transient_error_gives_up_after_bounded_tries(tmp_path):
    card = Card(tmp_path)
    fake = card.fake()
    dev = card.open(fake)
    fake.fail_calls("nvmlDeviceGetTemperature", fake.NVML_ERROR_TIMEOUT, count=10_000)
    with pytest.raises(Exception, match="after 5 tries"):
        dev.temperature_c()
    assert fake.call_count("nvmlDeviceGetTemperature") == 5
    dev.close()


def test_gpu_lost_restores_then_raises_a_clear_error(tmp_path):
    card = Card(tmp_path)
    fake = card.fake()
    dev = card.open(fake)
    dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200, power_limit_w=450))
    fake.fail_calls("nvmlDeviceGetTotalEnergyConsumption", fake.NVML_ERROR_GPU_IS_LOST,
                    count=1, start=fake.call_count("nvmlDeviceGetTotalEnergyConsumption") + 1)
    with pytest.raises(GpuLostError, match="settings were restored.*nvidia-smi -r"):
        dev.energy_j()
    assert_as_found(card)
    dev.close()


def test_gpu_lost_for_good_keeps_the_journal_for_later(tmp_path, caplog):
    # the library logs these lines (measure.nvml: an error, then a note); ecal shows them
    caplog.set_level(logging.INFO, logger="measure.nvml")
    card = Card(tmp_path)
    fake = card.fake()
    dev = card.open(fake)
    dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200, power_limit_w=450))
    fake.gpu.lost = True
    fake.save()
    with pytest.raises(GpuLostError, match="could not be restored.*ecal restore --device nvml:0"):
        dev.energy_j()
    dev.close()                     # cannot restore either: says so, keeps the journal
    assert "without restoring" in caplog.text and card.journal().exists()
    caplog.clear()
    fake.gpu.lost = False           # the card came back (reset); the journal is still there
    fake.save()
    other = card.open()
    assert "restored" in caplog.text
    assert_as_found(card)
    other.close()


# -- SIGKILL: the journal is left; the next open, or `ecal restore`, puts the card back -------

def _killed_mid_sweep(card: Card) -> int:
    code = in_child(lambda: run_sweep(card, lambda f: f.after_call(
        "nvmlDeviceSetGpuLockedClocks", kill_self(signal.SIGKILL), nth=2)))
    assert code == -signal.SIGKILL
    assert card.settings() != FOUND
    return code


def test_sigkill_leaves_a_journal_and_the_next_open_restores(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="measure.nvml")     # the recovery's note (ecal shows it)
    card = Card(tmp_path)
    _killed_mid_sweep(card)
    rec = jr.read_journal(card.journal())
    assert rec.uuid == card.uuid and rec.pid != os.getpid() and not rec.writer_alive()
    assert rec.entries["power_limit"].restore_mw == FOUND["limit_mw"]
    assert set(rec.entries) == {"power_limit", "mem_locked_clocks", "gpu_locked_clocks"}
    caplog.clear()
    dev = card.open()
    err = [r.getMessage() for r in caplog.records if r.name == "measure.nvml"]
    assert len(err) == 1 and "restored" in err[0] and card.uuid in err[0] and "650 W" in err[0]
    assert dev.recovered is not None and str(rec.pid) in dev.recovered.summary()
    assert_as_found(card)
    dev.close()


def test_sigkill_then_ecal_restore(tmp_path, capsys):
    from ecal.recovery import cmd_restore

    card = Card(tmp_path)
    _killed_mid_sweep(card)
    assert cmd_restore(argparse.Namespace(device=None, json=True), nvml=card.fake()) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["uuid"] for r in doc["restored"]] == [card.uuid]
    assert "power limit 650 W" in doc["restored"][0]["restored"]
    assert_as_found(card)
    assert cmd_restore(argparse.Namespace(device=None, json=False), nvml=card.fake()) == 0
    assert "nothing to restore" in capsys.readouterr().out


def test_sigkill_during_the_restore(tmp_path, capfd):
    card = Card(tmp_path)
    code = in_child(lambda: run_sweep(card, lambda f: f.after_call(
        "nvmlDeviceResetMemoryLockedClocks", kill_self(signal.SIGKILL))))
    assert code == -signal.SIGKILL and card.journal().exists()
    card.open().close()
    assert_as_found(card)


def test_failed_recovery_refuses_in_one_line_naming_ecal_restore(tmp_path):
    card = Card(tmp_path)
    _killed_mid_sweep(card)
    fake = card.fake()
    fake.gpu.fail["nvmlDeviceResetGpuLockedClocks"] = fake.NVML_ERROR_NO_PERMISSION
    with pytest.raises(RestoreFailedError) as ei:
        card.open(fake)
    msg = str(ei.value)
    assert "\n" not in msg and "ecal restore --device nvml:0" in msg
    assert card.journal().exists()
    card.open().close()            # the lock was released; with permission, it recovers
    assert_as_found(card)


def test_corrupt_journal_resets_to_driver_defaults(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="measure.nvml")     # the recovery's note (ecal shows it)
    card = Card(tmp_path)
    _killed_mid_sweep(card)
    card.journal().write_text('{"format": "energy-calculus/device-jour')     # torn
    card.open().close()
    assert "unreadable journal" in caplog.text
    s = card.settings()
    assert s["locked_sm"] is None and s["locked_mem"] is None and s["limit_mw"] == 700_000


# -- locks ------------------------------------------------------------------------------------

def test_second_process_is_refused_naming_the_holder(tmp_path):
    card = Card(tmp_path)
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:   # pragma: no cover - child holds the GPU until told to stop
        try:
            dev = card.open()
            os.write(w, b"x")
            os.read(r2, 1)
            dev.close()
        finally:
            os._exit(0)
    try:
        assert os.read(r, 1) == b"x"
        with pytest.raises(LockedError) as ei:
            card.open()
        assert ei.value.holder_pid == pid and str(pid) in str(ei.value)
        card.open(read_only=True).close()        # reading is not refused
    finally:
        os.write(w2, b"x")
        os.waitpid(pid, 0)
    card.open().close()                          # released when the holder closed
    assert_as_found(card)


def test_ecal_restore_refuses_a_gpu_in_use(tmp_path):
    from ecal.recovery import cmd_restore
    from measure.device import DeviceError

    card = Card(tmp_path)
    holder = card.open()
    jr.write_atomic(card.journal(), json.dumps({"format": jr.FORMAT, "uuid": card.uuid, "pid": 1,
                                                "entries": [{"setting": "gpu_locked_clocks"}]}))
    with pytest.raises(DeviceError, match=f"in use by process {os.getpid()}"):
        cmd_restore(argparse.Namespace(device="nvml:0", json=False), nvml=card.fake())
    card.journal().unlink()
    holder.close()


# -- atexit -----------------------------------------------------------------------------------

def test_atexit_restores_a_device_left_changed(tmp_path):
    card = Card(tmp_path)
    script = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from frontier.operating_point import OperatingPoint
from measure import NVMLDevice
from tests.fake_pynvml import make_fake_pynvml
fake = make_fake_pynvml(state_path={str(card.path)!r})
dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200, mem_clock_mhz=2201, power_limit_w=450))
assert fake.gpu.locked_sm == (1200, 1200)
sys.exit(0)     # no restore, no close: atexit must put it back
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    assert_as_found(card)


def test_a_signal_landing_as_the_file_backed_fake_takes_its_lock_cannot_deadlock(tmp_path):
    """A Ctrl-C landing just after the file-backed fake took its flock (before it counted the
    lock as held) once ran restoring()'s handler there: its restore called the fake, which
    waited forever on the flock its own process held (a multi-GPU run hung in CI). The fake's
    call is shielded like a real NVML call, so the handler runs after it: the process ends at
    once with the card as found."""
    card = Card(tmp_path)
    script = f"""
import signal, sys, types
sys.path.insert(0, {str(ROOT)!r})
import tests.fake_pynvml as fp
from frontier.operating_point import OperatingPoint
from measure import NVMLDevice
from measure.device import restoring
fake = fp.make_fake_pynvml(state_path={str(card.path)!r})
dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
real = fp.fcntl
def flock(fd, op):
    real.flock(fd, op)
    if op == real.LOCK_EX:
        fp.fcntl = real                  # once
        signal.raise_signal(signal.SIGINT)
try:
    with restoring(dev):
        dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200, mem_clock_mhz=2201,
                                               power_limit_w=450))
        fp.fcntl = types.SimpleNamespace(flock=flock, LOCK_EX=real.LOCK_EX)
        dev.get_operating_point()
        dev.get_operating_point()
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(0)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == 130, done.stderr
    assert_as_found(card)


# -- at least 200 runs: a random signal at a random NVML call of a sweep ----------------------

RANDOM_GRID = "sm_clock_mhz=1500,mem_clock_mhz=2201,power_limit_w=500,450"


def test_random_signal_at_a_random_call(tmp_path):
    """200 runs, two at a time (one card each): a random terminating signal inside a random
    NVML call of a sweep (seeded; a failure names run, call and signal to reproduce it)."""
    cards = [Card(tmp_path / "a"), Card(tmp_path / "b")]
    probe = {}
    run_sweep(cards[0], lambda f: probe.setdefault("fake", f), grid=RANDOM_GRID)
    n_calls = probe["fake"].call_count()
    assert n_calls > 40
    rng = random.Random(18)
    plan = [(rng.randint(1, n_calls), rng.choice(TERMINATING)) for _ in range(200)]
    failures = []
    for i in range(0, len(plan), 2):
        pids = []
        for card, (k, sig) in zip(cards, plan[i:i + 2]):
            card.reset()
            pids.append(spawn(lambda card=card, k=k, sig=sig: run_sweep(
                card, lambda f: f.after_call(None, kill_self(sig), nth=k), grid=RANDOM_GRID)))
        for j, (card, pid) in enumerate(zip(cards, pids)):
            k, sig = plan[i + j]
            code = reap(pid)
            if code != expected_exit(sig) or card.settings() != FOUND or card.journal().exists():
                failures.append((i + j, k, signal.Signals(sig).name, code, card.settings()))
    assert not failures, f"{len(failures)} of 200 runs (run, call, signal, exit, card): {failures[:5]}"


# -- unit tests: the journal -----------------------------------------------------------------

def test_journal_records_first_value_durably_and_clears(tmp_path):
    j = jr.DeviceJournal("GPU-abc", 0, "NVIDIA H200", directory=tmp_path)
    assert j.record("power_limit", 650_000, 500_000) is True
    assert j.record("power_limit", 500_000, 450_000) is False       # first found value wins
    j.record("gpu_locked_clocks", None, [1200, 1200])
    rec = jr.read_journal(j.path)
    assert rec.uuid == "GPU-abc" and rec.pid == os.getpid() and rec.writer_alive()
    assert rec.entries["power_limit"].restore_mw == 650_000
    assert [e.setting for e in rec.ordered()] == ["gpu_locked_clocks", "power_limit"]
    j.clear("gpu_locked_clocks")
    assert list(jr.read_journal(j.path).entries) == ["power_limit"]
    j.clear("power_limit")
    assert not j.path.exists() and jr.list_journals(tmp_path) == []


def test_journal_survives_a_torn_write(tmp_path, monkeypatch):
    j = jr.DeviceJournal("GPU-abc", 0, directory=tmp_path)
    j.record("power_limit", 650_000)
    before = j.path.read_text()

    real_write = os.write

    def half(fd, data):      # the process dies half-way through writing the new journal
        real_write(fd, data[: len(data) // 2])
        raise KeyboardInterrupt
    monkeypatch.setattr(jr.os, "write", half)
    with pytest.raises(KeyboardInterrupt):
        j.record("gpu_locked_clocks")
    monkeypatch.undo()
    assert j.path.read_text() == before                   # the old journal is intact
    assert jr.list_journals(tmp_path) == [j.path]           # the torn temp file is not a journal
    assert list(jr.read_journal(j.path).entries) == ["power_limit"]


@pytest.mark.parametrize("text", ["", "{", '{"format": "other"}', '[1, 2]',
                                  '{"format": "energy-calculus/device-journal", "uuid": "G", '
                                  '"entries": [{"setting": "fan"}]}'])
def test_unreadable_journal_is_a_typed_error(tmp_path, text):
    p = tmp_path / "G.journal.json"
    p.write_text(text)
    with pytest.raises(jr.CorruptJournalError, match="unreadable device journal"):
        jr.read_journal(p)


def test_dead_or_foreign_writer_is_not_alive():
    dead = 2 ** 22 + 12345
    assert not jr.pid_alive(dead) and jr.pid_alive(os.getpid())
    rec = jr.JournalRecord("G", pid=os.getpid(), host="another-host")
    assert not rec.writer_alive()
    rec = jr.JournalRecord("G", pid=os.getpid(), host=__import__("socket").gethostname(),
                           boot_id="a-previous-boot")
    assert not rec.writer_alive()


def test_restoring_notes_a_failed_restore_on_the_users_error(tmp_path):
    card = Card(tmp_path)
    fake = card.fake()
    dev = card.open(fake)
    with pytest.raises(ValueError, match="user") as ei:
        with restoring(dev):
            dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200))
            fake.gpu.fail["nvmlDeviceResetGpuLockedClocks"] = fake.NVML_ERROR_NO_PERMISSION
            raise ValueError("user")
    assert any("restoring" in n and "ecal restore" in n for n in ei.value.__notes__)
    del fake.gpu.fail["nvmlDeviceResetGpuLockedClocks"]
    dev.close()
    assert_as_found(card)


# -- a restore from the journal tries every setting (issue 18, acceptance defect A) -----------

def _killed_with_all_three_changed(card: Card) -> None:
    _killed_mid_sweep(card)
    assert set(jr.read_journal(card.journal()).entries) == {
        "power_limit", "mem_locked_clocks", "gpu_locked_clocks"}
    s = card.settings()
    assert s["limit_mw"] != FOUND["limit_mw"] and s["locked_sm"] and s["locked_mem"]


def _failing_mem_reset(card: Card):
    fake = card.fake()
    fake.fail_calls("nvmlDeviceResetMemoryLockedClocks", fake.NVML_ERROR_UNKNOWN, count=10_000)
    return fake


def _only_mem_lock_left(card: Card, left_by_pid: int) -> None:
    s = card.settings()
    assert s["limit_mw"] == FOUND["limit_mw"] and s["locked_sm"] is None and s["locked_mem"]
    rec = jr.read_journal(card.journal())
    assert list(rec.entries) == ["mem_locked_clocks"] and rec.pid == left_by_pid


def test_ecal_restore_puts_back_every_setting_it_can_and_names_the_rest(tmp_path, capsys):
    from ecal.recovery import cmd_restore
    from measure.device import DeviceError

    card = Card(tmp_path)
    _killed_with_all_three_changed(card)
    pid = jr.read_journal(card.journal()).pid
    with pytest.raises(DeviceError) as ei:
        cmd_restore(argparse.Namespace(device=None, json=False), nvml=_failing_mem_reset(card))
    _only_mem_lock_left(card, pid)     # the power limit was put back after the failure
    assert "not fully restored" in str(ei.value) and "memory clock lock reset: " \
        "nvmlDeviceResetMemoryLockedClocks failed after 5 tries" in str(ei.value)
    out = capsys.readouterr().out.splitlines()
    assert f"restored {card.uuid} (nvml:0): SM clock lock reset, power limit 650 W" in out
    assert [x for x in out if x.startswith("NOT restored")] == [
        x for x in out if "memory clock lock reset: nvmlDeviceResetMemoryLockedClocks" in x
        and x.endswith("(journal kept)")]
    assert len(out) == 2
    with pytest.raises(DeviceError):                     # --json says the same per setting
        cmd_restore(argparse.Namespace(device="nvml:0", json=True), nvml=_failing_mem_reset(card))
    failed = json.loads(capsys.readouterr().out)["failed"]
    assert [f["restored"] for f in failed] == [[]]      # already put back the first time
    assert [n["setting"] for n in failed[0]["not_restored"]] == ["mem_locked_clocks"]
    assert cmd_restore(argparse.Namespace(device=None, json=True), nvml=card.fake()) == 0
    assert json.loads(capsys.readouterr().out)["restored"][0]["restored"] == [
        "memory clock lock reset"]
    assert_as_found(card)


def test_recovery_at_open_puts_back_every_setting_it_can(tmp_path):
    card = Card(tmp_path)
    _killed_with_all_three_changed(card)
    pid = jr.read_journal(card.journal()).pid
    with pytest.raises(RestoreFailedError) as ei:
        card.open(_failing_mem_reset(card))
    _only_mem_lock_left(card, pid)
    msg = str(ei.value)
    assert "\n" not in msg and "ecal restore --device nvml:0" in msg
    assert "put back SM clock lock reset, power limit 650 W" in msg
    assert "NOT restored memory clock lock reset (nvmlDeviceResetMemoryLockedClocks" in msg
    rec = ei.value.recovery
    assert rec.restored == ("SM clock lock reset", "power limit 650 W")
    assert [f[0] for f in rec.failed] == ["mem_locked_clocks"] and rec.pid == pid
    card.open().close()
    assert_as_found(card)


def test_recovery_of_a_corrupt_journal_keeps_only_what_failed(tmp_path):
    card = Card(tmp_path)
    _killed_with_all_three_changed(card)
    card.journal().write_text("{")
    with pytest.raises(RestoreFailedError, match="unreadable journal"):
        card.open(_failing_mem_reset(card))
    s = card.settings()
    assert s["limit_mw"] == 700_000 and s["locked_sm"] is None and s["locked_mem"]
    assert list(jr.read_journal(card.journal()).entries) == ["mem_locked_clocks"]
    card.open().close()
    assert not card.journal().exists() and card.settings()["locked_mem"] is None


# -- `ecal restore --device nvml:N` for a GPU NVML does not have (defect B) --------------------

@pytest.mark.parametrize("journal_left", [False, True], ids=["no-journal", "journal"])
def test_ecal_restore_of_a_missing_gpu_is_an_error(tmp_path, capsys, journal_left):
    from ecal.recovery import cmd_restore
    from measure.device import DeviceError

    card = Card(tmp_path)
    if journal_left:
        _killed_mid_sweep(card)
    with pytest.raises(DeviceError) as ei:
        cmd_restore(argparse.Namespace(device="nvml:1", json=False), nvml=card.fake())
    assert str(ei.value) == "--device nvml:1: no such GPU; NVML sees 1 GPU(s) (nvml:0)"
    assert capsys.readouterr().out == ""
    assert card.journal().exists() == journal_left       # nothing touched


# -- temp files of a journal writer killed mid-write (defect C) -------------------------------

def _killed_in_journal_write(card: Card, nth: int) -> int:
    """SIGKILL a sweep inside its ``nth`` journal write, after the temp file is written and
    before it is renamed; returns the child's PID."""
    def body():
        real_replace, count = os.replace, [0]

        def replace(src, dst):
            if str(dst).endswith(".journal.json"):
                count[0] += 1
                if count[0] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)
            return real_replace(src, dst)
        os.replace = replace         # in the forked child only
        return run_sweep(card)
    pid = spawn(body)
    assert reap(pid) == -signal.SIGKILL
    return pid


def _temps(card: Card) -> list[Path]:
    return sorted(card.journal().parent.glob("*.tmp"))


def test_ecal_restore_removes_the_temp_file_of_a_killed_journal_write(tmp_path, capsys):
    from ecal.recovery import cmd_restore

    card = Card(tmp_path)
    pid = _killed_in_journal_write(card, nth=3)     # power limit and memory lock journalled
    assert card.journal().exists() and card.settings() != FOUND
    assert [t.name for t in _temps(card)] == [f"{card.journal().name}.{pid}.tmp"]
    assert cmd_restore(argparse.Namespace(device=None, json=True), nvml=card.fake()) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["temp_files_removed"] == [str(card.journal()) + f".{pid}.tmp"]
    assert_as_found(card)
    assert _temps(card) == []


@pytest.mark.parametrize("how", ["open", "ecal-restore"])
def test_a_killed_first_journal_write_leaves_nothing_after_the_next_open(tmp_path, capsys, how):
    from ecal.recovery import cmd_restore

    card = Card(tmp_path)
    _killed_in_journal_write(card, nth=1)           # before the first setter: nothing changed
    assert not card.journal().exists() and len(_temps(card)) == 1
    if how == "open":
        dev = card.open()
        assert len(dev.removed_temp_files) == 1
        dev.close()
    else:
        assert cmd_restore(argparse.Namespace(device=None, json=False), nvml=card.fake()) == 0
        assert "nothing to restore" in capsys.readouterr().out
    assert_as_found(card)
    assert _temps(card) == []


def test_stale_temp_files_are_only_dead_writers(tmp_path):
    d = tmp_path / "j"
    d.mkdir()
    journal = jr.path_for("GPU-x", d)
    r, w = os.pipe()
    live = os.fork()
    if live == 0:   # pragma: no cover - a live writer, until the parent is done
        os.read(r, 1)
        os._exit(0)
    dead = spawn(lambda: None)
    reap(dead)
    try:
        live_tmp, dead_tmp = jr.temp_path(journal, live), jr.temp_path(journal, dead)
        own_tmp, legacy = jr.temp_path(journal), journal.with_name(journal.name + ".tmp")
        other = journal.with_name(journal.name + ".bak.tmp")
        for p in (live_tmp, dead_tmp, own_tmp, legacy, other):
            p.write_text("{}")
        # no journal: the dead writer's and the writer-less legacy one are stale
        assert jr.stale_temp_files("GPU-x", d) == sorted([dead_tmp, legacy])
        os.utime(live_tmp, (1, 1))            # older than a journal written after it
        jr.write_atomic(journal, "{}")
        for p in (own_tmp, legacy):           # written after the journal: kept
            p.write_text("{}")
        assert jr.stale_temp_files("GPU-x", d) == sorted([dead_tmp, live_tmp])
        assert jr.remove_stale_temp_files("GPU-x", d) == sorted([dead_tmp, live_tmp])
        assert sorted(p.name for p in d.iterdir()) == sorted(
            p.name for p in (journal, own_tmp, legacy, other))
    finally:
        os.write(w, b"x")
        reap(live)


# -- the GPU lock is never released from the garbage collector after close (defect D) ---------

def test_close_leaves_no_lock_code_for_the_garbage_collector(tmp_path, monkeypatch):
    import gc

    from measure.locks import ProcessLock

    card = Card(tmp_path)
    calls = []
    real = ProcessLock.release
    monkeypatch.setattr(ProcessLock, "release", lambda self: (calls.append(1), real(self))[1])
    dev = card.open()
    dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200))
    dev.close()
    n = len(calls)
    del dev
    gc.collect()
    assert len(calls) == n       # a Ctrl-C landing in a finalizer could not hit lock code
    dropped = card.open()        # a device dropped without close() still frees its lock
    del dropped
    gc.collect()
    card.open().close()
    assert_as_found(card)
