"""solvers: choose one operating point per task of a DAG to minimise energy under a deadline.

Problem model (:mod:`solvers.model`), plans and curves (:mod:`solvers.plan`), exact chain DP
(:mod:`solvers.dp`), MILP through PuLP (:mod:`solvers.ilp`; HiGHS first, CBC the fallback), the
one feasibility predicate and bound check (:mod:`solvers.feasibility`), the hull-LP/Lagrangian
fast method
with bounds (:mod:`solvers.relax`; its bound's ascent with switch costs,
:mod:`solvers.ascent`), 1F1B pipelines and Perseus profiles (:mod:`solvers.pipeline`), problem
files (:mod:`solvers.io`). Plots: ``solvers.plot``
(imported on use so matplotlib loads only when plotting).
"""

from .feasibility import CertificateError, meets_deadline
from .io import load_problem, problem_from_dict, problem_to_dict, save_problem
from .model import (
    ConstantTransition,
    InfeasibleError,
    LeafTerms,
    Option,
    Problem,
    ProblemError,
    SolverUnavailableError,
    Task,
)
from .pipeline import load_perseus_profile, one_f_one_b, stage_order
from .plan import ParetoCurve, Plan, PlanTerms, TaskPlan, plan_terms
from .solve import METHODS, pareto, pick_method, solve


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
    "Problem", "Task", "Option", "ConstantTransition", "ProblemError", "InfeasibleError",
    "SolverUnavailableError", "CertificateError", "meets_deadline", "Plan", "TaskPlan", "ParetoCurve", "solve", "pareto", "pick_method",
    "METHODS", "one_f_one_b", "stage_order", "load_perseus_profile", "load_problem",
    "problem_from_dict", "problem_to_dict", "save_problem", "plot_timeline", "plot_pareto",
]
