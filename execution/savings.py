"""Measured savings: a plan against its baselines, each run and measured, and the run file
(``ecal.run/1``) that holds them (:meth:`PlanComparison.to_dict`, :func:`comparison_from_dict`)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from frontier.errors import FormatError
from frontier.files import read_json
from frontier.formats import KINDS, content, validate
from solvers.model import Problem
from solvers.plan import Plan

from .results import ExecutionResult, execution_from_dict
from .run import run_plan
from .work import WorkTable


@dataclass(frozen=True)
class Savings:
    """1 − E_plan/E_baseline, predicted (from the plans) and measured (from the runs), with σ
    propagated from both sides as independent estimates (first order)."""

    baseline: str
    predicted: float
    sd_predicted: float
    measured: float
    sd_measured: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dict(vars(self))


def _ratio_savings(e_p: float, s_p: float, e_b: float, s_b: float) -> tuple[float, float]:
    r = e_p / e_b
    return 1.0 - r, r * math.sqrt((s_p / e_p) ** 2 + (s_b / e_b) ** 2)


def savings(plan_run: ExecutionResult, baseline_run: ExecutionResult, name: str) -> Savings:
    """Savings of ``plan_run`` against ``baseline_run``."""
    p, b = plan_run.step, baseline_run.step
    pr, spr = _ratio_savings(p.predicted_energy_j, p.sd_predicted_energy_j,
                             b.predicted_energy_j, b.sd_predicted_energy_j)
    ms, sms = _ratio_savings(p.measured_energy_j, p.sd_measured_energy_j,
                             b.measured_energy_j, b.sd_measured_energy_j)
    return Savings(name, pr, spr, ms, sms)


@dataclass(frozen=True)
class PlanComparison:
    """A plan and its baselines, each run and measured, with measured savings."""

    plan: ExecutionResult
    baselines: Mapping[str, ExecutionResult]
    savings: tuple[Savings, ...]

    def summary(self) -> str:
        """The plan's and baselines' tables, then the savings."""
        tag = "SIMULATED" if self.plan.simulated else "measured"
        parts = ["plan:", self.plan.summary()]
        for n, r in self.baselines.items():
            parts += [f"baseline {n}:", r.summary()]
        parts.append(f"savings ({tag}; σ from both sides):")
        for s in self.savings:
            parts.append(f"  vs {s.baseline:<16} predicted {s.predicted:+.2%} ± {s.sd_predicted:.2%}"
                         f"   measured {s.measured:+.2%} ± {s.sd_measured:.2%}")
        return "\n".join(parts)

    def problems(self) -> list[str]:
        """The plan's :meth:`ExecutionResult.problems` (what ``ecal run``'s exit status is
        about: the plan run is what is checked)."""
        return list(self.plan.problems())

    def notes(self) -> list[str]:
        """Each baseline's Eq. 23 flags: its own prediction deviates (reported, not the plan's
        problem; a baseline's deadline is not the plan's promise)."""
        return [f"baseline {n}: {x}" for n, r in self.baselines.items()
                for x in r.problems() if "FLAGGED" in x]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``"format": "ecal.run/1"``)."""
        return {"format": KINDS["run"].tag, "simulated": self.plan.simulated,
                "plan": self.plan.to_dict(),
                "baselines": {n: r.to_dict() for n, r in self.baselines.items()},
                "savings": [s.to_dict() for s in self.savings], "problems": self.problems(),
                "notes": self.notes()}


def run_with_baselines(plan: tuple[Plan, Problem, WorkTable],
                       baselines: Mapping[str, tuple[Plan, Problem, WorkTable]],
                       **kwargs: Any) -> PlanComparison:
    """Run a plan and its baselines, each given as ``(plan, problem, work)``, with the same
    keyword arguments as :func:`run_plan`; measured savings against each baseline."""
    main = run_plan(*plan, **kwargs)
    runs = {n: run_plan(*b, **kwargs) for n, b in baselines.items()}
    return PlanComparison(main, runs, tuple(savings(main, r, n) for n, r in runs.items()))


def comparison_from_dict(doc: Any, file: str = "<run>") -> PlanComparison:
    """Inverse of :meth:`PlanComparison.to_dict` (``ecal.run/1``); every fault is a one-line
    :class:`FormatError` naming the file and the field. The shape is
    :class:`execution.format_models.RunFile`; each embedded execution is read by
    :func:`~execution.results.execution_from_dict`; checked here: savings name a baseline."""
    from .format_models import RunFile

    _, body = content(file, doc, "run")
    m = validate(RunFile, body, file)
    plan = execution_from_dict(m.plan, file, "plan")
    base = {n: execution_from_dict(d, file, f"baselines.{n}") for n, d in m.baselines.items()}
    for i, s in enumerate(m.savings):
        if s.baseline not in base:
            raise FormatError(file, f"savings[{i}].baseline",
                              f"no baseline {s.baseline!r} in 'baselines'")
    return PlanComparison(plan, base, tuple(Savings(**s.model_dump()) for s in m.savings))


def load_run(path: str | os.PathLike) -> PlanComparison:
    """Read a run file (``ecal run -o``; see :func:`comparison_from_dict`)."""
    return comparison_from_dict(read_json(path), os.fspath(path))
