"""One progress protocol for the library's long operations.

Every long operation (a sweep, :func:`~measure.characterize.characterize`, a joint or an
adaptive characterization, the selftest, a campaign) takes a
``progress: Callable[[ProgressEvent], None] | None`` parameter, default ``None``, and calls it
with one :class:`ProgressEvent` per step. Library code never shows progress by itself: the
caller decides. ``ecal`` passes :func:`ecal.output.progress_reporter` (a tqdm bar where stderr is
a terminal, one line per event otherwise); a script can pass ``print`` (an event prints as its
:meth:`~ProgressEvent.line`), ``events.append``, or its own reporter.

Warnings and notes are a separate channel: library modules log them with
``logging.getLogger(__name__)``. A program that configures no logging sees Python's default
(warnings and errors on stderr through logging's last-resort handler, notes not at all);
``ecal`` shows them as ``ecal: ...`` lines (:func:`ecal.output.cli_logging`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from frontier.signature import Signature


@dataclass(frozen=True)
class ProgressEvent:
    """One step of a long operation.

    ``done`` of ``total`` steps (``total`` None: a stage of an operation that does not count
    its steps ahead, e.g. an adaptive characterization or the demo), ``label`` naming the step,
    real seconds ``elapsed_s`` since the operation started and ``eta_s`` left (``inf``:
    unknown). For a measured point: ``measured`` (False: read back from a results file, or
    skipped when ``signature`` is None too) and its ``signature``. ``operation`` names the
    operation (``"sweep"``, ``"selftest"``, ...; a bar's title); ``status`` overrides the word
    the line shows for the step (``"failed"``, ...); ``message``, when given, is the whole line.

    The field order of the first seven is :class:`measure.sweep.Progress`'s, which this
    replaces (``Progress`` is this class)."""

    done: int
    total: int | None
    label: str
    elapsed_s: float = 0.0
    eta_s: float = math.inf
    measured: bool = False
    signature: Signature | None = None
    operation: str = ""
    status: str = ""
    message: str = ""

    def line(self) -> str:
        """The event as one line of text: ``message`` when given, else the point line
        ``[done/total] label  what  T=.. ms  E=.. J  eta N s``."""
        if self.message:
            return self.message
        what = self.status or ("measured" if self.measured
                               else ("resumed" if self.signature is not None else "skipped"))
        extra = ""
        if self.signature is not None:
            extra = f"  T={self.signature.time_s * 1e3:.4g} ms  E={self.signature.energy_j:.4g} J"
        eta = f"{self.eta_s:.0f} s" if math.isfinite(self.eta_s) else "?"
        if self.total is None:
            return f"[{self.done}] {self.label:<40} {what}{extra}"
        return (f"[{self.done:>{len(str(self.total))}}/{self.total}] {self.label:<40} "
                f"{what}{extra}  eta {eta}")

    def __str__(self) -> str:
        return self.line()


#: What a long operation accepts as ``progress``.
ProgressCallback = Callable[[ProgressEvent], None]


def eta_s(elapsed_s: float, done_work: int, left: int) -> float:
    """Seconds left at the rate so far: ``elapsed_s`` per ``done_work`` steps that took time
    (measured, not resumed), ``left`` steps to go; ``inf`` before the first step that took
    time."""
    return elapsed_s / done_work * left if done_work else math.inf


def report(progress: ProgressCallback | None, event: ProgressEvent) -> None:
    """Call ``progress`` with ``event`` (nothing when ``progress`` is None)."""
    if progress is not None:
        progress(event)
