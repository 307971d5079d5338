"""Measure the mutual context-insensitivity tests of element pairs on a device (spec §6.2).

An element here is work run as one unit: ``n`` back-to-back invocations of a kernel on
``sm_count`` SMs (:class:`PairElement`). For a pair (e₁, e₂) this module measures

* e₁ alone and e₂ alone, each window starting in the **null context**;
* **entry**: e₂ right after e₁ — each window starts in the null context, runs e₁ unmeasured,
  then measures e₂'s window only (same invocations per window as e₂ alone);
* **runtime**: e₁ ∥ e₂ started together — on one device through
  ``SimulatedGPU.run_parallel`` with the elements' SM split, on two devices each on its own
  device over the same interval (the one that finishes first idles at ready power until the
  other is done, as ⊕multi charges it);

and hands them to :mod:`frontier.insensitivity`, which decides.

**Why e₂'s own window, not e₁⊗e₂ minus e₁.** The spec's entry test compares X₂(φ) with
X₂(φ_null) (§6.2). Measuring e₂'s window directly keeps e₁'s noise out of the comparison
(the difference method adds σ²(e₁⊗e₂) + σ²(e₁) to it, and e₁ is usually the long, hot
element) and makes the reference and the test arm differ in one thing only: whether e₁ ran
before the window. The cost: a tick-aligned window starts at the counter's next tick, so e₂
starts up to one tick (≤ 127 ms on the H200; NVML's ~100 ms) after e₁ ends. Entry mechanisms
much slower than that (thermal: τ ≈ seconds) are kept; microsecond power-delivery transients
are not resolvable by a 100 ms counter either way. The tail of e₂'s window is corrected with
the null-context ready power; after a hot e₁ the true ready power is slightly higher, which
biases the entry arm up by at most ΔP_ready × tail — the same sign as the effect it measures.

**Null context.** Before every window the device is put into the null context:
``device.seed_point(key)`` (on the simulator: ready, idle, uncapped, at the steady ready
temperature, noise reseeded from seed and key; a no-op elsewhere) and the protocol's
cooldown (:func:`measure.protocol.null_context`, what a real GPU needs). Every window is
therefore an independent draw and a measurement is a function of (seed, key) alone.

Same-device co-runs need ``run_parallel`` (the simulator's; on a real GPU this takes green
contexts and streams, which :mod:`measure.sm_alloc` does not yet drive for pairs): a device
without it raises :class:`~measure.device.DeviceError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from frontier.errors import CompositionError, InputError
from frontier.insensitivity import PairVerdict, entry_test, runtime_test
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .device import Device, DeviceError
from .protocol import (
    Protocol,
    measure_ready_power_w,
    measure_window,
    null_context,
    relative_se,
    time_per_invocation_s,
    wait_for_tick,
)
from .sim import SimKernel

#: Short windows (the pair tests run four arms), a fixed 8 of them: stopping early once a
#: 3-window standard error looks small would underestimate σ and so reject insensitive pairs
#: more often than α says. 8 windows of 0.2 s resolve per-mille effects on the simulator (an
#: insensitivity test is only informative when the instrument resolves the effect, spec §3.4).
PAIR_PROTOCOL = Protocol(window_s=0.2, min_windows=8, max_windows=8, warmup_s=0.05)


@dataclass(frozen=True)
class PairElement:
    """One element of a pair: ``n`` invocations of ``kernel`` on ``sm_count`` SMs (None: the
    whole device) on the workload device ``device``."""

    name: str
    kernel: SimKernel
    n: int = 1
    sm_count: int | None = None
    device: str = "gpu0"

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, SimKernel):
            raise CompositionError(f"element {self.name!r}: kernel must be a SimKernel")
        if int(self.n) < 1:
            raise CompositionError(f"element {self.name!r}: n must be >= 1, got {self.n}")
        if self.sm_count is not None and int(self.sm_count) < 1:
            raise CompositionError(f"element {self.name!r}: sm_count must be >= 1, got {self.sm_count}")

    def stream(self) -> tuple[SimKernel, int, int | None]:
        """The ``(kernel, n, sm_count)`` stream ``run_parallel`` takes."""
        return (self.kernel, int(self.n), self.sm_count)

    def work(self, device: Device) -> Callable[[], None]:
        """One invocation of the element on ``device`` (a callable ``run`` accepts)."""
        k, n, sm = self.stream()
        return lambda: device.run(k, n, sm_count=sm)

    @property
    def omega(self) -> OperatingPoint:
        """The element's ω_elem (its SM allocation)."""
        return OperatingPoint(sm_count=self.sm_count)


def _invocations(device: Device, work: Any, protocol: Protocol) -> int:
    """Invocations per window: a timed trial sized to ``protocol.window_s`` (after warm-up)."""
    if protocol.warmup_s > 0:
        t1 = time_per_invocation_s(device, work)
        device.run(work, max(1, math.ceil(protocol.warmup_s / t1)))
    t1 = time_per_invocation_s(device, work)
    return max(1, math.ceil(protocol.window_s / t1))


def measure_null(device: Device, work: Any, name: str, key: str, protocol: Protocol,
                 ready_w: float, before: Any = None, n: int | None = None,
                 devices: frozenset[str] = frozenset({"gpu0"}),
                 omega: OperatingPoint = OperatingPoint(),
                 meta: Mapping[str, Any] | None = None) -> tuple[Signature, int]:
    """Measure ``work`` with every window started in the null context; returns the signature
    (variances of the mean over windows) and the invocations per window.

    ``before``: work run unmeasured after the null context and before each window (the
    entry-context arm); ``n``: invocations per window (default: sized by a timed trial)."""
    device.seed_point(f"{key}/trial")
    if n is None:
        n = _invocations(device, work, protocol)
    times: list[float] = []
    energies: list[float] = []
    while len(times) < protocol.max_windows:
        device.seed_point(f"{key}/window{len(times)}")
        null_context(device, protocol)
        if before is not None:
            device.run(before, 1)
        w = measure_window(device, work, n, protocol, ready_w)
        times.append(w.time_per_invocation_s)
        energies.append(w.energy_per_invocation_j)
        if len(times) >= protocol.min_windows and relative_se(energies) <= protocol.target_rse:
            break
    m = dict(meta or {})
    m.update(device.describe())
    m.update(protocol="tick_aligned null-context windows", protocol_settings=protocol.to_dict(),
             invocations_per_window=n, windows=len(times), ready_power_w=ready_w,
             rse_energy=relative_se(energies), key=key,
             variance="of the mean over windows of per-invocation values")
    sig = Signature.from_runs(name, times, energies, s_w=ready_w, devices=devices, omega=omega,
                              meta=m)
    return sig, n


def _ready(device: Device, key: str, protocol: Protocol) -> float:
    device.seed_point(f"{key}/ready")
    return measure_ready_power_w(device, protocol)


def _co_run(device: Device, a: PairElement, b: PairElement) -> Callable[[], None]:
    runner = getattr(device, "run_parallel", None)
    if not callable(runner):
        raise DeviceError(f"{device.name}: same-device co-runs need run_parallel (the simulator's); "
                          f"cannot co-run {a.name!r} and {b.name!r} here")
    streams = [a.stream(), b.stream()]
    return lambda: runner(streams)


def _multi_windows(dev_a: Device, dev_b: Device, a: PairElement, b: PairElement, key: str,
                   protocol: Protocol, ready: tuple[float, float]) -> Signature:
    """e₁ on ``dev_a`` ∥ e₂ on ``dev_b`` over one interval per window: both counters are read
    tick-aligned around it and the device that finishes first idles at ready power until the
    other is done (⊕multi). T = the longer run, E = both devices' energies."""
    times: list[float] = []
    energies: list[float] = []
    while len(times) < protocol.max_windows:
        i = len(times)
        starts = []
        for dev, tag in ((dev_a, "a"), (dev_b, "b")):
            dev.seed_point(f"{key}/window{i}/{tag}")
            null_context(dev, protocol)
            starts.append(wait_for_tick(dev, protocol.tick_timeout_s, protocol.poll_s))
        runs = []
        for dev, el in ((dev_a, a), (dev_b, b)):
            t0 = dev.time_s()
            dev.run(el.work(dev), 1)
            runs.append(dev.time_s() - t0)
        span = max(runs)
        total_e = 0.0
        for dev, run_s, (t_a, e_a), p_ready in zip((dev_a, dev_b), runs, starts, ready):
            if span > run_s:
                dev.idle(span - run_s)
            t_end = dev.time_s()
            t_b, e_b = wait_for_tick(dev, protocol.tick_timeout_s, protocol.poll_s)
            # energy of [t_a, t_end]: the pre-run wait and the idle pad are part of the window
            # on both devices; subtract the ready energy of the tail and of the pre-run wait.
            pre = (t_end - t_a) - span
            total_e += (e_b - e_a) - p_ready * ((t_b - t_end) + pre)
        times.append(span)
        energies.append(total_e)
        if len(times) >= protocol.min_windows and relative_se(energies) <= protocol.target_rse:
            break
    return Signature.from_runs(f"{a.name} || {b.name}", times, energies, s_w=sum(ready),
                               devices=frozenset({a.device, b.device}),
                               meta={"protocol": "tick_aligned null-context windows on two devices",
                                     "windows": len(times), "key": key})


def measure_pair(devices: Mapping[str, Device], first: PairElement, second: PairElement,
                 protocol: Protocol = PAIR_PROTOCOL, alpha: float = 0.05, n_tests: int = 1,
                 key: str | None = None,
                 tests: tuple[str, ...] = ("entry", "runtime")) -> PairVerdict:
    """Run the pair tests of (``first``, ``second``) and decide (spec §6.2).

    ``devices`` maps workload device names to open devices. On one device: alone, entry
    (``second`` right after ``first``) and runtime (co-run with their SM split). On two:
    alone and runtime (⊕multi); no entry test (the devices share no entry state).
    ``tests`` limits what is measured (e.g. ``("entry",)`` for a pair that never overlaps:
    then e₁ alone and the co-run are not measured).
    """
    bad = sorted(set(tests) - {"entry", "runtime"})
    if bad or not tests:
        raise CompositionError(f"tests must be a non-empty subset of ('entry', 'runtime'), got {tests!r}")
    for el in (first, second):
        if el.device not in devices:
            raise DeviceError(f"element {el.name!r} is on device {el.device!r}, which is not open "
                              f"(open: {', '.join(sorted(devices))})")
    key = key or f"pair/{first.name}/{second.name}"
    dev_a, dev_b = devices[first.device], devices[second.device]
    for dev in {id(dev_a): dev_a, id(dev_b): dev_b}.values():
        if not getattr(dev, "simulated", False) and not (
                protocol.cooldown_s > 0 or protocol.baseline_temp_c is not None):
            # only the simulator's seed_point restores the null context by itself
            raise DeviceError(f"{dev.name}: the pair tests need the null context before every "
                              "window; on a real GPU set Protocol(baseline_temp_c=..., cooldown_s=...)")
    same = first.device == second.device
    simulated = bool(getattr(dev_a, "simulated", False) and getattr(dev_b, "simulated", False))
    if not same and "runtime" not in tests:
        raise CompositionError(f"pair ({first.name}, {second.name}) is on two devices: only the "
                               "runtime test applies")
    ready_a = _ready(dev_a, f"{key}/{first.device}", protocol)
    ready_b = ready_a if same else _ready(dev_b, f"{key}/{second.device}", protocol)
    sig_b, n_b = measure_null(dev_b, second.work(dev_b), second.name,
                              f"{key}/alone/{second.name}", protocol, ready_b,
                              devices=frozenset({second.device}), omega=second.omega)
    entry = runtime = None
    if same and "entry" in tests:
        after, _ = measure_null(dev_b, second.work(dev_b), f"{second.name} after {first.name}",
                                f"{key}/entry", protocol, ready_b, before=first.work(dev_a),
                                n=n_b, devices=frozenset({second.device}), omega=second.omega)
        entry = entry_test(sig_b, after, alpha=alpha, n_tests=n_tests,
                           name=f"{second.name} after {first.name}")
    if "runtime" not in tests:
        return PairVerdict(first.name, second.name, "same-device", entry, None, (sig_b,),
                           simulated=simulated)
    sig_a, _ = measure_null(dev_a, first.work(dev_a), first.name, f"{key}/alone/{first.name}",
                            protocol, ready_a, devices=frozenset({first.device}), omega=first.omega)
    if same:
        corun, _ = measure_null(dev_a, _co_run(dev_a, first, second), f"{first.name} || {second.name}",
                                f"{key}/runtime", protocol, ready_a,
                                devices=frozenset({first.device}))
        sm_total = dev_a.operating_set().sm_count
    else:
        corun = _multi_windows(dev_a, dev_b, first, second, f"{key}/runtime", protocol,
                               (ready_a, ready_b))
        sm_total = None
    runtime = runtime_test(sig_a, sig_b, corun, alpha=alpha, n_tests=n_tests, sm_total=sm_total)
    return PairVerdict(first.name, second.name, "same-device" if same else "cross-device",
                       entry, runtime, (sig_a, sig_b), simulated=simulated)


# -- pairs measured elsewhere (a real GPU): decide from signature files ------------------------

def _alone_index(alone: Mapping[str, Signature]) -> dict[tuple[str, OperatingPoint], list[Signature]]:
    """Alone signatures by (element, ω_dev); the element is a file key's part before the first
    ``@`` (``ecal characterize -o`` keys them ``element@κ@ω``)."""
    out: dict[tuple[str, OperatingPoint], list[Signature]] = {}
    for key, sig in alone.items():
        out.setdefault((key.partition("@")[0], sig.omega.dev), []).append(sig)
    return out


def _alone_at(index: Mapping[tuple[str, OperatingPoint], list[Signature]], element: str,
              omega_dev: OperatingPoint, sm_count: int | None, sm_total: int | None,
              pair_label: str) -> Signature:
    """The one alone signature of ``element`` at ``omega_dev`` on ``sm_count`` SMs (None: the
    whole device, which a signature records as None or as ``sm_total``)."""
    want = {sm_count} if sm_count is not None else {None, sm_total}
    found = [s for s in index.get((element, omega_dev), []) if s.omega.sm_count in want]
    sms = f"{sm_count} SMs" if sm_count is not None else "the whole device"
    if not found:
        raise InputError(f"{pair_label}: no signature of {element!r} measured alone at "
                         f"{omega_dev.label()} on {sms}: characterize it alone there (ecal "
                         "characterize ... -o ALONE.json) and pass the file with --signatures")
    if len(found) > 1:
        kappas = ", ".join(sorted(str(s.kappa) for s in found))
        raise InputError(f"{pair_label}: {len(found)} signatures of {element!r} measured alone at "
                         f"{omega_dev.label()} on {sms} (κ: {kappas}): keep one per element in "
                         "the files given")
    return found[0]


def measured_pair_verdicts(coruns: Sequence[Any], alone: Mapping[str, Signature],
                           alpha: float = 0.05) -> list[PairVerdict]:
    """The runtime test of co-runs measured elsewhere (a real GPU through
    :func:`measure.joint.characterize_pairs`, or any co-run signature) against the elements
    measured alone: each of ``coruns`` (:class:`~frontier.interaction.InteractionEntry`: the
    pair's key, its co-run signature and provenance) is held against the ⊕ prediction of its
    two members' alone signatures at the same ω_dev and SM counts (``alone``: file key →
    signature, as :func:`frontier.io.load_signatures` reads them). No entry test: a joint
    characterization measures co-runs only. A member with no alone signature there, or with
    several, is an :class:`~frontier.errors.InputError` naming it."""
    index = _alone_index(alone)
    out = []
    for e in coruns:
        label = e.key.label()
        sm_total = e.signature.meta.get("sm_total")
        sm_total = int(sm_total) if isinstance(sm_total, (int, float)) and not isinstance(sm_total, bool) else None
        a, b = e.key.members
        sig_a = _alone_at(index, a.element, e.key.omega_dev, a.sm_count, sm_total, label)
        sig_b = _alone_at(index, b.element, e.key.omega_dev, b.sm_count, sm_total, label)
        runtime = runtime_test(sig_a, sig_b, e.signature, alpha=alpha, sm_total=sm_total, name=label)
        out.append(PairVerdict(a.label(), b.label(), "same-device", None, runtime, (sig_a, sig_b),
                               simulated=bool(e.provenance.simulated)))
    return out
