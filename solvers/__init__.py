"""solvers: choose one operating point per task of a DAG to minimise energy under a deadline.

Entry points: :func:`solve` (one deadline, :mod:`solvers.solve`) and :func:`pareto` (a curve,
:mod:`solvers.curve`), tuned by one frozen :class:`SolveOptions` (:mod:`solvers.options`).
Problem model (:mod:`solvers.model`), plans and curves (:mod:`solvers.plan`), the one
feasibility predicate and bound check (:mod:`solvers.feasibility`), problem files
(:mod:`solvers.io`), 1F1B pipelines and Perseus profiles (:mod:`solvers.pipeline`).

Exact methods: chain DP (:mod:`solvers.dp`), series–parallel DP (:mod:`solvers.spdp`), MILP
through PuLP (:mod:`solvers.ilp`; HiGHS first, CBC the fallback), brute force
(:mod:`solvers.brute`). The fast method (:mod:`solvers.fast`, ``docs/solver.md``): hull LP
(:mod:`solvers.hull_lp`), Lagrangian bound (:mod:`solvers.lagrangian`, :mod:`solvers.bound`,
:mod:`solvers.switch_lp`, :mod:`solvers.ascent`), rounding and repair
(:mod:`solvers.rounding`, :mod:`solvers.repair`), the switch-cost search
(:mod:`solvers.search`, :mod:`solvers.lns`, :mod:`solvers.hold`) and its portfolio
(:mod:`solvers.portfolio`, :mod:`solvers.workers`). Plots: ``solvers.plot`` (imported on
use so matplotlib loads only when plotting).
"""

from .curve import pareto
from .feasibility import CertificateError, meets_deadline
from .io import load_problem, problem_from_dict, problem_to_dict, save_problem
from .model import (
    ConstantTransition,
    InfeasibleError,
    LeafTerms,
    Option,
    Problem,
    ProblemError,
    ProblemTooLargeError,
    SolverUnavailableError,
    Task,
)
from .options import LimitOptions, SolveOptions
from .perseus import load_perseus_profile
from .pipeline import one_f_one_b, stage_order
from .plan import ParetoCurve, Plan, PlanTerms, TaskPlan, plan_terms
from .solve import METHODS, pick_method, solve


def plot_timeline(plan, path):
    """Gantt chart of a plan coloured by power (see :func:`solvers.plot.plot_timeline`)."""
    from .plot import plot_timeline as f

    return f(plan, path)


def plot_pareto(curve, path, others=None):
    """Energy-vs-deadline plot (see :func:`solvers.plot.plot_pareto`)."""
    from .plot import plot_pareto as f

    return f(curve, path, others)


__all__ = [
    "LeafTerms", "PlanTerms", "plan_terms",
    "Problem", "Task", "Option", "ConstantTransition", "ProblemError", "ProblemTooLargeError", "InfeasibleError",
    "SolverUnavailableError", "CertificateError", "meets_deadline", "Plan", "TaskPlan", "ParetoCurve", "solve", "pareto", "pick_method",
    "METHODS", "SolveOptions", "LimitOptions", "one_f_one_b", "stage_order", "load_perseus_profile", "load_problem",
    "problem_from_dict", "problem_to_dict", "save_problem", "plot_timeline", "plot_pareto",
]
