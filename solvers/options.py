"""Every tuning knob of the planners, in one frozen value: :class:`SolveOptions`.

``solve(problem, deadline, options=SolveOptions())`` and ``pareto(..., options=...)`` pass
it down; no solver reads a tuning value from a module global, so an experiment changes a
knob with :func:`dataclasses.replace` instead of patching a module::

    from dataclasses import replace
    opts = SolveOptions()
    opts = replace(opts, search=replace(opts.search, caps=(24, 96), seed=1))
    plan = solve(problem, "1.05x", method="fast", options=opts)

The defaults are the shipped ones. Each field says what it does and, once, what was measured
for it (1F1B profiles of ``experiments/bench_solvers.py``: 60 SM clocks, P2P power 75 W, 1 ms
switches, 2-core machine, unless said otherwise). Search effort is counted in *work units*
(one unit ≈ 1,000 DP labels, :class:`solvers.lns.Budget`), so a plan depends on its input
and these options alone; wall-clock limits are only safety nets (a plan says when one fired).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchSettings:
    """One search of the portfolio: :func:`solvers.lns.chain_dp`'s label caps (per option,
    over all), the kicks' random seed, and its work (and wall-time cap) as a multiple of the
    budget :func:`solvers.fast.polish_budget` gives."""

    caps: tuple[int, int]
    seed: int
    work_share: float = 1.0


@dataclass(frozen=True)
class BudgetOptions:
    """How much the switch-cost search of one fast solve may do, and its safety net.

    Work: ``work_per_task`` units per task, at most ``max_work``; it depends on the size
    alone. Measured at 1.05x: 4x8 spends its 8,000 units in about 1 s, 8x32 its 64,000 in
    6–7 s, 16x64 its 92,160 (plus the final stages, 1.1 times more) in about 16 s.
    Safety net: ``safety_net_s_per_unit`` s per work unit plus ``safety_net_s_per_task`` s
    per task (the LP solves and starts outside the work), within [``safety_net_s_min``,
    ``safety_net_s_max``]: 5 to 16 times what a solve takes on a quiet 2-core machine (8x32
    with 1 ms switches: 16 s of 261 s; 16x64: 30 s of 389 s; 32x128: 24 s of 174 s), so that a
    loaded one still ends every search on work. (Per task alone, a 1,024-task problem, which
    gets the full 92,160 units, had 2× headroom and fired under load.)"""

    work_per_task: float = 125.0
    max_work: float = 92_160.0
    #: Past ``work_task_product`` / ``max_work`` tasks (2,048) the work shrinks as 1/tasks:
    #: each unit then costs time ∝ tasks (every window re-evaluates the whole schedule), so
    #: this keeps the search's time from growing with size. 32x128 (8,192 tasks, 1 ms
    #: switches, 1.05x): 23,040 units, gap 0.9 % (92,160 units: 0.6 % in five times the time).
    work_task_product: float = 188_743_680.0
    #: From :data:`solvers.held.MIN_TASKS` tasks on the search's moves cost work independent
    #: of the size (:mod:`solvers.held`), and the work is ``held_work_per_task`` per task at
    #: ``held_work_tasks`` tasks, times √(tasks / ``held_work_tasks``), when that is more
    #: than the above (a sweep over every path costs about 2.5 units per task). Measured on
    #: 1F1B with 1 ms switches at 1.05x (2 cores): on 32,768 tasks 1 per task gives a gap of
    #: 1.08 %, 2 0.99 % (50 s), 4 0.92 %, 12 0.81 % (past 2 the gap moves less than energy is
    #: measured, about 1 %, for a third more time each); on 131,072 tasks 2 per task gives
    #: 1.10 % (179 s) and 4 0.99 % (247 s): to hold a gap the search needs more sweeps as
    #: the pipeline grows, hence the square root.
    held_work_per_task: float = 2.0
    held_work_tasks: float = 32_768.0
    safety_net_s_per_unit: float = 0.004
    safety_net_s_per_task: float = 0.01
    safety_net_s_min: float = 60.0
    safety_net_s_max: float = 600.0


@dataclass(frozen=True)
class AscentOptions:
    """The supergradient ascent of the switch-cost bound (:mod:`solvers.ascent`).

    ``iters`` steps are its work budget (about 30 ms each on 16x64; measured there, 150 from
    the surrogate LP's duals end within 1 J of the LP with switch costs); the first Polyak
    target lies ``margin`` of the bound above it, the margin halves after ``patience`` steps
    without a better bound, and each step projects at most ``passes`` times. It raises the
    16x64 bound by 0.05 %."""

    iters: int = 150
    #: Each step is O(tasks): at most ``max_task_steps`` / tasks steps (150 up to 2,048 tasks,
    #: 37 on 8,192, where 150 took about 25 s for 0.05 % of bound).
    max_task_steps: float = 307_200.0
    #: Where that rule leaves fewer steps than this, the ascent is skipped (the bound is its
    #: start's): measured at 1.05x with 1 ms switches, 32,768 tasks get 9 steps, 12 s for no
    #: gain at all (16,384: 18 steps, +0.023 % in 10 s; 8,192: 37, +0.039 %; 2,048: 150,
    #: +0.055 %).
    min_steps: int = 12
    margin: float = 2e-3
    patience: int = 8
    passes: int = 40


@dataclass(frozen=True)
class BoundOptions:
    """The fast method's lower bound with switch costs (:func:`solvers.bound.switch_bound`).

    The LP with constant switch costs is solved for its duals up to ``switch_lp_max_columns``
    columns (4x8 has 7.5 k: 0.26 s; 8x32 61 k: 8.5 s); larger problems use the surrogate LP,
    which adds ``surrogate_share`` × the smallest switch latency to every device edge
    (0.1–0.3 measured equally good). Then ``ascent``: on 16x64 it ends 0.02 % higher from
    these duals than from the hull LP's."""

    switch_lp_max_columns: int = 20_000
    surrogate_share: float = 0.2
    #: The surrogate LP only up to this many tasks (on 8,192 it is a second 6 s LP solve;
    #: the ascent then starts from the hull LP's duals).
    surrogate_max_tasks: int = 4096
    ascent: AscentOptions = AscentOptions()


@dataclass(frozen=True)
class SearchOptions:
    """The switch-cost search (:mod:`solvers.search`) of the first (in-process) member.

    ``caps``: :func:`solvers.lns.chain_dp`'s label caps (per option, over all); other caps
    end in other local optima but not better ones on average (24/96 against 16/64 on 8x32 and
    16x64 at 1.05x/1.2x, seeds 0–3: within 0.05 points either way). ``seed``: the kicks'
    seed. ``probe_share``: the share of the work each of the first four starts gets before the
    best one goes on. ``alphas``: where the other tasks are held while a path is re-planned
    (α·ASAP + (1 − α)·ALAP start), cycled per sweep. ``final_stages``: after the search, the
    best plan is re-planned path by path with wider caps, each stage with its share of the
    work more (the first also gets what the search left); measured on 16x64 at 1.05x and
    1.2x, they take 0.02 % of energy off, which keeps the gap there under 0.5 %."""

    caps: tuple[int, int] = (16, 64)
    seed: int = 0
    probe_share: float = 0.1
    alphas: tuple[float, ...] = (0.5, 0.0, 1.0)
    final_stages: tuple[tuple[tuple[int, int], float], ...] = (((64, 256), 0.25), ((128, 512), 0.85))

    @property
    def settings(self) -> SearchSettings:
        """This search as a portfolio member (caps, seed, the whole budget)."""
        per_option, overall = self.caps
        return SearchSettings((int(per_option), int(overall)), int(self.seed))

    def final_shares(self, first: int = 0) -> float:
        """The work shares of :attr:`final_stages` from stage ``first`` on, summed."""
        return sum(share for _, share in self.final_stages[first:])


@dataclass(frozen=True)
class HoldOptions:
    """Hold starts and held re-plans (:mod:`solvers.hold`).

    ``share`` of the search budget goes on after a hold start; ``replan_share`` of that part
    re-plans around a slower hold in ``replan_window`` (fractions of the makespan; (0.2, 0.8)
    gave the lowest gaps in three of four 8x32/16x64 cases). Hold starts try ``windows`` (the
    cheapest wins), levels within ±``band`` of the plan's busy-time ratio, and pair each of the
    three fastest feasible levels with ``pairs`` slower ones. A re-plan screens
    ``replan_levels`` levels up to ``1 + replan_span`` times the slowest that fits, by the
    held problem's hull LP (the level picked ran 0.7–1.6 % slower than that one). Measured on
    16x64 at 1.05x and 1.2x: holds and re-plans save 0.13–0.15 % of energy, the re-plans
    alone 0.11–0.13 %."""

    #: Holds and held re-plans only up to this many tasks: on 32x128 (8,192 tasks) they took
    #: about 90 s of a 150 s search for 0.1 % of energy.
    max_tasks: int = 4096
    share: float = 0.5
    replan_share: float = 0.5
    replan_window: tuple[float, float] = (0.2, 0.8)
    windows: tuple[tuple[float, float], ...] = ((0.3, 0.75), (0.3, 0.7), (0.4, 0.75), (0.2, 0.8))
    band: float = 0.03
    pairs: int = 10
    replan_span: float = 0.02
    replan_levels: int = 24


@dataclass(frozen=True)
class PortfolioOptions:
    """Searches run beside the first from ``min_tasks`` tasks on, in worker processes
    (:mod:`solvers.workers`); the cheapest plan wins. None by default: a second search with
    caps 24/96 and 1.3 times the work (across kick seeds 0–3 on 16x64, the better of the two
    proved 0.489–0.500 % against 0.493–0.508 % for one) changed the shipped plans on the
    benchmarks (16x64, 1 ms switches, 1.05x and 1.2x) by at most 0.0004 % of energy
    (``experiments/solver_ablation.py``). Below ``min_tasks`` one search runs (a worker costs
    about 1 s to start). A worker may take ``worker_grace_s`` beyond its own safety net before
    its call runs here instead."""

    members: tuple[SearchSettings, ...] = ()
    min_tasks: int = 500
    worker_grace_s: float = 60.0


@dataclass(frozen=True)
class CurveOptions:
    """Energy-vs-deadline curves (:func:`solvers.curve.pareto`) with the fast method and no
    switch costs: the interpolation between grid plans switches tasks in each of
    ``densify_orders`` (Δcost/Δtime, and start order: a prefix speeds up the schedule's early
    part as a whole; with it, lowtime's plans beat the 8x32 curve at no deadline instead of
    three)."""

    densify_orders: tuple[str, ...] = ("ratio", "start")


@dataclass(frozen=True)
class IlpOptions:
    """The MILP (:mod:`solvers.ilp`): its work budget is branch-and-bound nodes.

    A solve may explore ``node_binaries`` / (option variables after fixing) nodes, within
    [``min_nodes``, ``max_nodes``] (``curve_node_binaries`` per point of a curve): a node's LP
    grows with the model, so this keeps a solve's time about the same at every size, and the
    same input gives the same plan on any machine and under any load (issue 32: a 30 s
    wall-clock limit fired under load on a 40-task DAG, and ``auto`` gave another plan).
    Measured on a 40-task, 4-GPU DAG with 12 clocks and switch costs (480 option variables),
    2-core machine: 5,000 nodes take about 8 s with CBC and 18 s with HiGHS.

    ``auto`` uses it up to ``max_binaries`` option variables after fixing and ``max_tasks``
    tasks (``curve_max_binaries`` per point of a curve). Its default safety net is
    ``safety_net_s`` for the whole call, the fast method's warm start included
    (``curve_safety_net_s`` per curve point): 6 to 10 times what the node budget takes on a
    quiet machine, so that it does not fire beside two busy loops. ``mip_starts``: hand the
    warm start to the backend (off: both bundled backends misbehaved with it, see
    :func:`solvers.ilp.solve_ilp`)."""

    max_nodes: int = 20_000
    min_nodes: int = 200
    node_binaries: float = 2_000_000.0
    curve_node_binaries: float = 500_000.0
    max_binaries: int = 3000
    curve_max_binaries: int = 800
    max_tasks: int = 400
    safety_net_s: float = 180.0
    curve_safety_net_s: float = 60.0
    mip_starts: bool = False

    def nodes(self, n_binaries: int) -> int:
        """The node budget of a model with ``n_binaries`` option variables."""
        return int(min(self.max_nodes, max(self.min_nodes, self.node_binaries / max(n_binaries, 1))))


@dataclass(frozen=True)
class DpOptions:
    """The exact chain DP (:mod:`solvers.dp`): at most ``max_labels`` Pareto labels in all
    (past it the plan comes back with its Lagrangian gap; a label keeps 6 bytes for the
    backtrack, so the cap is about 240 MB); the incumbent pass buckets finish times by
    ``bucket_rel`` of the deadline and stops at ``incumbent_max_labels``; a steady-state chain
    is a DP chain when its wrapped devices' first-task clocks give at most ``max_wrap_runs``
    combinations. Measured: a 10,000-task chain with 60 options and 1 ms switches at 1.05x
    needs 28.6 M labels (about 2,800 per position: its Lagrangian band is 2 J of 274 kJ)."""

    max_labels: int = 40_000_000
    incumbent_max_labels: int = 1_000_000
    #: The DP's completion bound is the max over these multiples of the Lagrangian's λ (any
    #: set is valid). On the 10,000-task chain these 3 keep 1 % more labels than 9 spread over
    #: 0.6–1.6 and take 23 s instead of 36 s.
    multipliers: tuple[float, ...] = (0.95, 1.0, 1.05)
    bucket_rel: float = 1e-5
    max_wrap_runs: int = 256


#: The default most tasks a problem may have (:attr:`LimitOptions.max_tasks`, ``--max-tasks``).
#: Measured fast solves at 1.05x on 1F1B without switch costs (60 clocks, 2-core machine,
#: shared and noisy): 8,192 tasks about 9 s, 16,384 about 45 s (0.5 GB), 32,768 about 5.5 min
#: (1.0 GB); past 8,192 tasks the hull LP dominates and its time grows faster than tasks²,
#: so 65,536 would take half an hour or more. 32,768 is the largest power of two a plan
#: finishes within minutes here.
DEFAULT_MAX_TASKS = 32_768


@dataclass(frozen=True)
class LimitOptions:
    """Input limits, checked before anything is allocated for the problem, and where a
    solver call runs so that a signal or the safety net can stop it.

    ``max_tasks``: the most tasks a problem may have (:data:`DEFAULT_MAX_TASKS`; a problem
    above it raises :class:`solvers.model.ProblemTooLargeError`; ``ecal plan --max-tasks``).
    ``max_options``: the most options over all tasks (the index keeps a few arrays of that
    length; 60 clocks × 32,768 tasks is 2 M). ``max_curve_points``: the most deadlines of one
    curve (each is a plan). ``max_dense_cells``: the most (interpolated plan × task) cells a
    curve keeps as choices (one byte each with up to 256 options; the interpolation between
    two grid plans is evaluated in blocks of at most this many cells). ``lp_process_min_tasks``:
    from this many tasks on, the hull LP (and the surrogate LP on its rows) is solved in a
    child process that a signal or the safety net kills at once; smaller LPs solve in this
    process in well under a second (2,048 tasks: about 0.3–0.7 s), which a signal then
    waits for."""

    max_tasks: int = DEFAULT_MAX_TASKS
    max_options: int = 16 * 1024 * 1024
    max_curve_points: int = 1000
    max_dense_cells: int = 1 << 27
    lp_process_min_tasks: int = 2048


@dataclass(frozen=True)
class SolveOptions:
    """All tuning of :func:`solvers.solve` and :func:`solvers.pareto`, per method; the
    defaults are the shipped ones (see each part)."""

    budget: BudgetOptions = BudgetOptions()
    bound: BoundOptions = BoundOptions()
    search: SearchOptions = SearchOptions()
    hold: HoldOptions = HoldOptions()
    portfolio: PortfolioOptions = PortfolioOptions()
    curve: CurveOptions = CurveOptions()
    ilp: IlpOptions = IlpOptions()
    dp: DpOptions = DpOptions()
    limits: LimitOptions = LimitOptions()
