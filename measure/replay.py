"""Signatures from recorded tables, and a device that replays them.

Loaders (each returns ``dict[element, list[Signature]]``, one signature per operating point,
ω set as ``power_limit_w`` or ``sm_clock_mhz``):

=====================  =========================================  ================================
loader                 file                                       static power s (assumption)
=====================  =========================================  ================================
``load_h200``          ``h200/measurements.json``                 ready power in the file (≈123 W)
``load_zeus_trace``    ``zeus/nsdi23-traces/summary_power_*.csv``  ``static_power_w`` (default 0)
``load_zeus_profile``  ``zeus/profile_data/*.csv``                ``static_power_w`` per GPU (0)
``load_nvdvfs``        ``nv-dvfs/*.csv``                          ``static_power_w`` (default 0)
``load_perseus``       Perseus profile CSV                        ``p2p_power_w`` (default 75 W)
=====================  =========================================  ================================

``load_zeus_profile`` reads only the power-limit optimizer's windows and sums the GPUs;
:mod:`measure.zeus` reads ZeusMonitor logs of any window name (one element per window and
GPU) and the optimizer's JSON profiles, and exports plans to Zeus's pipeline frequency
optimizer.

None of the Zeus or NV-DVFS tables records idle power, so their default s = 0 counts all
energy as dynamic (E = d): fine for ⊗ and frontiers, but give the card's ready power when
composing in parallel. The assumption is written into each signature's ``meta``.
NV-DVFS data has no licence: it is read from ``../shared/data`` and never copied.

Every CSV is read as UTF-8 (a BOM is accepted; a binary or non-UTF-8 file is a
:class:`FormatError` naming it), and every number must be finite and > 0; an error names the
file, line and column. Rows are one per configuration, so a second row with the same key is an
error naming both lines, whether its values agree or conflict (a merged or concatenated file,
never silently averaged): the key is (dataset, network, batch size, optimizer, power limit) for
Zeus traces, (benchmark, kernel, argNo, core and memory clock) for NV-DVFS and (stage,
instruction, frequency) for Perseus. A Zeus optimizer log may profile a power limit more than
once: windows with the same name at different ``start_time`` are runs of one signature (mean
and variance of the mean); the same window at the same start time is a duplicate.

Files live under :func:`shared_data_dir` (``../shared/data`` next to the repository root;
``$ECAL_SHARED_DATA`` overrides): the one place that locates recorded data (``frontier`` only
parses what it is given). :func:`data_path` resolves a file there; a missing one is a clear
:class:`DeviceError`.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frontier.errors import FormatError
from frontier.files import CsvRow, check_unique_rows, csv_number, read_csv
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .device import Device, DeviceError, OperatingSet, ReadOnlyError, UnsupportedSettingError

Signatures = dict[str, list[Signature]]

#: Environment variable that overrides where the shared data folder is.
DATA_ENV = "ECAL_SHARED_DATA"
#: The real H200 measurements, relative to :func:`shared_data_dir` (see ``data/README.md``).
H200_MEASUREMENTS = "h200/measurements.json"


def shared_data_dir() -> Path:
    """The shared data folder: ``$ECAL_SHARED_DATA`` if set, else ``../shared/data`` next to
    the repository root. It may not exist (data is never bundled); :func:`data_path` says so."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


def data_path(relative: str | os.PathLike) -> Path:
    """A file under the shared data folder; :class:`DeviceError` naming it when missing."""
    p = Path(relative)
    if not p.is_absolute() and not p.exists():
        p = shared_data_dir() / p
    if not p.exists():
        raise DeviceError(f"recorded data not found: {p} (the shared data folder is "
                          f"{shared_data_dir()}; set {DATA_ENV} to point elsewhere)")
    return p


def _rows(path: Path, required: tuple[str, ...]) -> list[CsvRow]:
    # UTF-8 with or without BOM; binary/non-UTF-8 files and bad headers are FormatErrors.
    return read_csv(path, required)[1]


def _num(path: Path, row: CsvRow, col: str, positive: bool = True) -> float:
    """A finite number (> 0 when ``positive``, else >= 0); errors name file, line and column."""
    return csv_number(str(path), row, col, minimum=0.0, strict=positive)


def _assumption(s: float, what: str) -> str:
    return f"{what}: {s:g} W" if s else "none recorded: s = 0 W (all energy counted as dynamic)"


def _by_omega(groups: Mapping[tuple[str, OperatingPoint], list[tuple[float, float]]], s_w: float,
              meta: Mapping[str, Any], devices: frozenset[str] | None = None,
              device_of: Mapping[str, frozenset[str]] | None = None) -> Signatures:
    out: Signatures = defaultdict(list)
    for (name, omega), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        t = [r[0] for r in runs]
        e = [r[1] for r in runs]
        devs = (device_of or {}).get(name) or devices or frozenset({"gpu0"})
        out[name].append(Signature.from_runs(name, t, e, s_w=s_w * len(devs), omega=omega,
                                             devices=devs, meta=dict(meta)))
    return dict(out)


def load_h200(path: str | os.PathLike | None = None) -> Signatures:
    """The 16 H200 elements (per-invocation, variances of the mean over windows); s = ready power."""
    from frontier.h200 import element_signatures, load_measurements, static_power_w

    p = data_path(path or H200_MEASUREMENTS)
    data = load_measurements(p)
    s = static_power_w(data)
    return {name: [sig.with_(meta={**sig.meta, "static_power_assumption":
                                   _assumption(s, "ready power with a context alive (data)"),
                                   "source_file": str(p)})]
            for name, sig in element_signatures(data, s).items()}


def load_zeus_trace(path: str | os.PathLike, static_power_w: float = 0.0) -> Signatures:
    """Zeus NSDI'23 power traces: per (dataset, network, batch size, optimizer), one signature
    per power limit: T = time per epoch, E = average power × T."""
    p = data_path(path)
    rows = _rows(p, ("dataset", "network", "batch_size", "optimizer", "power_limit", "time_per_epoch",
                     "average_power"))
    groups: dict[tuple[str, OperatingPoint], list[tuple[float, float]]] = defaultdict(list)
    keyed = []
    for r in rows:
        name = f"{r['dataset']}/{r['network']}/bs{r['batch_size']}/{r['optimizer']}"
        t = _num(p, r, "time_per_epoch")
        pw = _num(p, r, "average_power")
        limit = _num(p, r, "power_limit")
        keyed.append((r, (name, limit), f"{name} at {limit:g} W"))
        groups[(name, OperatingPoint(power_limit_w=limit))].append((t, pw * t))
    check_unique_rows(str(p), keyed, "configuration")
    return _by_omega(groups, static_power_w, {
        "source": "zeus-trace", "source_file": str(p), "unit": "one training epoch",
        "static_power_assumption": _assumption(static_power_w, "given")})


_LIMIT = re.compile(r"_(\d+(?:\.\d+)?)$")


def load_zeus_profile(path: str | os.PathLike, static_power_w: float = 0.0) -> Signatures:
    """Zeus power-limit-optimizer profile windows: element = file stem; one signature per power
    limit (the ``window_name`` suffix), from the repeated windows; energy summed over GPUs."""
    p = data_path(path)
    rows = _rows(p, ("window_name", "elapsed_time"))
    gpu_cols = [c for c in rows[0].cells if re.fullmatch(r"gpu\d+_energy", c)] if rows else []
    if not gpu_cols:
        raise FormatError(str(p), "header", "no gpuN_energy column")
    devs = frozenset(c.split("_")[0] for c in gpu_cols)
    groups: dict[tuple[str, OperatingPoint], list[tuple[float, float]]] = defaultdict(list)
    keyed = []
    for r in rows:
        m = _LIMIT.search(r["window_name"])
        if not m:
            raise FormatError(str(p), f"line {r.line}, column window_name",
                              f"no power limit suffix in {r['window_name']!r} (windows of any "
                              f"name, one element per GPU: `ecal import zeus-monitor`, "
                              f"measure.zeus.load_zeus_monitor_log)")
        e = sum(_num(p, r, c) for c in gpu_cols)
        # A window logged again later is another run of it; the same window at the same
        # start time (or, without start times, an identical row) is a duplicate.
        when = r.cells.get("start_time")
        key = (r["window_name"], when) if when is not None else tuple(sorted(r.cells.items()))
        keyed.append((r, key, f"{r['window_name']!r}" + (f" at start_time {when}" if when else "")))
        groups[(p.stem, OperatingPoint(power_limit_w=float(m.group(1))))].append((_num(p, r, "elapsed_time"), e))
    check_unique_rows(str(p), keyed, "window")
    return _by_omega(groups, static_power_w, {
        "source": "zeus-profile", "source_file": str(p), "unit": "one profiling window",
        "static_power_assumption": _assumption(static_power_w, "given, per GPU")}, devices=devs)


def load_nvdvfs(path: str | os.PathLike, static_power_w: float = 0.0) -> Signatures:
    """NV-DVFS benchmark CSV: per (benchmark, kernel, input), one signature per core clock
    (``time`` ms per run → s; E = average power × T). Read in place; never copied."""
    p = data_path(path)
    rows = _rows(p, ("benchmark", "kernel", "argNo", "core_frequency", "memory_frequency", "time",
                     "average_power"))
    groups: dict[tuple[str, OperatingPoint], list[tuple[float, float]]] = defaultdict(list)
    keyed = []
    for r in rows:
        name = f"{r['benchmark']}/{r['kernel']}/{r['argNo']}"
        t = _num(p, r, "time") / 1000.0
        om = OperatingPoint(sm_clock_mhz=_num(p, r, "core_frequency"),
                            mem_clock_mhz=_num(p, r, "memory_frequency"))
        keyed.append((r, (name, om.sm_clock_mhz, om.mem_clock_mhz),
                      f"{name} at {om.sm_clock_mhz:g}/{om.mem_clock_mhz:g} MHz"))
        groups[(name, om)].append((t, _num(p, r, "average_power") * t))
    check_unique_rows(str(p), keyed, "kernel and clocks")
    return _by_omega(groups, static_power_w, {
        "source": "nv-dvfs", "source_file": str(p), "unit": "one kernel run",
        "static_power_assumption": _assumption(static_power_w, "given")})


def load_perseus(path: str | os.PathLike, p2p_power_w: float = 75.0) -> Signatures:
    """Perseus profile CSV (``stage,instruction,frequency,time,energy``): element
    ``stage{i}/{instruction}`` on device ``gpu{i}``, one signature per SM clock. s is the
    P2P-blocking power (Perseus' "effective energy" subtracts it)."""
    p = data_path(path)
    rows = _rows(p, ("stage", "instruction", "frequency", "time", "energy"))
    groups: dict[tuple[str, OperatingPoint], list[tuple[float, float]]] = defaultdict(list)
    dev_of: dict[str, frozenset[str]] = {}
    keyed = []
    for r in rows:
        try:
            stage = int(r["stage"])
        except ValueError:
            raise FormatError(str(p), f"line {r.line}, column stage", f"not an integer: {r['stage']!r}") from None
        if stage < 0:
            raise FormatError(str(p), f"line {r.line}, column stage", f"must be >= 0, got {stage}")
        name = f"stage{stage}/{r['instruction'].strip()}"
        dev_of[name] = frozenset({f"gpu{stage}"})
        f = _num(p, r, "frequency")
        keyed.append((r, (name, f), f"{name} at {f:g} MHz"))
        groups[(name, OperatingPoint(sm_clock_mhz=f))].append(
            (_num(p, r, "time"), _num(p, r, "energy")))
    check_unique_rows(str(p), keyed, "stage, instruction and frequency")
    return _by_omega(groups, p2p_power_w, {
        "source": "perseus", "source_file": str(p), "unit": "one microbatch instruction",
        "static_power_assumption": _assumption(p2p_power_w, "P2P-blocking power")}, device_of=dev_of)


class ReplayWork(str):
    """Work for a :class:`ReplayDevice`: the name of a recorded element."""


class ReplayDevice(Device):
    """A device that replays recorded signatures in virtual time: ``run(name, n)`` advances
    time by n·T and energy by n·E of the signature recorded at the current ω (exact match),
    and its counter ticks every ``tick_s`` like NVML's. Idle time costs ``s`` of the data."""

    simulated = True

    def __init__(self, signatures: Signatures, name: str = "replay", tick_s: float = 0.1,
                 read_only: bool = False, idle_power_w: float | None = None):
        self.sigs = {k: list(v) for k, v in signatures.items()}
        if not self.sigs:
            raise DeviceError("ReplayDevice needs at least one recorded element")
        self.name = f"replay of {name}"
        self.read_only = read_only
        self.tick_s = tick_s
        self._t = self._e = self._counter = 0.0
        self._next_tick = tick_s
        omegas = [s.omega for v in self.sigs.values() for s in v]
        clocks = sorted({o.sm_clock_mhz for o in omegas if o.sm_clock_mhz is not None}, reverse=True)
        mems = sorted({o.mem_clock_mhz for o in omegas if o.mem_clock_mhz is not None}) or [0.0]
        limits = [o.power_limit_w for o in omegas if o.power_limit_w is not None]
        self._opset = OperatingSet({m or 1.0: tuple(clocks) for m in mems},
                                   (min(limits), max(limits)) if limits else (1.0, 1e9), sm_count=10**6)
        self._op = OperatingPoint()
        # Idle power: the data's static power; a nominal 1 W when the data records none, so
        # the counter still ticks while idle (tick-aligned windows need ticks).
        s_data = min(s.s_w for v in self.sigs.values() for s in v)
        self._s_w = idle_power_w if idle_power_w is not None else (s_data or 1.0)

    def _advance(self, dt: float, power_w: float) -> None:
        end = self._t + dt
        while self._next_tick <= end:
            self._counter = self._e + power_w * (self._next_tick - self._t)
            self._next_tick += self.tick_s
        self._e += power_w * dt
        self._t = end

    def energy_j(self) -> float:
        """Counter (ticks every ``tick_s``), J; a read costs 1 ms."""
        self._advance(0.001, self._s_w)
        return self._counter

    def time_s(self) -> float:
        """Virtual time, s."""
        return self._t

    def idle(self, duration_s: float) -> None:
        """Advance at the recorded static power."""
        self._advance(duration_s, self._s_w)

    def operating_set(self) -> OperatingSet:
        """The clocks and power limits present in the data."""
        return self._opset

    def get_operating_point(self) -> OperatingPoint:
        """The ω in force."""
        return self._op

    def set_operating_point(self, op: OperatingPoint) -> None:
        """Select a recorded ω (None knobs: leave as is)."""
        if self.read_only and op.dev != OperatingPoint():
            raise ReadOnlyError(f"{self.name} is read-only")
        if op.mem_clock_mhz is None and op.sm_clock_mhz is not None:
            if op.sm_clock_mhz not in next(iter(self._opset.sm_clocks_mhz.values())):
                raise UnsupportedSettingError(f"no recorded data at SM clock {op.sm_clock_mhz:g} MHz")
        else:
            self._opset.validate(op)
        self._op = op

    def restore(self) -> None:
        """Back to no particular ω."""
        self._op = OperatingPoint()

    def temperature_c(self) -> float:
        """Not recorded: NaN."""
        return float("nan")

    def clocks_mhz(self) -> dict[str, float]:
        """The ω in force (0 when unset)."""
        return {"sm": self._op.sm_clock_mhz or 0.0, "mem": self._op.mem_clock_mhz or 0.0}

    def throttle_reasons(self) -> tuple[str, ...]:
        """Not recorded."""
        return ()

    def lookup(self, element: str) -> Signature:
        """The recorded signature of ``element`` at the current ω (device knobs set so far)."""
        if element not in self.sigs:
            raise DeviceError(f"no recorded element {element!r}; recorded: {sorted(self.sigs)[:10]}...")
        want = self._op.dev
        for s in self.sigs[element]:
            o = s.omega
            if all(getattr(want, k) is None or getattr(want, k) == getattr(o, k)
                   for k in ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w")):
                return s
        raise UnsupportedSettingError(f"element {element!r} has no recording at {want.label()}")

    def run(self, work: Any, n: int = 1, sm_count: int | None = None) -> None:
        """Replay ``n`` invocations of the recorded element named ``work``."""
        s = self.lookup(str(work))
        self._advance(s.time_s * n, s.energy_j / s.time_s if s.time_s > 0 else self._s_w)

    def describe(self) -> dict[str, Any]:
        """Metadata: replayed data, not a live device."""
        return {"device": self.name, "simulated": True, "replay": True, "read_only": self.read_only}
