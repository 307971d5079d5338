"""The computed values and line selections that docs/src/*.md call by name.

A ``<!-- value: NAME -->`` directive is replaced by ``NAME()`` of a function registered with
``@value``; ``<!-- include: PATH keep=NAME -->`` keeps the lines that ``NAME(lines)`` of a
function registered with ``@selector`` marks. Values read the tables in experiments/results/
(and .ci/run, pyproject.toml) when a page asks for them, never at import.
"""
import json
import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "experiments/results"
SPREAD = ("search_spread.md", "search_spread_more_deadlines.md")
PORTFOLIO_HEAD = "## The portfolio's plan per seed"

#: name -> zero-argument function giving the text a ``value`` directive pastes
VALUES: dict[str, Callable[[], str]] = {}
#: name -> function marking which lines of an included file an ``include ... keep=`` keeps
SELECTORS: dict[str, Callable[[list[str]], list[bool]]] = {}


def value(fn: Callable[[], str]) -> Callable[[], str]:
    """Register ``fn`` as a value directive under its own name."""
    VALUES[fn.__name__] = fn
    return fn


def selector(fn: Callable[[list[str]], list[bool]]) -> Callable[[list[str]], list[bool]]:
    """Register ``fn`` as a line selection (``keep=NAME``) under its own name."""
    SELECTORS[fn.__name__] = fn
    return fn


# ---------------------------------------------------------------------------------------------
# Reading results tables.
def _table_rows(text: str, prefix: str = "|") -> list[list[str]]:
    """The cells of every Markdown table row in ``text`` that starts with ``prefix``."""
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in text.splitlines()
            if ln.startswith(prefix)]


def _md_rows(path: Path) -> list[list[str]]:
    """The cells of every table row of a results page (header rows included)."""
    return _table_rows(path.read_text())


def _table_lines(path: Path) -> str:
    """A results page's table lines as they stand ("" when the page is absent)."""
    if not path.exists():
        return ""
    return "\n".join(ln for ln in path.read_text().splitlines() if ln.startswith("|"))


def _column(path: Path, name: str, case: str = "") -> list[float]:
    """Column ``name`` as floats, in the rows whose first cell starts with ``case``."""
    rows = _md_rows(path)
    i = rows[0].index(name)
    return [float(r[i]) for r in rows[2:] if r[0].startswith(case) and r[i]]


def _pct_range(values: list[float], digits: int = 2) -> str:
    """``lo–hi %`` of the values (one value when they agree to ``digits``)."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return f"{lo} %" if lo == hi else f"{lo}–{hi} %"


def _share(gaps: list[float], line: float = 0.5) -> str:
    """``k of n``: how many of the gaps are at most ``line`` per cent."""
    return f"{sum(g <= line for g in gaps)} of {len(gaps)}"


# ---------------------------------------------------------------------------------------------
# Project facts.
@value
def test_command() -> str:
    """The test command CI runs (the README states exactly this one): the first pytest line
    of .ci/run (a later one reruns the tests of an optional extra)."""
    path = ROOT / ".ci/run"
    lines = [ln.strip() for ln in path.read_text().splitlines()
             if ln.strip().startswith("python -m pytest")]
    if not lines:
        raise ValueError(f"{path}: no 'python -m pytest' line")
    return lines[0]


@value
def version() -> str:
    """The package version from pyproject.toml."""
    m = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    return m.group(1) if m else "unversioned"


# ---------------------------------------------------------------------------------------------
# Benchmarks: bench_solvers, bench_solvers_highs.
@value
def bench_table() -> str:
    """bench_solvers' table with every column."""
    return _table_lines(RES / "bench_solvers.md")


@value
def short_bench() -> str:
    """The default-install benchmark table with the columns a reader compares."""
    rows = _md_rows(RES / "bench_solvers.md")
    keep = ["case", "method", "wall_s", "max_gap_pct", "lowtime_wall_s", "speedup", "ours_worse_at"]
    idx = [rows[0].index(k) for k in keep]
    out = ["| " + " | ".join(keep) + " |", "|" + "---|" * len(keep)]
    out += ["| " + " | ".join(r[i] for i in idx) + " |" for r in rows[2:]]
    return "\n".join(out)


@value
def kernel_level_note() -> str:
    """kernel_level: the kernel-level plan against the per-stage plan, measured, and what a
    faster switch would buy (predicted)."""
    path = RES / "kernel_level.json"
    if not path.exists():
        return "not measured"
    d = json.loads(path.read_text())
    per_stage, measured, free = d["plans"]
    what = ", ".join(f"{100 * w['predicted_saving_vs_per_stage']:.1f} % at {w['switch_ms']:g} ms"
                     for w in d["what_if"])
    return (f"{d['kernels']:,} kernels of a two-rank transformer step, planned at "
            f"1.05x with switch costs measured on the simulated H200 and run: "
            f"{100 * measured['saving_vs_all_max']:.1f} % below all-max, "
            f"{100 * measured['saving_vs_per_stage']:+.1f} % against the best point per GPU "
            f"(the planner switches {measured['switches']} times: a switch settles in "
            f"{d['switch_settle_ms']:.0f} ms); a plan assuming free switches "
            f"{'met' if free['deadline_met'] else 'missed'} its deadline by "
            f"{abs(free['missed_by_s']) * 1e3:,.0f} ms. Per-kernel clocks would pay with faster "
            f"switches (predicted: {what})")


@value
def scaling_note() -> str:
    """bench_scaling: the fitted exponents (2,048 tasks on), the largest cases with and without
    switch costs, and the 10,000-task chain."""
    path = RES / "bench_scaling.json"
    if not path.exists():
        return "not measured"
    d = json.loads(path.read_text())
    k = d["exponent"]

    def largest(series: str) -> dict:
        return max((r for r in d["rows"] if r["series"] == series), key=lambda r: r["tasks"])

    def at(series: str, tasks: int) -> dict | None:
        return next((r for r in d["rows"] if r["series"] == series and r["tasks"] == tasks), None)

    free, sw = largest("no switch cost"), largest("switches 1 ms")
    sw32 = at("switches 1 ms", 32768)
    chain = next(r for r in d["rows"] if r["case"].startswith("chain"))
    mid = (f"32,768 tasks in {sw32['wall_s']:.0f} s (gap {sw32['gap_pct']:.2f} %) and "
           if sw32 and sw32 is not sw else "")
    return (f"from 2,048 tasks on, time grows as tasks^{k['no switch cost']:.2f} without switch "
            f"costs and tasks^{k['switches 1 ms']:.2f} with 1 ms switches; without switch costs "
            f"{free['tasks']:,} tasks plan in {free['wall_s']:.0f} s (gap {free['gap_pct']:.2f} %, "
            f"peak {free['peak_rss_mb'] / 1024:.1f} GB); with switches {mid}"
            f"{sw['tasks']:,} in {sw['wall_s']:.0f} s (gap {sw['gap_pct']:.2f} %); a "
            f"{chain['tasks']:,}-task chain is proven optimal in {chain['wall_s']:.0f} s")


@value
def curve_cost_note() -> str:
    """bench_curve_cost: what a 20-point curve costs in single plans."""
    path = RES / "bench_curve_cost.json"
    if not path.exists():
        return "not measured"
    rows = json.loads(path.read_text())["rows"]
    return "; ".join(f"{r['case']} {r['ratio']:.1f}×" for r in rows)


@value
def switch_gaps() -> str:
    """The 16x64 with-switches proven gaps of bench_solvers, 1.05x / 1.2x."""
    rows = _md_rows(RES / "bench_solvers.md")
    i = rows[0].index("max_gap_pct")
    return " / ".join(f"{float(r[i]):.3f} %" for r in rows
                      if r[0].startswith("16x64 switches")) or "not measured"


@value
def walls_16x64() -> str:
    """The wall times of those 16x64 plans."""
    walls = _column(RES / "bench_solvers.md", "wall_s", "16x64 switches")
    return " / ".join(f"{w:.1f} s" for w in walls)


@value
def highs_note() -> str:
    """The frontier rows of the benchmark run with highspy installed: wall time and speed-up."""
    path = RES / "bench_solvers_highs.md"
    rows = _md_rows(path) if path.exists() else []
    if not rows:
        return "nothing yet (not run)"
    w, sp = rows[0].index("wall_s"), rows[0].index("speedup")
    return "; ".join(f"{r[0]} {float(r[w]):.1f} s, {float(r[sp]):.1f}x lowtime's speed"
                     for r in rows[2:] if "frontier" in r[0])


# ---------------------------------------------------------------------------------------------
# Why switch costs leave a gap: switch_gap_study, _optimum, _neighbourhood, bench_switch_lp.
@value
def gap_note() -> str:
    """switch_gap_study's table."""
    return _table_lines(RES / "switch_gap_study.md")


@value
def study_best() -> str:
    """How far the best plan found lies above the exact model's LP, over the study's cases."""
    return _pct_range(_column(RES / "switch_gap_study.md", "best_plan_over_transport_lp_pct"))


@value
def study_lift() -> str:
    """The most HiGHS's branch and bound lifted the bound above that LP."""
    lift = _column(RES / "switch_gap_study.md", "milp_bound_over_transport_lp_pct")
    return f"{max(lift):.2f} %"


@value
def optimum_ours() -> str:
    """Our plan above HiGHS's best on the pipelines HiGHS finishes."""
    return _pct_range(_column(RES / "switch_gap_optimum.md", "fast_vs_milp_incumbent_pct"))


@value
def optimum_lp() -> str:
    """The proven optimum above the LP on those pipelines."""
    return _pct_range(_column(RES / "switch_gap_optimum.md", "optimum_over_transport_lp_pct"))


@value
def nb_note() -> str:
    """Per deadline, what HiGHS found in the ±4-clock neighbourhood of our 4x8 plan."""
    rows = _md_rows(RES / "switch_gap_neighbourhood.md")
    h = rows[0]
    best, fast, with_best = (h.index(k) for k in
                             ("best_vs_fast_pct", "fast_gap_pct", "gap_with_best_pct"))
    return "; ".join(
        f"at {r[1]} a plan {-float(r[best]):.3f} % cheaper (gap "
        f"{float(r[fast]):.3f} % → {float(r[with_best]):.3f} %)"
        if float(r[best]) < 0 else f"at {r[1]} nothing cheaper"
        for r in rows[2:])


@value
def nb_16x64() -> str:
    """How much dearer than ours HiGHS's ±1-clock 16x64 plan ended, per cent."""
    return f"{_column(RES / 'switch_gap_neighbourhood_16x64.md', 'milp_plan_vs_fast_pct')[0]:.2f}"


@value
def regret_split() -> str:
    """The 16x64 rows of bench_switch_lp's bound table: clock regret and priced slack, J."""
    rows = _md_rows(RES / "bench_switch_lp.md")
    head = next((r for r in rows if "clock_regret_j" in r), None)
    if head is None:
        return "not measured"
    i, j = head.index("clock_regret_j"), head.index("priced_slack_j")
    parts = [f"{r[0].split('@')[1]}: {float(r[i]):.0f} J and {float(r[j]):.0f} J"
             for r in rows if r[0].startswith("1F1B 16x64") and "@" in r[0]]
    return "; ".join(parts) or "not measured"


# ---------------------------------------------------------------------------------------------
# Held steady states: steady_state_holds.
def _holds() -> tuple[list[float], list[float], list[float], list[float]]:
    """steady_state_holds' columns: one-level and two-level holds over the plan, and the gaps
    of searching again from the plan and from the best two-level hold."""
    path = RES / "steady_state_holds.md"
    return (_column(path, "one_level_over_plan_pct"), _column(path, "two_level_over_plan_pct"),
            _column(path, "searched_again_gap_pct"), _column(path, "two_level_searched_gap_pct"))


@value
def holds_verdict() -> str:
    """Are held plans cheaper than ours, and by how much."""
    one, two = _holds()[:2]
    cheaper = sum(x < 0 for x in one + two)
    if not cheaper:
        return "none is cheaper than ours"
    return (f"{cheaper} of {len(one) + len(two)} {'is' if cheaper == 1 else 'are'} cheaper than "
            f"ours, by at most {-min(one + two):.3f} %")


@value
def holds_detail() -> str:
    """The best holds relative to our plan, and how far searching from the best two-level hold
    ends from searching again."""
    one, two, again, held = _holds()

    def signed(v: list[float]) -> str:
        return f"{min(v):+.3f} to {max(v):+.3f} %".replace("-", "−")

    pts = max(abs(a - b) for a, b in zip(again, held))
    return (f"relative to our plan the best one-level hold is {signed(one)}, the best two-level "
            f"{signed(two)}, and searching from the latter ends within {pts:.2f} points of "
            f"searching again from the plan")


@value
def holds_note() -> str:
    """What searching again (from the plan, or from its best two-level hold) gives on 16x64."""
    rows = _md_rows(RES / "steady_state_holds.md")
    a, b = rows[0].index("searched_again_gap_pct"), rows[0].index("two_level_searched_gap_pct")
    r = [x for x in rows if x[0].startswith("16x64 @")]
    if not r:
        return ""
    again = " / ".join(f"{float(x[a]):.3f} %" for x in r)
    held = " / ".join(f"{float(x[b]):.3f} %" for x in r)
    return (f"A second search with the same budget, from the plan or from its best held steady "
            f"state, ends at {again} and {held} (`results/steady_state_holds.md`).")


# ---------------------------------------------------------------------------------------------
# Seeds and the portfolio: search_spread, search_spread_more_deadlines.
def _spread_tables(name: str) -> tuple[list[list[str]], list[list[str]]]:
    """A search_spread page's 16x64 rows: single searches, then the portfolio's per seed."""
    single, _, port = (RES / name).read_text().partition(PORTFOLIO_HEAD)
    return _table_rows(single, "| 16x64 "), _table_rows(port, "| 16x64 ")


def _per_deadline(rows: list[list[str]], gap: Callable[[list[str]], float]) -> list[str]:
    """Per deadline (column 1): the range of the rows' gaps and how many are at most 0.5 %."""
    out = []
    for dl in dict.fromkeys(r[1] for r in rows):
        g = [gap(r) for r in rows if r[1] == dl]
        out.append(f"{dl}: {min(g):.3f}–{max(g):.3f} %, {_share(g)} seeds ≤ 0.5 %")
    return out


@value
def spread_note() -> str:
    """Per deadline, the range of 16x64 gaps over the shipped caps' seeds and how many prove
    at most 0.5 %, from search_spread."""
    path = RES / SPREAD[0]
    if not path.exists():
        return "not measured"
    rows = _spread_tables(SPREAD[0])[0]
    if not rows:
        return "not measured"
    m = re.search(r"Shipped: caps (\d+/\d+)", path.read_text())
    shipped = m.group(1) if m else ""
    mine = [r for r in rows if r[2] == shipped and float(r[3]) == 1.0]
    allg = [float(r[7]) for r in rows]
    return ("; ".join(_per_deadline(mine, lambda r: float(r[7]))) + f" (caps {shipped}); over "
            f"both searches the gaps span {min(allg):.3f}–{max(allg):.3f} %")


def _portfolio_note(name: str) -> str:
    """Per deadline, the range of a page's 16x64 portfolio gaps over seeds and how many prove
    at most 0.5 %."""
    rows = _spread_tables(name)[1] if (RES / name).exists() else []
    return "; ".join(_per_deadline(rows, lambda r: float(r[5]))) or "not measured"


@value
def portfolio_note() -> str:
    """The portfolio per deadline, from search_spread."""
    return _portfolio_note(SPREAD[0])


@value
def more_deadlines() -> str:
    """The portfolio per deadline, from search_spread_more_deadlines."""
    return _portfolio_note(SPREAD[1])


@value
def single_all() -> str:
    """``k of n``: single 16/64 searches (kick 1) proving at most 0.5 %, on both pages."""
    rows = _spread_tables(SPREAD[1])[0] + _spread_tables(SPREAD[0])[0]
    return _share([float(r[7]) for r in rows if r[2] == "16/64" and float(r[3]) == 1.0])


def _portfolio_gaps() -> list[float]:
    """The portfolio's gaps on both pages."""
    return [float(r[5]) for name in SPREAD for r in _spread_tables(name)[1]]


@value
def port_all() -> str:
    """``k of n``: portfolio runs proving at most 0.5 %."""
    return _share(_portfolio_gaps())


@value
def port_max() -> str:
    """The portfolio's largest gap."""
    return f"{max(_portfolio_gaps()):.3f} %"


@value
def port_margin() -> str:
    """How far under the 0.5 % line the closest portfolio plan is, in J (bound / 0.995 − plan)."""
    margins = []
    for name in SPREAD:
        single, port = _spread_tables(name)
        bound = {r[1]: float(r[6]) for r in single}     # per deadline: the bound
        margins += [bound[r[1]] / 0.995 - float(r[4]) for r in port]
    return f"{min(margins):.1f}"


# ---------------------------------------------------------------------------------------------
# The simulator and adaptive characterization.
@value
def corun_table() -> str:
    """The simulator's co-run agreement with the real H200 composites: deviations from the
    ⊕/⊗ prediction only (composite, real, simulated, agreement)."""
    path = RES / "sim_corun_calibration.md"
    rows = _table_rows(path.read_text())[2:] if path.exists() else []
    out = ["| composite | real: measured vs prediction, T / E | simulated H200, T / E | "
           "direction, size agree (T / E) |", "|---|---|---|---|"]
    # the composites table only (the file's later tables, e.g. split co-runs, have other columns)
    out += [f"| {r[0]} | {r[5]} % | {r[6]} % | {r[7]}; {r[8]} |" for r in rows
            if len(r) >= 9 and r[0].startswith(("par_", "seq_"))]
    return "\n".join(out)


ADAPTIVE_MD = RES / "adaptive_characterization.md"
#: the page's column -> the README's heading (older pages say "max plan gap")
ADAPTIVE_COLUMNS = {"group": "group", "measured/grid": "measured/grid", "GPU-s %": "GPU-s %",
                    "max gap, expected": "max gap, expected", "max plan gap": "max gap, measured",
                    "max gap, measured": "max gap, measured",
                    "deadlines within 0.3 %, expected": "deadlines within 0.3 %, expected"}
ADAPTIVE_PLACEHOLDER = ("<!-- ADAPTIVE-TABLE: placeholder; experiments/results/adaptive_characterization.md "
                        "has no per-group table this build could read -->\n"
                        "*(table pending: run `python experiments/adaptive_characterization.py`)*")


@value
def adaptive_target() -> str:
    """The results page's own statement of its target (its first 'Target:' sentence, without
    the full stop)."""
    text = ADAPTIVE_MD.read_text() if ADAPTIVE_MD.exists() else ""
    m = re.search(r"^Target: (.*?)\.(?:\s|$)", text, re.M)
    return m.group(1) if m else "plans close to the full grid's at a fraction of its GPU-seconds"


@value
def short_adaptive(max_rows: int = 3) -> str:
    """At most ``max_rows`` per-group rows of the adaptive experiment, in the columns a reader
    compares that the page has; a marked placeholder when the page has no per-group table."""
    text = ADAPTIVE_MD.read_text() if ADAPTIVE_MD.exists() else ""
    if "## Per group" not in text:
        return ADAPTIVE_PLACEHOLDER
    rows = _table_rows(text.split("## Per group", 1)[1].split("\n## ", 1)[0])
    if len(rows) < 3:
        return ADAPTIVE_PLACEHOLDER
    want = [k for k in ADAPTIVE_COLUMNS if k in rows[0]]
    idx = [rows[0].index(k) for k in want]
    out = ["| " + " | ".join(ADAPTIVE_COLUMNS[k] for k in want) + " |", "|" + "---|" * len(want)]
    out += ["| " + " | ".join(r[i] for i in idx) + " |" for r in rows[2:2 + max_rows]]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Line selections of pasted outputs (the tool shows each run of left-out lines as one "…").
@selector
def demo_lines(lines: list[str]) -> list[bool]:
    """The demo's header, its measured savings (the block "4. …") and its plans' certificate
    lines ("method …"); no blank lines."""
    blocks = "\n".join(lines).split("\n\n")
    kept = set(blocks[0].splitlines())
    for b in blocks:
        if b.startswith("4. "):
            kept.update(b.splitlines())
    kept.update(ln for ln in lines if ln.startswith("method "))
    return [ln in kept and ln.strip() != "" for ln in lines]


@selector
def route_plan_lines(lines: list[str]) -> list[bool]:
    """The plan's headline: what it is, deadline, makespan, energy, switches, bound."""
    head = ("plan for", "  deadline", "  solved at", "  makespan", "  energy", "  switches")
    return [ln.startswith(head) for ln in lines]


@selector
def route_run_lines(lines: list[str]) -> list[bool]:
    """``ecal run``'s step row of the plan (with its column header), savings and result: no
    per-device rows, no baseline rows (the savings line measures against them)."""
    base = next((i for i, ln in enumerate(lines) if ln.startswith("baseline ")), len(lines))

    def keep(i: int, ln: str) -> bool:
        step_row = ln.startswith("  step ") and not ln.startswith("  step dE")
        if i < base:
            return step_row or ln.startswith("plan:") or ln.lstrip().startswith("T pred ms")
        return ln.startswith(("savings", "  vs ", "result: "))
    return [keep(i, ln) for i, ln in enumerate(lines)]


@selector
def route_tune_lines(lines: list[str]) -> list[bool]:
    """``ecal tune``'s own table (rounds, last run, verdict), not the tuned plan's summary."""
    start = next((i for i, ln in enumerate(lines) if ln.startswith("tune ")), len(lines))
    # the verdict line repeats what the last round's result says
    return [i >= start and not ln.startswith("converged") for i, ln in enumerate(lines)]


@value
def tune_deadlines() -> str:
    """experiments/tune_deadlines.py's table (model-alone vs tuned plans on held-out seeds)."""
    return _table_lines(RES / "tune_deadlines.md")


@value
def context_planning() -> str:
    """experiments/context_planning.py's table (plans at the null context vs in context)."""
    return _table_lines(RES / "context_planning.md")


@value
def context_planning_steady() -> str:
    """experiments/context_planning.py --warmup-steps 8: the same at the thermal steady state."""
    return _table_lines(RES / "context_planning_steady.md")
