"""A strict fake of ``pynvml`` for tests without a GPU.

``make_fake_pynvml()`` returns a module-like object whose ``nvml*`` functions are real Python
functions with pynvml's parameter names (a wrong call signature raises ``TypeError``, and a
test checks the names against the installed nvidia-ml-py), real NVML constants and
``NVMLError`` classes (``NVMLError(NVML_ERROR_NO_PERMISSION)`` constructs
``NVMLError_NoPermission``, like the real one), a fake clock, an energy counter that advances
only every 100 ms of that clock, and settable failures per call.

Use it by injection: ``NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep)``.
``fake.time`` / ``sleep`` / ``busy`` run on the first card's clock; ``fake.card(i)`` gives card
``i``'s own (``.time``, ``.sleep``, ``.busy``), each card keeping its own clock, as each GPU of
a multi-GPU host is driven by its own worker process (``execution.multi_gpu``):
``NVMLDevice(i, nvml=fake, clock=fake.card(i).time, sleep=fake.card(i).sleep)``.

Fault injection (for tests/test_faults.py):

* ``gpus=[FakeGPU(), ...]``: several cards (``nvmlDeviceGetCount``, handles by index or UUID);
* ``state_path=``: file-backed cards (given neither ``gpu`` nor ``gpus``, an existing file
  gives as many cards as it holds) — the card state (limit, locks, clock, counter) is loaded
  from that JSON file at the start of every call and saved after the call's effect (only when
  the call changed it: getters do not rewrite the file), so a test can SIGKILL a child
  process and then read or restore the "card" from another process. Each call's
  load-effect-save holds an ``flock`` on the sidecar file ``STATE_PATH.lock``, so calls from
  concurrent processes are atomic, as real NVML calls are, and none loses another's write
  (a call made from inside another, e.g. by a signal handler, runs inside the outer one's
  lock);
* ``fake.after_call(name, callback, nth=1)``: run ``callback()`` inside the ``nth`` call of
  ``name`` (``None``: any call) after its effect and before it returns — as a Python signal
  handler runs right after pynvml's C call returns;
* ``fake.fail_calls(name, code, count=1, start=1)``: calls ``start .. start+count-1`` of
  ``name`` raise ``NVMLError(code)`` (e.g. a transient ``NVML_ERROR_TIMEOUT``) before any
  effect; ``gpu.fail[name] = code`` still fails every call;
* ``FakeGPU.lost = True``: every call on that card raises ``NVML_ERROR_GPU_IS_LOST`` (on a
  file-backed fake, call ``fake.save()`` after changing a card by hand).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import json
import os
import types
import uuid as _uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from measure.shield import shielded

try:  # real constants and error classes when nvidia-ml-py is installed
    import pynvml as _real
except ImportError:  # pragma: no cover - nvidia-ml-py is a declared dependency
    _real = None


def _error_classes() -> dict[str, Any]:
    if _real is not None:
        return {k: getattr(_real, k) for k in dir(_real) if k.startswith("NVMLError")}

    class NVMLError(Exception):  # minimal stand-in with the same shape
        def __init__(self, value: int):
            self.value = value

        def __str__(self) -> str:
            return f"NVML error {self.value}"

    return {"NVMLError": NVMLError}


def _constants() -> dict[str, Any]:
    if _real is not None:
        return {k: getattr(_real, k) for k in dir(_real)
                if (k.startswith("NVML_") or k.startswith("nvmlClocks")) and isinstance(getattr(_real, k), int)}
    return {"NVML_ERROR_NO_PERMISSION": 4, "NVML_ERROR_NOT_SUPPORTED": 3, "NVML_ERROR_INVALID_ARGUMENT": 2,
            "NVML_ERROR_UNINITIALIZED": 1, "NVML_ERROR_NOT_FOUND": 6, "NVML_ERROR_TIMEOUT": 10,
            "NVML_ERROR_GPU_IS_LOST": 15, "NVML_ERROR_UNKNOWN": 999, "NVML_CLOCK_SM": 1,
            "NVML_CLOCK_MEM": 2, "NVML_TEMPERATURE_GPU": 0, "NVML_DEVICE_ARCH_HOPPER": 9}


def _new_uuid() -> str:
    return f"GPU-{_uuid.uuid4()}"


@dataclass
class FakeGPU:
    """State behind the fake: an H200-like card on a controllable clock.

    ``uuid`` is fresh per card, so two fakes never share a device lock or journal."""

    name: str = "NVIDIA H200"
    uuid: str = field(default_factory=_new_uuid)
    mem_clocks: tuple[int, ...] = (3201, 2201)
    sm_clocks: tuple[int, ...] = tuple(range(1980, 344, -15))
    limit_range_mw: tuple[int, int] = (200_000, 700_000)
    limit_mw: int = 700_000
    default_limit_mw: int = 700_000
    cores: int = 132 * 128
    arch: int = 9
    idle_power_w: float = 123.0
    temperature_c: int = 35
    event_reasons: int = 0x1
    tick_s: float = 0.1
    energy_read_cost_s: float = 0.004
    t: float = 0.0
    energy_true_j: float = 5000.0
    counter_mj: int = 5_000_000
    next_tick: float = 0.1
    locked_sm: tuple[int, int] | None = None
    locked_mem: tuple[int, int] | None = None
    # A clock lock shows in nvmlDeviceGetClockInfo only this long after its setter (0: at once).
    clock_settle_s: float = 0.0
    sm_locked_at_s: float = 0.0
    mem_locked_at_s: float = 0.0
    lost: bool = False
    initialized: int = 0
    fail: dict[str, int] = field(default_factory=dict)   # call name -> NVML error code
    calls: list[tuple[str, tuple]] = field(default_factory=list)

    def advance(self, dt: float, power_w: float | None = None) -> None:
        """Move the fake clock by dt at power_w (idle power by default); ticks the counter."""
        p = self.idle_power_w if power_w is None else power_w
        end = self.t + dt
        while self.next_tick <= end:
            self.counter_mj = int((self.energy_true_j + p * (self.next_tick - self.t)) * 1000)
            self.next_tick += self.tick_s
        self.energy_true_j += p * dt
        self.t = end

    @property
    def setter_calls(self) -> list[tuple[str, tuple]]:
        """Calls that change device settings."""
        return [c for c in self.calls if c[0].startswith("nvmlDeviceSet") or c[0].startswith("nvmlDeviceReset")]

    def settings(self) -> dict[str, Any]:
        """What a restore must put back: power limit (mW) and both clock locks."""
        return {"limit_mw": self.limit_mw, "locked_sm": self.locked_sm, "locked_mem": self.locked_mem}

    def card_state(self) -> dict[str, Any]:
        """The persistent part of the card (what a file-backed fake saves)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _PER_PROCESS}

    def load_card_state(self, state: dict[str, Any]) -> None:
        """Set the persistent part from :meth:`card_state` output (JSON lists → tuples)."""
        for k, v in state.items():
            if k in _PER_PROCESS:
                continue
            setattr(self, k, tuple(v) if isinstance(v, list) else v)


# Per-process parts of the fake (NVML init count, injected failures, the call log).
_PER_PROCESS = frozenset({"initialized", "fail", "calls"})


def save_cards(path: str | os.PathLike, gpus: list[FakeGPU]) -> None:
    """Write the cards' persistent state to ``path`` atomically (a killed writer leaves the old
    state, like a card whose setter never ran)."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(json.dumps([g.card_state() for g in gpus]))
    os.replace(tmp, path)


def load_cards(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The cards' persistent state as saved by :func:`save_cards`."""
    with open(path) as fh:
        return json.loads(fh.read())


def make_fake_pynvml(gpu: FakeGPU | None = None, *, gpus: list[FakeGPU] | None = None,
                     state_path: str | os.PathLike | None = None) -> types.SimpleNamespace:
    """A fresh fake pynvml module over ``gpu`` (a new :class:`FakeGPU` by default) or the cards
    ``gpus`` (index order). With ``state_path`` the cards are file-backed (see module doc): an
    existing file's state wins over the given cards; a missing file is created from them."""
    if not gpus and gpu is None and state_path is not None and os.path.exists(state_path):
        # as many cards as the file holds (each worker of a multi-GPU run opens it this way)
        gpus = [FakeGPU() for _ in load_cards(state_path)]
    cards = list(gpus) if gpus else [gpu or FakeGPU()]
    g0 = cards[0]
    errors = _error_classes()
    NVMLError = errors["NVMLError"]
    consts = _constants()
    handles = [object() for _ in cards]
    hooks: list[list[Any]] = []       # [name|None, nth, callback]
    failures: list[list[Any]] = []    # [name, first, last, code]
    counts: dict[str | None, int] = {}

    loaded: list[Any] = [None]     # the card state as last loaded or saved (skip no-op saves)
    depth = [0]                    # nesting of _atomic() in this process

    @contextlib.contextmanager
    def _atomic():
        """Hold the file-backed cards' flock (re-entrant within this process)."""
        if state_path is None or depth[0] > 0:
            depth[0] += 1
            try:
                yield
            finally:
                depth[0] -= 1
            return
        # A real NVML call is one C call: no Python signal handler runs inside it. This one
        # takes an flock, so a handler that ran inside it (restoring()'s, which calls the fake
        # again) would wait on the flock its own process holds, forever (seen once in CI: a
        # Ctrl-C to a multi-GPU run landing between the flock and the depth count). Shielded,
        # the handler runs when the call has returned, as it would on a real GPU.
        with shielded():
            fd = os.open(f"{os.fspath(state_path)}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                         0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                depth[0] += 1
                try:
                    yield
                finally:
                    depth[0] -= 1
            finally:
                os.close(fd)           # drops the flock

    def _load() -> None:
        if state_path is None:
            return
        try:
            states = load_cards(state_path)
        except FileNotFoundError:
            _save(force=True)
            return
        for c, s in zip(cards, states):
            c.load_card_state(s)
        loaded[0] = [c.card_state() for c in cards]

    def _save(force: bool = False) -> None:
        if state_path is None:
            return
        now = [c.card_state() for c in cards]
        if force or now != loaded[0]:
            save_cards(state_path, cards)
            loaded[0] = now

    def _locked(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            with _atomic():
                return fn(*args)
        return run

    def _count(name: str) -> int:
        counts[name] = counts.get(name, 0) + 1
        counts[None] = counts.get(None, 0) + 1
        return counts[name]

    def _enter(name: str, *args: Any) -> None:
        g0.calls.append((name, args))
        n = counts.get(name, 0)
        for fname, first, last, code in failures:
            if fname == name and first <= n <= last:
                raise NVMLError(code)
        if name in g0.fail:
            raise NVMLError(g0.fail[name])
        if name not in ("nvmlInit", "nvmlInitWithFlags") and g0.initialized <= 0:
            raise NVMLError(consts.get("NVML_ERROR_UNINITIALIZED", 1))

    def _card(h: Any) -> FakeGPU:
        for c, hh in zip(cards, handles):
            if h is hh:
                if c.lost:
                    raise NVMLError(consts.get("NVML_ERROR_GPU_IS_LOST", 15))
                return c
        raise NVMLError(consts.get("NVML_ERROR_INVALID_ARGUMENT", 2))

    def api(fn: Callable[..., Any]) -> Callable[..., Any]:
        """Load state, count, inject failures, run, save, run hooks — keeping fn's signature."""

        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            sig.bind(*args, **kwargs)     # a wrong call signature is a TypeError, as in pynvml
            name = fn.__name__
            with _atomic():               # one atomic call, as in NVML
                _load()
                n = _count(name)
                n_any = counts[None]
                try:
                    _enter(name, *args)
                    result = fn(*args, **kwargs)
                finally:
                    _save()
            for hname, nth, cb in list(hooks):
                if (hname == name and nth == n) or (hname is None and nth == n_any):
                    cb()
            return result

        return wrapper

    @api
    def nvmlInit():
        g0.initialized += 1

    @api
    def nvmlShutdown():
        g0.initialized -= 1

    @api
    def nvmlSystemGetDriverVersion():
        return "570.86.15"

    @api
    def nvmlDeviceGetCount():
        return len(cards)

    @api
    def nvmlDeviceGetHandleByIndex(index):
        if not 0 <= index < len(cards):
            raise NVMLError(consts.get("NVML_ERROR_INVALID_ARGUMENT", 2))
        return handles[index]

    @api
    def nvmlDeviceGetHandleByUUID(uuid):
        u = uuid.decode() if isinstance(uuid, bytes) else uuid
        for c, h in zip(cards, handles):
            if c.uuid == u:
                return h
        raise NVMLError(consts.get("NVML_ERROR_NOT_FOUND", 6))

    @api
    def nvmlDeviceGetUUID(handle):
        return _card(handle).uuid

    @api
    def nvmlDeviceGetName(handle):
        return _card(handle).name

    @api
    def nvmlDeviceGetTotalEnergyConsumption(handle):
        g = _card(handle)
        g.advance(g.energy_read_cost_s)
        return g.counter_mj

    @api
    def nvmlDeviceGetSupportedMemoryClocks(handle):
        return list(_card(handle).mem_clocks)

    @api
    def nvmlDeviceGetSupportedGraphicsClocks(handle, memoryClockMHz):
        g = _card(handle)
        if memoryClockMHz not in g.mem_clocks:
            raise NVMLError(consts.get("NVML_ERROR_NOT_FOUND", 6))
        return list(g.sm_clocks)

    @api
    def nvmlDeviceSetGpuLockedClocks(handle, minGpuClockMHz, maxGpuClockMHz):
        g = _card(handle)
        g.locked_sm, g.sm_locked_at_s = (minGpuClockMHz, maxGpuClockMHz), g.t

    @api
    def nvmlDeviceResetGpuLockedClocks(handle):
        _card(handle).locked_sm = None

    @api
    def nvmlDeviceSetMemoryLockedClocks(handle, minMemClockMHz, maxMemClockMHz):
        g = _card(handle)
        g.locked_mem, g.mem_locked_at_s = (minMemClockMHz, maxMemClockMHz), g.t

    @api
    def nvmlDeviceResetMemoryLockedClocks(handle):
        _card(handle).locked_mem = None

    @api
    def nvmlDeviceSetPowerManagementLimit(handle, limit):
        g = _card(handle)
        if not g.limit_range_mw[0] <= limit <= g.limit_range_mw[1]:
            raise NVMLError(consts.get("NVML_ERROR_INVALID_ARGUMENT", 2))
        g.limit_mw = int(limit)

    @api
    def nvmlDeviceGetPowerManagementLimit(handle):
        return _card(handle).limit_mw

    @api
    def nvmlDeviceGetPowerManagementDefaultLimit(handle):
        return _card(handle).default_limit_mw

    @api
    def nvmlDeviceGetPowerManagementLimitConstraints(handle):
        return list(_card(handle).limit_range_mw)

    @api
    def nvmlDeviceGetTemperature(handle, sensor):
        return _card(handle).temperature_c

    @api
    def nvmlDeviceGetClockInfo(handle, type):  # noqa: A002 - pynvml's parameter name
        g = _card(handle)
        if type == consts.get("NVML_CLOCK_MEM", 2):
            settled = g.locked_mem and g.t - g.mem_locked_at_s >= g.clock_settle_s
            return g.locked_mem[1] if settled else g.mem_clocks[0]
        settled = g.locked_sm and g.t - g.sm_locked_at_s >= g.clock_settle_s
        return g.locked_sm[1] if settled else g.sm_clocks[0]

    @api
    def nvmlDeviceGetCurrentClocksEventReasons(handle):
        return _card(handle).event_reasons

    @api
    def nvmlDeviceGetNumGpuCores(device):
        return _card(device).cores

    @api
    def nvmlDeviceGetArchitecture(device):
        return _card(device).arch

    funcs = {f.__name__: f for f in [
        nvmlInit, nvmlShutdown, nvmlSystemGetDriverVersion, nvmlDeviceGetCount,
        nvmlDeviceGetHandleByIndex, nvmlDeviceGetHandleByUUID, nvmlDeviceGetUUID, nvmlDeviceGetName,
        nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetSupportedMemoryClocks,
        nvmlDeviceGetSupportedGraphicsClocks, nvmlDeviceSetGpuLockedClocks, nvmlDeviceResetGpuLockedClocks,
        nvmlDeviceSetMemoryLockedClocks, nvmlDeviceResetMemoryLockedClocks,
        nvmlDeviceSetPowerManagementLimit, nvmlDeviceGetPowerManagementLimit,
        nvmlDeviceGetPowerManagementDefaultLimit, nvmlDeviceGetPowerManagementLimitConstraints,
        nvmlDeviceGetTemperature, nvmlDeviceGetClockInfo, nvmlDeviceGetCurrentClocksEventReasons,
        nvmlDeviceGetNumGpuCores, nvmlDeviceGetArchitecture,
    ]}

    def after_call(name: str | None, callback: Callable[[], Any], nth: int = 1) -> None:
        """Run ``callback()`` inside call number ``nth`` of ``name`` (None: of any call, counted
        from this fake's creation) after its effect, before it returns."""
        hooks.append([name, int(nth), callback])

    def fail_calls(name: str, code: int, count: int = 1, start: int = 1) -> None:
        """Calls ``start`` .. ``start + count - 1`` of ``name`` raise ``NVMLError(code)``."""
        failures.append([name, int(start), int(start) + int(count) - 1, int(code)])

    if state_path is not None:
        _locked(_load)()
    mod = types.SimpleNamespace(**consts, **errors, **funcs)
    mod.gpu = g0
    mod.gpus = cards
    mod.time = _locked(lambda: (_load(), g0.t)[1])
    mod.sleep = _locked(lambda dt: (_load(), g0.advance(dt), _save()))
    mod.busy = _locked(lambda dt, power_w: (_load(), g0.advance(dt, power_w), _save()))
    mod.save = _locked(lambda: _save(force=True))   # after changing a file-backed card by hand

    def card(index: int) -> types.SimpleNamespace:
        """Card ``index``'s own clock: ``time()``, ``sleep(dt)`` (idle power) and
        ``busy(dt, power_w)``, as ``fake.time``/``sleep``/``busy`` are card 0's."""
        c = cards[int(index)]
        return types.SimpleNamespace(
            gpu=c,
            time=_locked(lambda: (_load(), c.t)[1]),
            sleep=_locked(lambda dt: (_load(), c.advance(dt), _save())),
            busy=_locked(lambda dt, power_w: (_load(), c.advance(dt, power_w), _save())))

    mod.card = card
    mod.after_call = after_call
    mod.fail_calls = fail_calls
    mod.call_count = lambda name=None: counts.get(name, 0)
    mod.FUNCTIONS = tuple(funcs)
    return mod


def install_fake_nvml(monkeypatch: Any, fake: Any) -> type:
    """Make ``measure.nvml`` use ``fake`` (its devices on the fake's own clock, no CUDA
    synchronize) for the rest of a test: what ``ecal ... --device nvml:N`` then opens is the
    fake card. Returns the patched ``NVMLDevice`` class (to open one by hand)."""
    import measure.nvml as mn

    monkeypatch.setattr(mn, "_load_pynvml", lambda: fake)

    class FakeClockNVML(mn.NVMLDevice):     # the fake card's clock instead of the wall clock
        def __init__(self, *a: Any, **kw: Any) -> None:
            kw.update(clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
            super().__init__(*a, **kw)

    monkeypatch.setattr(mn, "NVMLDevice", FakeClockNVML)
    return FakeClockNVML
