"""Characterize co-running pairs jointly (spec §6.6 (b), §10.4): a ∥ b measured together at
each (ω_dev, SM split) a plan can choose, into an :class:`~frontier.interaction.InteractionTable`.

One device counter sees only s·T + Σ dᵢ of a co-run, so a pair is characterized as one
composite: one invocation starts a (on ``sm_a`` SMs) and b (on ``sm_b`` SMs) together and ends
when both have finished — what a pipeline task "compute ⊕ send" runs, and what the plan
executor (``execution.run``) runs for such a task. Each (pair, split) is one
:func:`~measure.characterize.characterize` over the ω_dev grid, so the protocol (warm-up, null
context, tick-aligned windows, repetitions to the target relative standard error), the device
restore on every exit path and the resumable results file are exactly those of a single
element. With ``results_dir`` each (pair, split) has its own results file there (a results file
holds one element), and a rerun resumes them.

The co-run itself is :class:`CoRun`: on the simulator (and any device with
``run_parallel(streams)``) both streams go through ``run_parallel`` with their SM counts.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from frontier.errors import InputError
from frontier.interaction import InteractionEntry, InteractionTable, PairKey, Provenance
from frontier.signature import Signature

from .characterize import characterize
from .device import Device, FeatureUnavailableError, can_co_run
from .grid import Grid, GridError, parse_grid
from .progress import ProgressCallback, ProgressEvent
from .protocol import Protocol

Split = tuple[int | None, int | None]


@dataclass(frozen=True)
class JointPair:
    """A pair to characterize jointly: element ``a`` (its work) and ``b``, at each SM split
    ``(sm_a, sm_b)`` in ``splits`` (``None``: the device default for that side).

    The names must be those the alone-characterized signatures carry: the table is looked up
    by them (:class:`~frontier.interaction.PairKey`)."""

    a: str
    work_a: Any
    b: str
    work_b: Any
    splits: tuple[Split, ...] = ((None, None),)

    def __post_init__(self) -> None:
        for nm in (self.a, self.b):
            if not isinstance(nm, str) or not nm:
                raise InputError(f"JointPair: element names must be non-empty strings, got {nm!r}")
        splits = tuple((sa, sb) for sa, sb in self.splits)
        if not splits:
            raise InputError(f"JointPair {self.a} || {self.b}: needs at least one SM split")
        for sa, sb in splits:
            for sm in (sa, sb):
                if sm is not None and (isinstance(sm, bool) or not isinstance(sm, int) or sm < 1):
                    raise InputError(f"JointPair {self.a} || {self.b}: SM counts must be positive "
                                     f"integers or None, got split {(sa, sb)!r}")
        if len(set(splits)) != len(splits):
            raise InputError(f"JointPair {self.a} || {self.b}: a split is given twice: {splits}")
        object.__setattr__(self, "splits", splits)

    def element(self, split: Split) -> str:
        """The joint element's name at one split (its results file's element)."""
        sa, sb = split
        return f"{self.a}||{self.b}@{_sm(sa)}+{_sm(sb)}SM"


def _sm(v: int | None) -> str:
    return "all" if v is None else str(v)


class CoRun:
    """One invocation of a ∥ b on ``device``: both streams started together through
    ``device.run_parallel`` (each runs its work once at its SM count); it ends when both have.

    A callable work for :meth:`~measure.device.Device.run` (the protocol calls it n times)."""

    def __init__(self, device: Device, streams: Sequence[tuple[Any, int | None]], name: str):
        if not can_co_run(device):
            raise FeatureUnavailableError(
                f"{device.name}: cannot co-run (run_parallel); joint characterization runs on "
                "the simulated H200 or on an NVML device with PyTorch (NVMLDevice.run_parallel)")
        self._run_parallel = device.run_parallel
        self.streams = tuple((w, sm) for w, sm in streams)
        self.name = name
        self.kappa = " || ".join(str(getattr(w, "kappa", None) or getattr(w, "name", "work"))
                                 for w, _ in self.streams)
        self.theta = " || ".join(str(getattr(w, "theta", None) or getattr(w, "name", "work"))
                                 for w, _ in self.streams)

    def __call__(self) -> None:
        self._run_parallel([(w, 1, sm) for w, sm in self.streams])


def _results_file(results_dir: str | Path, element: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.+@-]+", "_", element.replace("||", "__"))
    return str(Path(results_dir) / f"{safe}.jsonl")


def _check(pairs: Sequence[JointPair], grid: Grid, sm_total: int) -> None:
    if "sm_count" in grid.axes:
        raise GridError("the grid of a joint characterization varies ω_dev only; give the SM "
                        "splits per pair (JointPair.splits)")
    for p in pairs:
        if not isinstance(p, JointPair):
            raise TypeError(f"characterize_pairs takes JointPair objects, got {type(p).__name__}")
        for sa, sb in p.splits:
            if sa is not None and sb is not None and sa + sb > sm_total:
                raise InputError(f"{p.a} || {p.b}: split {sa}+{sb} = {sa + sb} SMs exceeds the "
                                 f"device's {sm_total} (par() could never use it)")
    seen: dict[PairKey, str] = {}
    for p in pairs:
        for sa, sb in p.splits:
            k = PairKey.of(p.a, sa, p.b, sb)
            if k in seen:
                raise InputError(f"{k.label()} is given twice ({seen[k]} and {p.element((sa, sb))})")
            seen[k] = p.element((sa, sb))


def characterize_pairs(device: Device, pairs: Iterable[JointPair],
                       grid: str | Grid | None = None, protocol: Protocol | None = None, *,
                       results_dir: str | Path | None = None,
                       progress: ProgressCallback | None = None,
                       description: str | None = None) -> InteractionTable:
    """Measure every pair jointly at every (ω_dev in ``grid``, split in ``pair.splits``).

    ``grid`` varies ω_dev only (SM clock, memory clock, power limit; ``sm_count`` is per pair
    and split). Each joint signature is a measured leaf named ``a||b@sm_a+sm_bSM`` with
    ``omega`` = ω_dev with ``sm_count`` = sm_a + sm_b (what ``par`` gives the composite) and
    ``meta["joint"]`` naming the members and split; ``meta["sm_total"]`` is the device's SM
    count. ``progress`` (default: none) gets one :class:`~measure.progress.ProgressEvent` per
    point with counts over the whole job (``operation="joint"``). With ``results_dir``, every point is kept as measured and a rerun resumes
    (see :func:`~measure.characterize.characterize`).
    """
    pairs = list(pairs)
    g = parse_grid(grid)
    sm_total = device.operating_set().sm_count
    _check(pairs, g, sm_total)
    protocol = protocol or Protocol()
    jobs = [(p, split) for p in pairs for split in p.splits]
    total = len(jobs) * len(g.points())
    state = {"done": 0, "measured": 0}
    t0 = time.monotonic()

    def relay(p: ProgressEvent) -> None:
        state["done"] += 1
        state["measured"] += int(p.measured)
        if progress is None:
            return
        elapsed = time.monotonic() - t0
        left = total - state["done"]
        eta = elapsed / state["measured"] * left if state["measured"] else (0.0 if not left else math.inf)
        progress(replace(p, done=state["done"], total=total, elapsed_s=elapsed, eta_s=eta,
                         operation="joint"))

    desc = device.describe()
    entries: list[InteractionEntry] = []
    for pair, split in jobs:
        element = pair.element(split)
        work = CoRun(device, ((pair.work_a, split[0]), (pair.work_b, split[1])), element)
        path = _results_file(results_dir, element) if results_dir is not None else None
        res = characterize(work, device=device, grid=g, results_path=path, protocol=protocol,
                           name=element, progress=relay)
        when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        prov = Provenance(device=str(desc.get("device", device.name)),
                          simulated=bool(desc.get("simulated", getattr(device, "simulated", False))),
                          protocol=protocol.to_dict(), recorded_utc=when,
                          seed=desc.get("seed"), uuid=desc.get("uuid"))
        # on a real GPU, the partitions the co-run ran on (granted counts, disjoint or not)
        parts = getattr(device, "last_split", None)
        for sig in res.signatures:
            entries.append(_entry(sig, pair, split, sm_total, path, prov,
                                  parts.to_dict() if parts is not None else None))
    return InteractionTable(tuple(entries), description)


def _entry(sig: Signature, pair: JointPair, split: Split, sm_total: int, path: str | None,
           prov: Provenance, partitions: dict[str, Any] | None = None) -> InteractionEntry:
    sa, sb = split
    dev = sig.omega.dev
    omega = dev.with_(sm_count=sa + sb) if sa is not None and sb is not None else dev
    joint: dict[str, Any] = {"members": [{"element": pair.a, "sm_count": sa},
                                         {"element": pair.b, "sm_count": sb}]}
    if partitions is not None:
        joint["partitions"] = partitions        # granted counts; "overlapping" where they may
    meta = {**dict(sig.meta), "sm_total": sm_total, "results_path": path, "joint": joint}
    return InteractionEntry(PairKey.of(pair.a, sa, pair.b, sb, dev),
                            sig.with_(omega=omega, meta=meta), prov)
