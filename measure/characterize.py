"""``characterize``: one call from work to signatures and their frontier."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frontier.errors import InputError
from frontier.signature import Signature

from .device import Device
from .grid import Grid
from .progress import ProgressCallback
from .protocol import Protocol
from .ready_drift import ReadyRecheck
from .sweep import ReadyPowerCache, sweep


@dataclass(frozen=True)
class CharacterizationResult:
    """Signatures of one element over a grid (in grid order), its (T, E) frontier (``None`` when
    the Pareto module is unavailable), the points skipped by early stop, and metadata (the
    device, whether it is simulated, the grid, the results file)."""

    element: str
    signatures: tuple[Signature, ...]
    frontier: Any = None
    skipped: tuple = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def simulated(self) -> bool:
        """Whether the signatures come from the simulated GPU."""
        return bool(self.meta.get("simulated"))

    def frontier_signatures(self) -> tuple[Signature, ...]:
        """The frontier's points (all signatures when no frontier could be built)."""
        if self.frontier is None:
            return self.signatures
        pts = getattr(self.frontier, "points", None)
        return tuple(pts) if pts is not None else tuple(self.frontier)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``signatures`` (full codec), frontier point labels, metadata."""
        from frontier.io import signature_to_dict

        front = {s.key for s in self.frontier_signatures()} if self.frontier is not None else set()
        return {
            "format": "energy-calculus/characterization", "element": self.element,
            "simulated": self.simulated, "device": self.meta.get("device"),
            "meta": dict(self.meta),
            "signatures": [signature_to_dict(s) for s in self.signatures],
            "frontier": [i for i, s in enumerate(self.signatures) if s.key in front],
            "skipped": [{"kappa": k, "omega": op.to_dict()} for k, op in self.skipped],
        }

    def to_table(self) -> str:
        """Printable table: one line per point (``*`` marks the (T, E) frontier), with a header
        naming the device and saying when it is simulated."""
        front = {s.key for s in self.frontier_signatures()} if self.frontier is not None else set()
        dev = self.meta.get("device", "?")
        head = [f"{self.element} on {dev}{'  [SIMULATED]' if self.simulated else ''}: "
                f"{len(self.signatures)} points ({self.meta.get('measured', 0)} measured, "
                f"{self.meta.get('resumed', 0)} resumed, {len(self.skipped)} skipped by early stop)"]
        rows = [("", "operating point", "κ", "T (ms)", "±", "E (J)", "±", "P (W)", "s (W)", "windows")]
        for s in self.signatures:
            rows.append(("*" if s.key in front else "", s.omega.label(), s.kappa or "-",
                         f"{s.time_s * 1e3:.4f}", f"{s.sd_time_s * 1e3:.4f}", f"{s.energy_j:.4f}",
                         f"{s.sd_energy_j:.4f}", f"{s.power_w:.1f}", f"{s.s_w:.1f}", str(s.meta.get("windows", ""))))
        w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join(head + ["  ".join(c.ljust(w[i]) if i < 3 else c.rjust(w[i]) for i, c in enumerate(r))
                                  for r in rows])

    def keyed(self) -> dict[str, Signature]:
        """Signatures keyed ``element@κ@ω`` (unique per point, as a signature file needs)."""
        out: dict[str, Signature] = {}
        for s in self.signatures:
            parts = [s.name] + ([s.kappa] if s.kappa else []) + [s.omega.label()]
            out["@".join(parts)] = s
        return out

    def save(self, path: str | Path) -> Path:
        """Write the signatures as a signature file (atomic), keyed as in :meth:`keyed`, with
        ``meta`` naming the element, the device and the ready power used per ω_dev (see
        :func:`save_characterizations`)."""
        return save_characterizations(path, [self])


def save_characterizations(path: str | Path, results: list[CharacterizationResult]) -> Path:
    """Write the signatures of one or more characterizations to one signature file (atomic).

    The file is an ordinary signature file (``"format": "ecal.signatures/1"``, ``units``,
    ``signatures`` keyed
    ``element@κ@ω``, read by :func:`frontier.io.load_signatures`) plus a top-level ``meta``:
    ``elements`` (names, in order), ``device``, ``simulated`` and ``ready_power_w``
    (ω_dev label → W: the ready power each ω_dev's points were measured against; one value per
    ω_dev, shared by all elements when they were measured in one campaign). Two elements that
    share a key are an error naming it."""
    from frontier.errors import FormatError
    from frontier.io import save_signatures

    sigs: dict[str, Signature] = {}
    ready: dict[str, float] = {}
    drift: dict[str, Any] = {}
    for r in results:
        for k, s in r.keyed().items():
            if k in sigs:
                raise FormatError(str(path), f"signatures.{k}", "two signatures have this name")
            sigs[k] = s
        ready.update(r.meta.get("ready_power_w") or {})
        for label, d in (r.meta.get("ready_drift") or {}).items():
            drift[f"{r.element}@{label}"] = d
    first = results[0].meta if results else {}
    meta: dict[str, Any] = {"elements": [r.element for r in results], "device": first.get("device"),
            "simulated": bool(first.get("simulated")), "ready_power_w": ready}
    if drift:
        meta["ready_drift"] = drift
    return save_signatures(path, sigs, {"meta": meta})


def frontier_of(sigs: tuple[Signature, ...]) -> Any:
    """The (T, E) Pareto frontier via ``frontier.pareto`` (imported lazily; None if missing)."""
    if not sigs:
        return None
    try:
        from frontier.pareto import pareto_frontier
    except ImportError:
        return None
    return pareto_frontier(list(sigs))


def characterize(fn: Any, device: Device | None = None, grid: str | Grid | Mapping | None = None,
                 results_path: str | None = None, protocol: Protocol | None = None,
                 name: str | None = None, early_stop_k: int | None = None,
                 progress: ProgressCallback | None = None,
                 theta: str | None = None, ready_power_w: float | None = None,
                 ready_cache: ReadyPowerCache | None = None,
                 ready_recheck: ReadyRecheck | None = None) -> CharacterizationResult:
    """Measure ``fn`` (a work, or a mapping κ label → work) over ``grid`` on ``device``
    (default: a simulated H200) and return its signatures and frontier.

    The grid is rejected before any device change if a point is unsupported; the device is
    restored afterwards (also on exceptions and Ctrl-C); each point is appended to
    ``results_path`` as measured and a rerun resumes from it: the same points, bit for bit on
    the simulator, while one process at a time writes the file and a file from another GPU,
    seed, protocol or element is refused (see :func:`~measure.sweep.sweep` and
    :mod:`measure.results_log`). ``ready_power_w`` reuses a ready-power calibration for a grid
    that keeps ω_dev; ``ready_cache`` (a :class:`~measure.sweep.ReadyPowerCache` shared by the
    characterizations of a campaign) calibrates each (device, ω_dev) once across elements.
    ``meta["ready_power_w"]`` maps each ω_dev label to the ready power used there, W.
    ``ready_recheck`` (default: every 600 s of device time, 2 % tolerance) re-measures ready
    power during the sweep; a drift is carried as σ_s and reported in ``meta["ready_drift"]``
    (:mod:`measure.ready_drift`).
    ``progress`` (default: none) gets one :class:`~measure.progress.ProgressEvent` per point.
    """
    if device is None:
        from .sim import SimulatedGPU

        device = SimulatedGPU()
    works = dict(fn) if isinstance(fn, Mapping) else {None: fn}
    if not works:
        raise InputError("characterize: no work given")
    element = name or _name_of(next(iter(works.values())))
    res = sweep(device, works, element, grid=grid, protocol=protocol or Protocol(),
                results_path=results_path, progress=progress, early_stop_k=early_stop_k, theta=theta,
                ready_power_w=ready_power_w, ready_cache=ready_cache, ready_recheck=ready_recheck)
    meta = dict(res.meta)
    meta.update(measured=res.measured, resumed=res.resumed)
    return CharacterizationResult(element, res.signatures, frontier_of(res.signatures), res.skipped, meta)


def _name_of(work: Any) -> str:
    n = getattr(work, "name", None) or getattr(work, "__name__", None)
    return str(n) if n else "element"
