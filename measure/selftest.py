"""``ecal selftest``: does this GPU behave as the tool assumes? Read-only checks, one verdict each.

Run it first on a new GPU (``ecal selftest --device nvml:0``); it changes no device setting
(the device is opened read-only). Each check measures one number and holds it against what
the protocol or the algebra assumes (docs/selftest.md has the rules):

* ``counter_period``: how often the energy counter updates (the tick-aligned protocol assumes
  ticks of about 100 ms, several per window);
* ``counter_read_cost``: what one counter read costs (a read at each end of a window is its
  timing uncertainty);
* ``deep_idle_power``: power with no CUDA context of this process (measured first, before one
  exists; the simulator reports its model value) — ready power must not be taken from it;
* ``ready_power``: power idle with a context alive, over several windows (the ``s`` every
  signature subtracts), and how much the windows disagree;
* ``sequential_composite``: two elements characterized alone, their ⊗ predicted and the
  composite measured: Eq. 23 (:func:`frontier.deviation.deviation`);
* ``sm_split_scaling``: one element's time at several SM allocations, recorded as the counts
  the device grants (:func:`measure.sm_alloc.granted_sm_count`);
* ``sm_partitions``: whether a co-run's partitions are disjoint here (one split of the device)
  or may overlap (:func:`measure.sm_alloc.split_sms`).

Verdicts are ``pass``, ``warn``, ``fail`` or ``skipped`` (with why), each with the number
behind it. With ``write=True`` (``ecal selftest --write``, the device opened writable) the
checks of :mod:`measure.selftest_write` follow: the power cap on short windows and the switch
latency of each knob, with every setting journalled and restored after.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from frontier.errors import UnknownNameError
from frontier.formats import KINDS, content, validate

from .device import Device, DeviceError, FeatureUnavailableError
from .progress import ProgressCallback, ProgressEvent
from .protocol import (
    Protocol,
    measure_point,
    ready_power_windows_w,
    time_per_invocation_s,
    wait_for_tick,
)
from .selftest_check import Check, SelftestWorks, Verdict, jsonable

log = logging.getLogger(__name__)

#: The ``format`` key of a selftest JSON report.
FORMAT = KINDS["selftest"].tag
#: Worst first: the report's overall verdict is the worst of its checks (skipped aside).
SEVERITY = {"fail": 3, "warn": 2, "pass": 1, "skipped": 0}

#: The protocol the selftest characterizes with (the default windows, few repetitions).
SELFTEST_PROTOCOL = Protocol(window_s=0.6, warmup_s=0.2, target_rse=0.01, min_windows=3,
                             max_windows=8, ready_windows=3, ready_window_s=1.0)
#: Counter ticks timed by ``counter_period``.
TICKS = 6
#: Counter reads timed by ``counter_read_cost``.
READS = 20
#: SM requests of ``sm_split_scaling`` as fractions of the device (then granted by it).
SPLIT_FRACTIONS = (0.25, 0.5, 1.0)
#: Thresholds of the verdicts (docs/selftest.md).
PERIOD_PASS_S = (0.02, 0.25)
PERIOD_WARN_MAX_S = 1.0
READ_COST_PASS = 0.01          # of a window (the protocol's target relative error)
READ_COST_WARN = 0.05
READY_SPREAD_PASS = 0.02       # relative spread of ready-power windows
READY_SPREAD_WARN = 0.05
DEEP_IDLE_MARGIN_W = 3.0       # ready power above deep idle by at least this
SCALING_BAND = (0.8, 1.25)     # T(n)·n / (T(all)·all) for a compute-bound element
COMPOSITE_WARN_PCT = 1.0       # a flagged composite within this of its prediction: warn


@dataclass(frozen=True)
class SelftestReport:
    """The checks of one selftest, the device they ran on, and how long it took."""

    device: Mapping[str, Any]
    checks: tuple[Check, ...]
    device_time_s: float = 0.0
    real_time_s: float = 0.0
    #: False when the write checks ran (settings were changed, then restored).
    read_only: bool = True

    @property
    def verdict(self) -> Verdict:
        """The worst verdict of the checks that ran (``skipped`` when none ran)."""
        return max((c.verdict for c in self.checks), key=SEVERITY.__getitem__, default="skipped")

    @property
    def ok(self) -> bool:
        """No check failed."""
        return all(c.verdict != "fail" for c in self.checks)

    def check(self, name: str) -> Check:
        """The check called ``name``."""
        for c in self.checks:
            if c.name == name:
                return c
        raise UnknownNameError(name)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (``format`` = :data:`FORMAT`; fields in docs/selftest.md)."""
        return {"format": FORMAT, "device": jsonable(dict(self.device)),
                "simulated": bool(self.device.get("simulated")), "read_only": self.read_only,
                "verdict": self.verdict, "ok": self.ok,
                "verdicts": {c.name: c.verdict for c in self.checks},
                "checks": [c.to_dict() for c in self.checks],
                "device_time_s": self.device_time_s, "real_time_s": self.real_time_s,
                "write_checks": ("ran: settings changed, then restored" if not self.read_only
                                 else "not run: pass --write for the switch latency per knob "
                                      "and the power cap on short windows")}

    def to_table(self) -> str:
        """A printable table: one line per check, then the overall verdict."""
        dev = self.device.get("device", "?")
        mode = "read-only" if self.read_only else "--write: settings changed, then restored"
        head = f"selftest of {dev}{'  [SIMULATED]' if self.device.get('simulated') else ''} ({mode})"
        rows = [("check", "verdict", "value", "detail")]
        for c in self.checks:
            rows.append((c.name, c.verdict.upper() if c.verdict == "fail" else c.verdict,
                         _fmt(c.value, c.unit), c.detail))
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [head] + ["  ".join([r[0].ljust(w[0]), r[1].ljust(w[1]), r[2].rjust(w[2]), r[3]]).rstrip()
                          for r in rows]
        lines.append(f"verdict: {self.verdict}  ({self.device_time_s:.1f} s of device time, "
                     f"{self.real_time_s:.1f} s real)")
        return "\n".join(lines)


def load_selftest_report(path: str | os.PathLike) -> dict[str, Any]:
    """Read a selftest JSON report (``ecal selftest -o``), checked against its model
    (:class:`frontier.format_models.SelftestReport`); errors are one-line
    :class:`~frontier.errors.FormatError` naming the file and the field."""
    from frontier.files import read_json
    from frontier.format_models import SelftestReport

    file = os.fspath(path)
    doc = read_json(file)
    _, body = content(file, doc, "selftest")
    validate(SelftestReport, body, file)
    return dict(doc)


def _fmt(v: float | None, unit: str) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    if unit == "s" and abs(v) < 1.0:
        return f"{v * 1e3:.3g} ms"
    return f"{v:.4g} {unit}".strip()


def _worst(*verdicts: Verdict) -> Verdict:
    return max(verdicts, key=SEVERITY.__getitem__)


# -- the checks ---------------------------------------------------------------------------------

def check_counter_period(device: Device, protocol: Protocol = SELFTEST_PROTOCOL,
                         ticks: int = TICKS) -> Check:
    """Median time between energy-counter updates, s."""
    assumption = "the energy counter updates every ~100 ms (several ticks per window)"
    try:
        stamps = [wait_for_tick(device, protocol.tick_timeout_s, protocol.poll_s)[0]
                  for _ in range(ticks + 1)]
    except DeviceError as exc:
        return Check("counter_period", assumption, "fail", detail=str(exc))
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    period = statistics.median(gaps)
    lo, hi = PERIOD_PASS_S
    verdict: Verdict = ("pass" if lo <= period <= hi else
                        "warn" if period <= PERIOD_WARN_MAX_S else "fail")
    detail = f"median of {len(gaps)} tick gaps ({min(gaps) * 1e3:.0f}–{max(gaps) * 1e3:.0f} ms)"
    if verdict != "pass":
        detail += f"; outside {lo * 1e3:.0f}–{hi * 1e3:.0f} ms: use windows of >= 6 periods"
    return Check("counter_period", assumption, verdict, period, "s", detail,
                 {"period_s": period, "gaps_s": gaps})


def check_counter_read_cost(device: Device, protocol: Protocol = SELFTEST_PROTOCOL,
                            reads: int = READS) -> Check:
    """Device time one ``energy_j()`` read takes, s, against the window length."""
    assumption = f"a counter read costs under {READ_COST_PASS:.0%} of a {protocol.window_s:g} s window"
    t0 = device.time_s()
    for _ in range(reads):
        device.energy_j()
    cost = (device.time_s() - t0) / reads
    share = cost / protocol.window_s
    verdict: Verdict = ("pass" if share <= READ_COST_PASS else
                        "warn" if share <= READ_COST_WARN else "fail")
    return Check("counter_read_cost", assumption, verdict, cost, "s",
                 f"{share:.2%} of a {protocol.window_s:g} s window ({reads} reads)",
                 {"read_cost_s": cost, "share_of_window": share, "reads": reads})


def measure_deep_idle(device: Device, protocol: Protocol = SELFTEST_PROTOCOL) -> tuple[float, str]:
    """(deep-idle power W, source): the simulator's model value (``"model"``: it has no state
    without a context), else the idle slope measured now, before this process made a CUDA
    context (``"measured_before_context"``)."""
    model = getattr(device, "deep_idle_power_w", None)
    if getattr(device, "simulated", False) and callable(model):
        return float(model()), "model"
    return statistics.fmean(ready_power_windows_w(device, protocol)), "measured_before_context"


def check_ready_power(device: Device, protocol: Protocol = SELFTEST_PROTOCOL) -> Check:
    """Ready power over ``protocol.ready_windows`` windows, W, and their relative spread."""
    assumption = "ready power is steady: its windows agree within 2 %"
    try:
        powers = ready_power_windows_w(device, protocol)
    except DeviceError as exc:
        return Check("ready_power", assumption, "fail", unit="W", detail=str(exc))
    mean = statistics.fmean(powers)
    spread = (max(powers) - min(powers)) / mean if mean > 0 else math.inf
    verdict: Verdict = ("fail" if not mean > 0 else "pass" if spread <= READY_SPREAD_PASS else
                        "warn" if spread <= READY_SPREAD_WARN else "fail")
    return Check("ready_power", assumption, verdict, mean, "W",
                 f"{len(powers)} windows of {protocol.ready_window_s:g} s, spread {spread:.2%}",
                 {"ready_power_w": mean, "windows_w": powers, "spread": spread})


def check_deep_idle(deep_w: float, source: str, ready_w: float | None, has_context: bool) -> Check:
    """Deep idle against ready power: ready power must not be taken from an idle GPU."""
    assumption = f"ready power (context alive) is above deep idle by >= {DEEP_IDLE_MARGIN_W:g} W"
    data = {"deep_idle_power_w": deep_w, "source": source, "ready_power_w": ready_w}
    if ready_w is None:
        return Check("deep_idle_power", assumption, "skipped", deep_w, "W",
                     "no ready power to compare with", data)
    gap = ready_w - deep_w
    data["ready_minus_deep_idle_w"] = gap
    where = "simulator's model" if source == "model" else "measured before a CUDA context"
    if gap >= DEEP_IDLE_MARGIN_W:
        return Check("deep_idle_power", assumption, "pass", deep_w, "W",
                     f"{where}; ready is {gap:.1f} W above it", data)
    why = ("no CUDA context in this process (torch absent): the 'ready' windows saw the idle GPU"
           if not has_context else "another process may hold a context, or the GPU never idles deeper")
    return Check("deep_idle_power", assumption, "warn", deep_w, "W",
                 f"{where}; ready is only {gap:.1f} W above it: {why}", data)


def check_sequential_composite(device: Device, works: SelftestWorks | None, ready_w: float | None,
                               protocol: Protocol = SELFTEST_PROTOCOL, alpha: float = 0.05) -> Check:
    """Characterize ``a`` and ``b`` alone, predict ``a ⊗ b``, measure it: Eq. 23."""
    from frontier.compose import seq
    from frontier.deviation import deviation

    assumption = "a sequential composite is the ⊗ of its elements (Eq. 23 at α = 0.05)"
    if works is None:
        return Check("sequential_composite", assumption, "skipped",
                     detail="skipped: needs work to run on the GPU (torch >= 2.9 for nvml:N)")
    name = f"{works.a_name};{works.b_name}"
    a, b, meas = (_point(device, w, n, protocol, ready_w) for w, n in
                  ((works.a, works.a_name), (works.b, works.b_name), (works.seq, name)))
    r = deviation(seq(a, b, name=name), meas, alpha=alpha, name=name)
    worst_pct = max(abs(r.error_time_pct), abs(r.error_energy_pct))
    verdict: Verdict = ("pass" if not r.flagged else
                        "warn" if worst_pct <= COMPOSITE_WARN_PCT else "fail")
    detail = (f"T {r.error_time_pct:+.2f} % (z={r.z_time:+.2f}), E {r.error_energy_pct:+.2f} % "
              f"(z={r.z_energy:+.2f}), c_α={r.c_alpha:.2f}")
    if verdict == "warn":
        detail += (f"; flagged, but within {COMPOSITE_WARN_PCT:g} %: the windows' spread "
                   "understates point-to-point spread here")
    capped = _capped_elements(device, {works.a_name: a, works.b_name: b})
    if r.flagged and capped and r.error_time_pct < 0:
        # Seen on a real H200 (docs/selftest.md): the cap limits average power, so a capped
        # element clocks higher beside lower-power work and the composite runs faster than ⊗.
        detail += (f"; {', '.join(capped)} at the power limit: the cap is a time average, so "
                   "beside lower-power work it clocks higher (the composite runs faster and "
                   "draws more than ⊗ predicts); measure such pairs (ecal check --pairs)")
    return Check("sequential_composite", assumption, verdict, r.error_energy_pct, "%", detail,
                 {"deviation": r.to_dict(), "capped": capped, "elements": {
                     works.a_name: {"time_s": a.time_s, "energy_j": a.energy_j},
                     works.b_name: {"time_s": b.time_s, "energy_j": b.energy_j}}})


#: An element whose board power is at least this share of the power limit is called capped.
CAPPED_SHARE = 0.95


def _capped_elements(device: Device, points: dict[str, Any]) -> list[str]:
    """Names of the elements whose board power (a point's energy is the board's, E/T) reaches
    :data:`CAPPED_SHARE` of the device's power limit; [] where the limit is unknown."""
    try:
        limit_w = device.get_operating_point().power_limit_w
    except Exception:  # noqa: BLE001 - a diagnosis only; a device without a readable limit
        return []
    if not limit_w:
        return []
    return [n for n, s in points.items()
            if s.time_s > 0 and s.energy_j / s.time_s >= CAPPED_SHARE * limit_w]


def _point(device: Device, work: Any, name: str, protocol: Protocol, ready_w: float | None) -> Any:
    """One point from the null context, as a sweep measures it (``seed_point`` first: on the
    simulator the same start state for every point; a no-op on a real GPU)."""
    device.seed_point(f"selftest {name}")
    return measure_point(device, work, name, protocol, ready_w=ready_w)


def split_counts(device: Device, fractions: Sequence[float] = SPLIT_FRACTIONS) -> list[int]:
    """SM requests at ``fractions`` of the device, deliberately not multiples of the
    granularity (so the granted counts differ where the hardware rounds)."""
    total = device.operating_set().sm_count
    out = []
    for f in fractions:
        n = total if f >= 1 else max(1, int(round(total * f)) + 1)
        if n not in out:
            out.append(n)
    return out


def _split_unavailable(device: Device) -> str | None:
    """Why SM allocation cannot run here (None when it can)."""
    if getattr(device, "simulated", False):
        return None
    from .sm_alloc import available, green_context_class

    if available():
        return None
    try:
        green_context_class()
    except FeatureUnavailableError as exc:
        return str(exc)
    return "green contexts are not available"   # pragma: no cover - available() said no


def check_sm_split_scaling(device: Device, works: SelftestWorks | None) -> Check:
    """Time of ``a`` per invocation at several SM allocations, as granted."""
    from .sm_alloc import granted_sm_count

    assumption = ("an SM request runs on the count the device grants (recorded), and a "
                  "compute-bound element's T·n stays within 0.8–1.25× of the whole device's")
    why = _split_unavailable(device)
    if works is None or why is not None:
        reason = why or "needs work to run on the GPU"
        return Check("sm_split_scaling", assumption, "skipped",
                     detail=f"skipped: needs torch >= 2.9 ({reason})")
    total = device.operating_set().sm_count
    rows: list[dict[str, Any]] = []
    for n in split_counts(device):
        granted = granted_sm_count(device, n)
        t = time_per_invocation_s(device, works.a, sm_count=None if n >= total else n)
        rows.append({"requested": n, "granted": granted, "time_s": float(t)})
    full = rows[-1]
    ratios = [r["time_s"] * r["granted"] / (full["time_s"] * full["granted"]) for r in rows]
    for r, q in zip(rows, ratios):
        r["t_times_n_ratio"] = q
    monotone = all(a["time_s"] >= b["time_s"] for a, b in zip(rows, rows[1:]))
    lo, hi = SCALING_BAND
    verdict: Verdict = ("fail" if not monotone else
                        "pass" if all(lo <= q <= hi for q in ratios) else "warn")
    worst = max(ratios, key=lambda q: abs(math.log(q)) if q > 0 else math.inf)
    grants = ", ".join(f"{r['requested']}→{r['granted']}" for r in rows)
    detail = f"granted {grants}; T·n ratios {', '.join(f'{q:.2f}' for q in ratios)}"
    if not monotone:
        detail += "; more SMs did not run faster"
    return Check("sm_split_scaling", assumption, verdict, worst, "x", detail,
                 {"points": rows, "granularity": device.operating_set().sm_granularity})


def check_sm_partitions(device: Device) -> Check:
    """Whether two co-run partitions of about half the device are disjoint here."""
    from .sm_alloc import split_sms

    assumption = "a co-run's SM partitions are disjoint (one split of the device)"
    if getattr(device, "simulated", False):
        return Check("sm_partitions", assumption, "skipped",
                     detail="skipped: the simulator has no green contexts (its partitions are disjoint by construction)")
    why = _split_unavailable(device)
    if why is not None:
        return Check("sm_partitions", assumption, "skipped", detail=f"skipped: needs torch >= 2.9 ({why})")
    ops = device.operating_set()
    half = max(1, (ops.sm_count // 2 // max(1, ops.sm_granularity)) * max(1, ops.sm_granularity))
    index = int(getattr(device, "cuda_index", 0))
    try:
        split = split_sms([half - 1, half - 1], device_index=index, granularity=ops.sm_granularity,
                          sm_total=ops.sm_count)
    except FeatureUnavailableError as exc:
        return Check("sm_partitions", assumption, "fail", detail=str(exc))
    verdict: Verdict = "pass" if split.disjoint else "warn"
    return Check("sm_partitions", assumption, verdict, float(sum(split.granted)), "SM",
                 f"{split.method}: granted {'+'.join(map(str, split.granted))}"
                 + ("" if split.disjoint else "; OVERLAPPING (install cuda-python for a disjoint split)"),
                 split.to_dict())


# -- the whole selftest ----------------------------------------------------------------------

def sim_works() -> SelftestWorks:
    """The simulator's works: flash attention (compute-bound, under the power cap) and a
    2 GiB copy. (The simulated GEMM runs at the cap, whose clock wander the windows' variance
    does not carry: a check of ⊗ would measure the cap.)"""
    from .sim import preset

    a, b = preset("attention_flash"), preset("copy_2GiB")
    return SelftestWorks(a, b, [a, b], "attention_flash", "copy_2GiB")


def torch_works(device_index: int = 0, n: int = 4096, copy_bytes: int = 256 * 2**20) -> SelftestWorks | None:
    """Real work with torch on CUDA device ``device_index`` (a bf16 GEMM and a copy); None
    when torch or CUDA is missing. Creating the tensors creates this process's CUDA context."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dev = f"cuda:{device_index}"
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    src = torch.empty(copy_bytes // 4, device=dev, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)

    def gemm() -> None:
        torch.matmul(x, y, out=out)

    def copy() -> None:
        dst.copy_(src)

    def both() -> None:
        gemm()
        copy()

    return SelftestWorks(gemm, copy, both, f"gemm_bf16_{n}", f"copy_{copy_bytes >> 20}MiB")


def default_works(device: Device) -> Callable[[], SelftestWorks | None]:
    """How to make the works on ``device`` (called after deep idle is measured)."""
    if getattr(device, "simulated", False):
        return sim_works
    return lambda: torch_works(int(getattr(device, "cuda_index", 0)))


#: The stages :func:`run_selftest` reports, in order (one progress event before each).
STAGES = ("counter_period", "counter_read_cost", "deep_idle_power", "ready_power",
          "sequential_composite", "sm_split_scaling")
#: The stages ``write=True`` adds after them.
WRITE_STAGES = ("power_cap_windows", "switch_latency")


def run_selftest(device: Device, works: SelftestWorks | Callable[[], SelftestWorks | None] | None = None,
                 protocol: Protocol = SELFTEST_PROTOCOL,
                 progress: ProgressCallback | None = None, write: bool = False) -> SelftestReport:
    """Run every read-only check on ``device`` (nothing is set on it), in this order: counter
    period and read cost, deep idle (before any work, so before this process's CUDA context
    on a real GPU), then the works are made (``works``: given, a factory, or None for the
    device's default: simulator presets, or torch GEMM + copy), ready power, the sequential
    composite, SM-split scaling and SM partitions.

    ``progress`` (default: none) gets a :class:`~measure.progress.ProgressEvent` as each stage
    of :data:`STAGES` starts (``operation="selftest"``, ``done`` = stages finished, the line
    ``selftest: STAGE ...``).

    ``write`` (default False): then the checks of :mod:`measure.selftest_write` (stages
    :data:`WRITE_STAGES`) run last, changing settings and restoring them (``device`` must be
    writable)."""
    t_dev, t_real = device.time_s(), time.monotonic()
    stages = STAGES + (WRITE_STAGES if write else ())

    def say(stage: str) -> None:
        if progress is not None:
            progress(ProgressEvent(stages.index(stage), len(stages), stage,
                                   time.monotonic() - t_real, operation="selftest",
                                   message=f"selftest: {stage} ..."))

    checks: list[Check] = []
    device.seed_point("selftest")
    for fn in (check_counter_period, check_counter_read_cost):
        say(fn.__name__.removeprefix("check_"))
        checks.append(fn(device, protocol))
    say("deep_idle_power")
    deep_w, source = measure_deep_idle(device, protocol)
    made: SelftestWorks | None
    if isinstance(works, SelftestWorks):
        made = works
    elif works is not None:
        made = works()                    # a factory
    else:
        made = default_works(device)()
    say("ready_power")
    ready = check_ready_power(device, protocol)
    ready_w = ready.value if ready.value is not None and ready.value > 0 else None
    checks.append(check_deep_idle(deep_w, source, ready_w, has_context=made is not None))
    checks.append(ready)
    say("sequential_composite")
    checks.append(check_sequential_composite(device, made, ready_w, protocol))
    say("sm_split_scaling")
    checks.append(check_sm_split_scaling(device, made))
    checks.append(check_sm_partitions(device))
    if write:
        from .selftest_write import run_write_checks

        checks.extend(run_write_checks(device, made, ready_w, protocol, say))
    return SelftestReport(device.describe(), tuple(checks), device.time_s() - t_dev,
                          time.monotonic() - t_real, read_only=not write)
