"""Clock locks and power limits without root, through zeusd (measure.zeusd; issue 30).

The user's NVML is the strict fake made to refuse every setter with
``NVML_ERROR_NO_PERMISSION`` (a non-root user); zeusd is tests/zeusd_standin.py on a Unix
socket, applying what it is asked to the same file-backed card through its own (privileged)
fake. So a change that reaches the card went through zeusd, and every read still comes from
the user's NVML.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from frontier.operating_point import OperatingPoint
from measure import NVMLDevice, PermissionDeniedError, ReadOnlyError, UnsupportedSettingError
from measure import journal as jr
from measure import zeusd as zd
from measure.device import DeviceError
from measure.nvml import RELAYED_SETTERS
from tests.fake_pynvml import FakeGPU, load_cards, make_fake_pynvml, save_cards
from tests.zeusd_standin import ZeusdStandIn

ROOT = Path(__file__).resolve().parents[1]
FOUND = {"limit_mw": 650_000, "locked_sm": None, "locked_mem": None}
OP = OperatingPoint(sm_clock_mhz=1200, mem_clock_mhz=2201, power_limit_w=450)
#: What zeusd is asked for OP, in the order NVMLDevice applies it (power, memory, SM).
SET_OP = [
    ("/gpu/set_power_limit", {"gpu_ids": "0", "power_limit_mw": "450000", "block": "true"}),
    ("/gpu/set_mem_locked_clocks",
     {"gpu_ids": "0", "min_clock_mhz": "2201", "max_clock_mhz": "2201", "block": "true"}),
    ("/gpu/set_gpu_locked_clocks",
     {"gpu_ids": "0", "min_clock_mhz": "1200", "max_clock_mhz": "1200", "block": "true"}),
]
#: What zeusd is asked to restore OP's card (the journal's order: SM, memory, power limit).
RESTORE_OP = [
    ("/gpu/reset_gpu_locked_clocks", {"gpu_ids": "0", "block": "true"}),
    ("/gpu/reset_mem_locked_clocks", {"gpu_ids": "0", "block": "true"}),
    ("/gpu/set_power_limit", {"gpu_ids": "0", "power_limit_mw": "650000", "block": "true"}),
]


class Card:
    """A file-backed fake card, seen by a non-root user's NVML and by zeusd's."""

    def __init__(self, folder: Path):
        self.path = folder / "card.json"
        self.uuid = f"GPU-zeusd-{os.getpid()}-{folder.name}"
        save_cards(self.path, [FakeGPU(uuid=self.uuid, limit_mw=FOUND["limit_mw"])])

    def settings(self) -> dict:
        s = load_cards(self.path)[0]
        return {"limit_mw": s["limit_mw"],
                "locked_sm": tuple(s["locked_sm"]) if s["locked_sm"] else None,
                "locked_mem": tuple(s["locked_mem"]) if s["locked_mem"] else None}

    def user_nvml(self):
        """The user's NVML: reads work, every setter is refused (no root)."""
        fake = make_fake_pynvml(state_path=self.path)
        for name in RELAYED_SETTERS:
            fake.gpu.fail[name] = fake.NVML_ERROR_NO_PERMISSION
        return fake

    def root_nvml(self):
        """zeusd's NVML (root): the same card, setters allowed."""
        return make_fake_pynvml(state_path=self.path)

    def open(self, fake=None, **kw) -> NVMLDevice:
        fake = fake or self.user_nvml()
        return NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None,
                          **kw)

    def journal_entries(self) -> list[str]:
        p = jr.path_for(self.uuid)
        return list(jr.read_journal(p).entries) if p.exists() else []


@pytest.fixture
def short_dir():
    """A folder with a short path (a Unix socket path must fit in 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="zd-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def card(short_dir) -> Card:
    return Card(short_dir)


@pytest.fixture
def zeusd(card, short_dir, monkeypatch):
    """The stand-in zeusd on the card, its socket exported as ZEUSD_SOCK_PATH."""
    with ZeusdStandIn(short_dir / "zeusd.sock", nvml=card.root_nvml()) as server:
        monkeypatch.setenv("ZEUSD_SOCK_PATH", server.sock_path)
        monkeypatch.delenv("ZEUSD_TOKEN", raising=False)
        yield server


@pytest.fixture(autouse=True)
def _no_zeusd_from_the_shell(monkeypatch):
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    monkeypatch.delenv("ZEUSD_TOKEN", raising=False)


def one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and text.strip() == text, text
    return text


# -- setting and restoring through zeusd ---------------------------------------------------

def test_operating_point_goes_through_zeusd_and_reads_stay_on_nvml(card, zeusd):
    fake = card.user_nvml()
    dev = card.open(fake)
    assert isinstance(dev.setter_relay, zd.ZeusdClient)
    assert dev.setter_relay.sock_path == zeusd.sock_path
    dev.set_operating_point(OP)
    assert zeusd.posts() == SET_OP
    assert card.settings() == {"limit_mw": 450_000, "locked_sm": (1200, 1200),
                               "locked_mem": (2201, 2201)}
    assert set(card.journal_entries()) == {"power_limit", "mem_locked_clocks", "gpu_locked_clocks"}
    # reads: the user's NVML, which sees zeusd's change; zeusd got no read at all
    assert dev.get_operating_point().power_limit_w == 450.0
    assert dev.clocks_mhz() == {"sm": 1200.0, "mem": 2201.0}
    assert fake.call_count("nvmlDeviceGetPowerManagementLimit") >= 2
    assert {r.method for r in zeusd.requests} == {"POST"}
    zeusd.clear()
    dev.restore()
    assert zeusd.posts() == RESTORE_OP
    assert card.settings() == FOUND and card.journal_entries() == []
    dev.close()
    assert fake.gpu.setter_calls == []          # NVML's setters were never called


def test_without_zeusd_a_non_root_user_is_told_about_it(card):
    dev = card.open()
    assert dev.setter_relay is None
    with pytest.raises(PermissionDeniedError) as ei:
        dev.set_operating_point(OP)
    assert "ZEUSD_SOCK_PATH" in ei.value.what_to_do and "zeusd" in one_line(ei.value)
    dev.close()
    assert card.settings() == FOUND


def test_explicit_relay_wins_over_the_environment(card, zeusd, short_dir, monkeypatch):
    dev = card.open(setter_relay=None)                  # NVML itself, though the env is set
    with pytest.raises(PermissionDeniedError, match="nvmlDeviceSetPowerManagementLimit"):
        dev.set_operating_point(OP)
    dev.close()
    assert zeusd.posts() == []
    monkeypatch.delenv("ZEUSD_SOCK_PATH")
    dev = card.open(setter_relay=zd.ZeusdClient(zeusd.sock_path))
    dev.set_operating_point(OperatingPoint(sm_clock_mhz=1500))
    assert card.settings()["locked_sm"] == (1500, 1500)
    dev.close()
    assert card.settings() == FOUND
    assert [p for p, _ in zeusd.posts()] == ["/gpu/set_gpu_locked_clocks",
                                              "/gpu/reset_gpu_locked_clocks"]


def test_read_only_device_asks_zeusd_nothing(card, zeusd):
    dev = card.open(read_only=True)
    with pytest.raises(ReadOnlyError):
        dev.set_operating_point(OP)
    dev.close()
    assert zeusd.requests == [] and card.settings() == FOUND


# -- zeusd's refusals -------------------------------------------------------------------------

NVML_NO_PERMISSION = {"errors": {"0": "NVML error: Insufficient Permissions"}}


@pytest.mark.parametrize("status, body, kind, says", [
    (403, NVML_NO_PERMISSION, PermissionDeniedError, ["HTTP 403", "Insufficient Permissions",
                                                      "run zeusd as root"]),
    (401, {"error": "Authentication required."}, PermissionDeniedError, ["ZEUSD_TOKEN"]),
    (400, {"errors": {"0": "NVML error: Not supported"}}, UnsupportedSettingError,
     ["refused the value", "Not supported"]),
    (400, {"errors": {"0": "Invalid request: 10 W is outside 100000-300000 mW"}},
     UnsupportedSettingError, ["100000-300000 mW"]),
    (400, "GPU index 0 does not exist.", zd.ZeusdError, ["has no GPU 0", "on its host"]),
    (400, "Query deserialize error: missing field `block`", zd.ZeusdError,
     ["missing field", "0.3 or later"]),
    (404, {"error": "API group 'gpu-control' is not enabled on this server."}, zd.ZeusdError,
     ["--enable gpu-control", "not enabled"]),
    (404, "", zd.ZeusdError, ["HTTP 404: Not Found", "upgrade zeusd"]),
    (500, {"errors": {"0": "NVML error: Unknown Error"}}, zd.ZeusdError,
     ["after 3 tries", "may or may not"]),
])
def test_refusals_are_typed_one_line_errors(zeusd, status, body, kind, says):
    client = zd.ZeusdClient(zeusd.sock_path, sleep=lambda s: None)
    zeusd.answer_next("set_gpu_locked_clocks", status, body, times=3)
    with pytest.raises(kind) as ei:
        client.set_gpu_locked_clocks(0, 1200, 1200)
    text = one_line(ei.value)
    assert "zeusd POST /gpu/set_gpu_locked_clocks" in text
    for s in says:
        assert s in text
    assert ei.value.route == "/gpu/set_gpu_locked_clocks" and ei.value.status == status
    assert ei.value.maybe_applied is (status >= 500)
    assert len(zeusd.posts()) == (3 if status >= 500 else 1)


def test_a_refused_change_is_rolled_back_and_not_journalled(card, zeusd):
    dev = card.open()
    zeusd.answer_next("set_gpu_locked_clocks", 403, NVML_NO_PERMISSION)
    with pytest.raises(PermissionDeniedError, match="zeusd POST /gpu/set_gpu_locked_clocks"):
        dev.set_operating_point(OP)
    assert card.settings() == FOUND            # power limit and memory lock undone through zeusd
    assert "gpu_locked_clocks" not in dev.changed_settings
    dev.close()
    assert card.settings() == FOUND and card.journal_entries() == []


def test_an_unknown_outcome_stays_journalled_and_is_restored(card, zeusd):
    dev = card.open(setter_relay=zd.ZeusdClient(zeusd.sock_path, sleep=lambda s: None))
    zeusd.answer_next("set_gpu_locked_clocks", 500, {"errors": {"0": "NVML error: Timeout"}},
                      times=3)
    with pytest.raises(zd.ZeusdError, match="may or may not"):
        dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200))
    assert card.journal_entries() == ["gpu_locked_clocks"]      # maybe applied: kept
    zeusd.clear()
    dev.restore()
    assert zeusd.posts() == [RESTORE_OP[0]] and card.journal_entries() == []
    dev.close()


def test_token_is_sent_when_zeusd_requires_one(card, short_dir, monkeypatch):
    with ZeusdStandIn(short_dir / "auth.sock", nvml=card.root_nvml(), token="s3cret") as server:
        with pytest.raises(PermissionDeniedError, match="ZEUSD_TOKEN"):
            zd.ZeusdClient(server.sock_path).reset_gpu_locked_clocks(0)
        client = zd.zeusd_from_env({"ZEUSD_SOCK_PATH": server.sock_path, "ZEUSD_TOKEN": "s3cret"})
        assert client is not None
        client.reset_gpu_locked_clocks(0)
        assert [r.status for r in server.requests] == [401, 200]
        assert server.requests[-1].authorization == "Bearer s3cret"


# -- the stand-in refuses what zeusd refuses -------------------------------------------------

def _raw(sock_path: str, method: str, target: str, body: bytes = b"") -> tuple[int, str]:
    conn = zd._UnixHTTPConnection(sock_path, 5.0)
    try:
        conn.request(method, target, body=body, headers={"Content-Length": str(len(body))})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize("method, target, status, says", [
    ("POST", "/gpu/set_power_limit?gpu_ids=3&power_limit_mw=500000&block=true", 400,
     "GPU index 3 does not exist."),
    ("POST", "/gpu/set_power_limit?gpu_ids=0&power_limit_wwww=500000&block=true", 400,
     "unknown field `power_limit_wwww`"),
    ("POST", "/gpu/set_power_limit?gpu_ids=0&block=true", 400, "missing field `power_limit_mw`"),
    ("POST", "/gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=1000&max_clock_mhz=abc&block=true",
     400, "invalid digit"),
    ("POST", "/gpu/reset_gpu_locked_clocks?gpu_ids=0&block=yes", 400, "not `true` or `false`"),
    ("POST", "/gpu/reset_gpu_locked_clocks?gpu_ids=&block=true", 400,
     '{"error": "gpu_ids must contain at least one GPU index"}'),
    ("POST", "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=10&block=true", 400,
     '{"errors": {"0": "NVML error: '),
    ("GET", "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=500000&block=true", 404, ""),
    ("POST", "/gpu/0/set_power_limit", 404, ""),                    # zeusd 0.2's route
    ("POST", "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=10&block=false", 200, ""),
])
def test_standin_refuses_what_zeusd_refuses(card, zeusd, method, target, status, says):
    body = b'{"power_limit_mw": 500000, "block": true}' if "/0/" in target else b""
    got, text = _raw(zeusd.sock_path, method, target, body)
    assert got == status and says in text
    assert card.settings() == FOUND and zeusd.applied == []


def test_client_names_a_gpu_zeusd_does_not_have(zeusd):
    with pytest.raises(zd.ZeusdError, match="zeusd has no GPU 3") as ei:
        zd.ZeusdClient(zeusd.sock_path).set_power_limit(3, 500_000)
    assert ei.value.status == 400 and not ei.value.maybe_applied


# -- an unreachable zeusd ---------------------------------------------------------------------

def test_missing_socket_is_a_clear_error(short_dir):
    path = str(short_dir / "none.sock")
    with pytest.raises(zd.ZeusdError) as ei:
        zd.ZeusdClient(path).reset_gpu_locked_clocks(0)
    text = one_line(ei.value)
    assert f"zeusd is not reachable at {path}" in text and "no socket there" in text
    assert "zeusd serve" in text and "unset ZEUSD_SOCK_PATH" in text
    assert ei.value.status is None and not ei.value.maybe_applied


def test_stale_socket_is_a_clear_error(short_dir):
    path = str(short_dir / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)              # bound, never listening: what a killed zeusd leaves behind
    s.close()
    with pytest.raises(zd.ZeusdError, match="nothing is listening there"):
        zd.ZeusdClient(path).set_power_limit(0, 500_000)


def test_socket_permission_denied_is_a_clear_error(short_dir, monkeypatch):
    def refuse(path, timeout_s):      # what a non-root user gets on a 0600 root socket
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(zd, "_open_socket", refuse)
    with pytest.raises(zd.ZeusdError, match="may not connect to it .*--socket-permissions 666"):
        zd.ZeusdClient(str(short_dir / "z.sock")).set_power_limit(0, 500_000)


@pytest.mark.parametrize("hang_up, says", [(True, "dropped the connection"),
                                             (False, "did not answer within 0.2 s")])
def test_a_lost_answer_may_have_been_applied(short_dir, hang_up, says):
    path = str(short_dir / "mute.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    held = []

    def take_the_request_and_never_answer():
        conn, _ = listener.accept()
        conn.recv(65536)
        if hang_up:
            conn.close()
        else:
            held.append(conn)          # open, silent: the client's timeout ends the wait

    t = threading.Thread(target=take_the_request_and_never_answer, daemon=True)
    t.start()
    try:
        with pytest.raises(zd.ZeusdError, match=says) as ei:
            zd.ZeusdClient(path, timeout_s=0.2).set_power_limit(0, 500_000)
        assert ei.value.maybe_applied and "may or may not" in one_line(ei.value)
    finally:
        t.join()
        for c in held:
            c.close()
        listener.close()


def test_unreachable_zeusd_changes_nothing_and_journals_nothing(card, short_dir, monkeypatch):
    monkeypatch.setenv("ZEUSD_SOCK_PATH", str(short_dir / "none.sock"))
    dev = card.open()
    with pytest.raises(zd.ZeusdError, match="not reachable"):
        dev.set_operating_point(OP)
    assert dev.changed_settings == () and card.journal_entries() == []
    dev.close()
    assert card.settings() == FOUND


def test_zeusd_from_env():
    assert zd.zeusd_from_env({}) is None
    assert zd.zeusd_from_env({"ZEUSD_SOCK_PATH": "  "}) is None
    c = zd.zeusd_from_env({"ZEUSD_SOCK_PATH": "/run/zeusd/zeusd.sock"}, timeout_s=2)
    assert c is not None and c.sock_path == "/run/zeusd/zeusd.sock" and c.timeout_s == 2.0
    assert c.token is None


def test_values_zeusd_cannot_take_are_refused_before_sending(zeusd):
    client = zd.ZeusdClient(zeusd.sock_path)
    with pytest.raises(UnsupportedSettingError, match="power_limit_mw"):
        client.set_power_limit(0, -1)
    with pytest.raises(UnsupportedSettingError, match="min_clock_mhz"):
        client.set_gpu_locked_clocks(0, 1200.5, 1300)
    assert zeusd.requests == []


# -- a run killed with clocks set through zeusd, restored through zeusd ----------------------

CHILD = """
import sys
from frontier.operating_point import OperatingPoint
from measure import NVMLDevice
from measure.nvml import RELAYED_SETTERS
from tests.fake_pynvml import make_fake_pynvml
fake = make_fake_pynvml(state_path=sys.argv[1])
for name in RELAYED_SETTERS:                      # not root: NVML refuses every setter
    fake.gpu.fail[name] = fake.NVML_ERROR_NO_PERMISSION
dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200, mem_clock_mhz=2201, power_limit_w=450))
assert fake.gpu.setter_calls == []
print("set", flush=True)
sys.stdin.read()                                  # until SIGKILL
"""


def test_sigkilled_run_is_restored_through_zeusd(card, zeusd, monkeypatch, capsys):
    from ecal.recovery import cmd_restore

    env = {**os.environ, "PYTHONPATH": str(ROOT)}     # ZEUSD_SOCK_PATH, ECAL_STATE_DIR: the test's
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(card.path)], cwd=ROOT, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 120)   # a guard, not a timing
        if (child.stdout.readline() if ready else b"") != b"set\n":
            child.kill()
            err = child.communicate()[1].decode()
            pytest.fail(f"the child did not set the card: {err[-2000:]}")
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for f in (child.stdin, child.stdout, child.stderr):
            f.close()
    assert zeusd.posts() == SET_OP
    assert card.settings() == {"limit_mw": 450_000, "locked_sm": (1200, 1200),
                               "locked_mem": (2201, 2201)}
    assert set(card.journal_entries()) == {"power_limit", "mem_locked_clocks", "gpu_locked_clocks"}
    zeusd.clear()

    # without zeusd, a non-root restore fails, keeps the journal and says what to do
    monkeypatch.delenv("ZEUSD_SOCK_PATH")
    with pytest.raises(DeviceError, match="ZEUSD_SOCK_PATH"):
        cmd_restore(argparse.Namespace(device="nvml:0", json=False), nvml=card.user_nvml())
    assert len(card.journal_entries()) == 3 and zeusd.requests == []
    capsys.readouterr()

    # `ecal restore --device nvml:0` with ZEUSD_SOCK_PATH set: the card back, through zeusd
    monkeypatch.setenv("ZEUSD_SOCK_PATH", zeusd.sock_path)
    user = card.user_nvml()
    assert cmd_restore(argparse.Namespace(device="nvml:0", json=False), nvml=user) == 0
    assert zeusd.posts() == RESTORE_OP
    assert card.settings() == FOUND and card.journal_entries() == []
    assert not jr.path_for(card.uuid).exists()
    assert user.gpu.setter_calls == []
    out = capsys.readouterr().out
    assert f"restored {card.uuid} (nvml:0)" in out and "power limit 650 W" in out
