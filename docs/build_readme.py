"""Rebuild README.md and the generated docs pages from the outputs in docs/out/ and the
tables in experiments/results/ (run by docs/make_figures.sh, from the repository root).

README.md is a user's page (at most README_MAX_LINES lines); what it leaves out is in
docs/demo.md, docs/loop.md, docs/api.md, docs/guarantees.md, docs/cli.md and docs/studies.md,
all written here. Pasted outputs are shortened only by leaving lines out (shown as one "…" line each run).
"""
import re
from collections.abc import Callable
from pathlib import Path

README_MAX_LINES = 250


def o(name: str) -> str:
    """A captured command output."""
    return Path(f"docs/out/{name}.txt").read_text().rstrip("\n")


bench = Path("experiments/results/bench_solvers.md").read_text()
gap_md = Path("experiments/results/switch_gap_study.md")
gap_note = "\n".join(ln for ln in gap_md.read_text().splitlines() if ln.startswith("|")) if gap_md.exists() else ""
bench_table = "\n".join(ln for ln in bench.splitlines() if ln.startswith("|"))
corun_md = Path("experiments/results/sim_corun_calibration.md")


def corun_table() -> str:
    """The simulator's co-run agreement with the real H200 composites: deviations from the
    ⊕/⊗ prediction only (composite, real, simulated, agreement)."""
    rows = _table_rows(corun_md.read_text())[2:] if corun_md.exists() else []
    out = ["| composite | real: measured vs prediction, T / E | simulated H200, T / E | direction, size agree (T / E) |",
           "|---|---|---|---|"]
    # the composites table only (the file's later tables, e.g. split co-runs, have other columns)
    out += [f"| {r[0]} | {r[5]} % | {r[6]} % | {r[7]}; {r[8]} |" for r in rows
            if len(r) >= 9 and r[0].startswith(("par_", "seq_"))]
    return "\n".join(out)




def regret_split(path: Path = Path("experiments/results/bench_switch_lp.md")) -> str:
    """The 16x64 rows of bench_switch_lp's bound table: clock regret and priced slack, J."""
    rows = _md_rows(path)
    head = next((r for r in rows if "clock_regret_j" in r), None)
    if head is None:
        return "not measured"
    i, j = head.index("clock_regret_j"), head.index("priced_slack_j")
    parts = [f"{r[0].split('@')[1]}: {float(r[i]):.0f} J and {float(r[j]):.0f} J"
             for r in rows if r[0].startswith("1F1B 16x64") and "@" in r[0]]
    return "; ".join(parts) or "not measured"


def _table_rows(text: str, prefix: str = "|") -> list[list[str]]:
    """The cells of every Markdown table row in ``text`` that starts with ``prefix``."""
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in text.splitlines()
            if ln.startswith(prefix)]


def _md_rows(path: Path) -> list[list[str]]:
    """The cells of every table row of a results page (header rows included)."""
    return _table_rows(path.read_text())


def switch_gaps(path: Path = Path("experiments/results/bench_solvers.md")) -> str:
    """The 16x64 with-switches proven gaps of bench_solvers, 1.05x / 1.2x."""
    rows = _md_rows(path)
    i = rows[0].index("max_gap_pct")
    gaps = [f"{float(r[i]):.3f} %" for r in rows if r[0].startswith("16x64 switches")]
    return " / ".join(gaps) or "not measured"


PORTFOLIO_HEAD = "## The portfolio's plan per seed"


def _spread_tables(path: Path) -> tuple[list[list[str]], list[list[str]]]:
    """search_spread's 16x64 rows: single searches, then the portfolio's per seed."""
    single, _, port = path.read_text().partition(PORTFOLIO_HEAD)
    return _table_rows(single, "| 16x64 "), _table_rows(port, "| 16x64 ")


def spread_note(path: Path = Path("experiments/results/search_spread.md")) -> str:
    """Per deadline, the range of 16x64 gaps over the shipped caps' seeds and how many prove
    at most 0.5 %, from search_spread."""
    if not path.exists():
        return "not measured"
    rows = _spread_tables(path)[0]
    m = re.search(r"Shipped: caps (\d+/\d+)", path.read_text())
    shipped = m.group(1) if m else ""
    out = []
    for dl in dict.fromkeys(r[1] for r in rows):
        g = [float(r[7]) for r in rows if r[1] == dl and r[2] == shipped and float(r[3]) == 1.0]
        out.append(f"{dl}: {min(g):.3f}–{max(g):.3f} %, {sum(x <= 0.5 for x in g)} of {len(g)} seeds ≤ 0.5 %")
    allg = [float(r[7]) for r in rows]
    return ("; ".join(out) + f" (caps {shipped}); over both searches the gaps span "
            f"{min(allg):.3f}–{max(allg):.3f} %") if rows else "not measured"


def portfolio_note(path: Path = Path("experiments/results/search_spread.md")) -> str:
    """Per deadline, the range of the 16x64 portfolio's gaps over seeds and how many prove at
    most 0.5 %, from search_spread's second table."""
    rows = _spread_tables(path)[1] if path.exists() else []
    out = []
    for dl in dict.fromkeys(r[1] for r in rows):
        g = [float(r[5]) for r in rows if r[1] == dl]
        out.append(f"{dl}: {min(g):.3f}–{max(g):.3f} %, {sum(x <= 0.5 for x in g)} of {len(g)} seeds ≤ 0.5 %")
    return "; ".join(out) or "not measured"


def holds_note(path: Path = Path("experiments/results/steady_state_holds.md")) -> str:
    """What searching again (from the plan, or from its best two-level hold) gives on 16x64."""
    rows = _md_rows(path)
    head = rows[0]
    a, b = head.index("searched_again_gap_pct"), head.index("two_level_searched_gap_pct")
    r = [x for x in rows if x[0].startswith("16x64 @")]
    if not r:
        return ""
    again = " / ".join(f"{float(x[a]):.3f} %" for x in r)
    held = " / ".join(f"{float(x[b]):.3f} %" for x in r)
    return (f"A second search with the same budget, from the plan or from its best held steady "
            f"state, ends at {again} and {held} (`results/steady_state_holds.md`).")


def _column(path: Path, name: str, case: str = "") -> list[float]:
    """The float values of column ``name`` in the rows of a results page whose first cell
    starts with ``case``."""
    rows = _md_rows(path)
    i = rows[0].index(name)
    return [float(r[i]) for r in rows[2:] if r[0].startswith(case) and r[i]]


def pct_range(values: list[float], digits: int = 2) -> str:
    """``lo–hi %`` of the values (one value when they agree to ``digits``)."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return f"{lo} %" if lo == hi else f"{lo}–{hi} %"


RES = Path("experiments/results")
study_best = pct_range(_column(RES / "switch_gap_study.md", "best_plan_over_transport_lp_pct"))
study_lift = f"{max(_column(RES / 'switch_gap_study.md', 'milp_bound_over_transport_lp_pct')):.2f} %"
optimum_ours = pct_range(_column(RES / "switch_gap_optimum.md", "fast_vs_milp_incumbent_pct"))
optimum_lp = pct_range(_column(RES / "switch_gap_optimum.md", "optimum_over_transport_lp_pct"))
nb_4x8 = _md_rows(RES / "switch_gap_neighbourhood.md")
nb_head = nb_4x8[0]
nb_note = "; ".join(
    f"at {r[1]} a plan {-float(r[nb_head.index('best_vs_fast_pct')]):.3f} % cheaper (gap "
    f"{float(r[nb_head.index('fast_gap_pct')]):.3f} % → {float(r[nb_head.index('gap_with_best_pct')]):.3f} %)"
    if float(r[nb_head.index("best_vs_fast_pct")]) < 0 else f"at {r[1]} nothing cheaper"
    for r in nb_4x8[2:])
nb_16x64 = _column(RES / "switch_gap_neighbourhood_16x64.md", "milp_plan_vs_fast_pct")[0]

def holds_summary(path: Path = RES / "steady_state_holds.md") -> tuple[str, str]:
    """(verdict, detail) of steady_state_holds: are held plans cheaper than ours, by how much,
    and how far searching from the best two-level hold ends from searching again."""
    one = _column(path, "one_level_over_plan_pct")
    two = _column(path, "two_level_over_plan_pct")
    again = _column(path, "searched_again_gap_pct")
    held = _column(path, "two_level_searched_gap_pct")

    def signed(v: list[float]) -> str:
        lo, hi = min(v), max(v)
        return f"{lo:+.3f} to {hi:+.3f} %".replace("-", "−")

    cheaper = sum(x < 0 for x in one + two)
    verdict = ("none is cheaper than ours" if not cheaper else
               f"{cheaper} of {len(one) + len(two)} {'is' if cheaper == 1 else 'are'} cheaper than ours, by at most "
               f"{-min(one + two):.3f} %")
    pts = max(abs(a - b) for a, b in zip(again, held))
    detail = (f"relative to our plan the best one-level hold is {signed(one)}, the best two-level "
              f"{signed(two)}, and searching from the latter ends within {pts:.2f} points of "
              f"searching again from the plan")
    return verdict, detail


holds_verdict, holds_detail = holds_summary()
regret_note = regret_split()
holds_note_text = holds_note()
gaps_16x64 = switch_gaps()
spread = spread_note()
portfolio = portfolio_note()
more_deadlines = portfolio_note(RES / "search_spread_more_deadlines.md")
_single = _spread_tables(RES / "search_spread_more_deadlines.md")[0]
_single += _spread_tables(RES / "search_spread.md")[0]
_one = [float(r[7]) for r in _single if r[2] == "16/64" and float(r[3]) == 1.0]
single_all = f"{sum(g <= 0.5 for g in _one)} of {len(_one)}"
_port = [float(r[5]) for f in ("search_spread.md", "search_spread_more_deadlines.md")
         for r in _spread_tables(RES / f)[1]]
port_all = f"{sum(g <= 0.5 for g in _port)} of {len(_port)}"
port_max = f"{max(_port):.3f} %"
# how far under the 0.5 % line the closest portfolio plan is, in J (bound / 0.995 − plan)
_bounds = {(f, r[1]): float(r[6]) for f in ("search_spread.md", "search_spread_more_deadlines.md")
           for r in _spread_tables(RES / f)[0]}
port_margin = f"{min(_bounds[(f, r[1])] / 0.995 - float(r[4]) for f in ('search_spread.md', 'search_spread_more_deadlines.md') for r in _spread_tables(RES / f)[1]):.1f}"
walls_16x64 = " / ".join(f"{w:.1f} s" for w in _column(RES / "bench_solvers.md", "wall_s", "16x64 switches"))

def _highs_note(path: Path = RES / "bench_solvers_highs.md") -> str:
    """The frontier rows of the benchmark run with highspy installed: wall time and speed-up."""
    rows = _md_rows(path) if path.exists() else []
    if not rows:
        return "nothing yet (not run)"
    h = rows[0]
    w, sp = h.index("wall_s"), h.index("speedup")
    out = [f"{r[0]} {float(r[w]):.1f} s, {float(r[sp]):.1f}x lowtime's speed"
           for r in rows[2:] if "frontier" in r[0]]
    return "; ".join(out)


highs_note = _highs_note()


def ci_test_command(path: Path = Path(".ci/run")) -> str:
    """The test command CI runs (the README states exactly this one)."""
    lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip().startswith("python -m pytest")]
    if not lines:
        raise SystemExit(f"{path}: no 'python -m pytest' line")
    return lines[-1]


def project_version(path: Path = Path("pyproject.toml")) -> str:
    """The package version from pyproject.toml."""
    m = re.search(r'^version\s*=\s*"([^"]+)"', path.read_text(), re.M)
    return m.group(1) if m else "unversioned"


TEST_COMMAND = ci_test_command()
VERSION = project_version()


# ---------------------------------------------------------------------------------------------
# Excerpts of pasted outputs. Outputs are shortened only by leaving lines out; every run of
# left-out lines shows as one "…" line, so nothing pasted is edited.
ELLIPSIS = "…"


def excerpt(text: str, keep: Callable[[str], bool]) -> str:
    """The lines of ``text`` for which ``keep(line)`` holds, each run of others as one "…"."""
    out: list[str] = []
    for ln in text.splitlines():
        if keep(ln):
            out.append(ln)
        elif not out or out[-1] != ELLIPSIS:
            out.append(ELLIPSIS)
    return "\n".join(out)


def demo_excerpt(text: str) -> str:
    """The demo's header, its measured savings and its plan's certificate line."""
    blocks = text.split("\n\n")
    kept = set(blocks[0].splitlines())
    for b in blocks:
        if b.startswith("4. "):
            kept.update(b.splitlines())
    kept.update(ln for ln in text.splitlines() if ln.startswith("method "))
    return excerpt(text, lambda ln: ln in kept and ln.strip() != "")


def route_plan_excerpt(text: str) -> str:
    """The plan's headline: what it is, deadline, makespan, energy, switches, bound."""
    return excerpt(text, lambda ln: ln.startswith(("plan for", "  deadline", "  solved at",
                                                    "  makespan", "  energy", "  switches")))


def route_run_excerpt(text: str) -> str:
    """``ecal run``'s step rows (with their column header) and savings: no per-device rows."""
    def keep(ln: str) -> bool:
        step_row = ln.startswith("  step ") and not ln.startswith("  step dE")
        return step_row or ln.startswith(("plan:", "baseline ", "savings", "  vs ", "result: ")) \
            or ln.lstrip().startswith("T pred ms")
    return excerpt(text, keep)


# ---------------------------------------------------------------------------------------------
# Tables read from experiments/results at build time.
def short_bench(path: Path = RES / "bench_solvers.md") -> str:
    """The default-install benchmark table with the columns a reader compares."""
    rows = _md_rows(path)
    keep = ["case", "method", "wall_s", "max_gap_pct", "lowtime_wall_s", "speedup", "ours_worse_at"]
    idx = [rows[0].index(k) for k in keep]
    out = ["| " + " | ".join(keep) + " |", "|" + "---|" * len(keep)]
    out += ["| " + " | ".join(r[i] for i in idx) + " |" for r in rows[2:]]
    return "\n".join(out)


ADAPTIVE_MD = RES / "adaptive_characterization.md"
ADAPTIVE_COLUMNS = {"group": "group", "measured/grid": "measured/grid", "GPU-s %": "GPU-s %",
                    "max gap, expected": "max gap, expected", "max plan gap": "max gap, measured",
                    "max gap, measured": "max gap, measured",
                    "deadlines within 0.3 %, expected": "deadlines within 0.3 %, expected"}
ADAPTIVE_PLACEHOLDER = ("<!-- ADAPTIVE-TABLE: placeholder; experiments/results/adaptive_characterization.md "
                        "has no per-group table this build could read -->\n"
                        "*(table pending: run `python experiments/adaptive_characterization.py`)*")


def adaptive_target(path: Path = ADAPTIVE_MD) -> str:
    """The results page's own statement of its target (its first 'Target:' sentence, without
    the full stop)."""
    m = re.search(r"^Target: (.*?)\.(?:\s|$)", path.read_text(), re.M) if path.exists() else None
    return m.group(1) if m else "plans close to the full grid's at a fraction of its GPU-seconds"


def short_adaptive(path: Path = ADAPTIVE_MD, max_rows: int = 3) -> str:
    """At most ``max_rows`` per-group rows of the adaptive experiment, in the columns a reader
    compares that the page has; a marked placeholder when the page has no per-group table."""
    text = path.read_text() if path.exists() else ""
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


def example_code(path: str) -> str:
    """A docs/ example script without its two header lines (docstring, blank)."""
    return Path(path).read_text().split(chr(10), 2)[2].rstrip()


# ---------------------------------------------------------------------------------------------
# README.md: a user's page. Research narrative, full outputs and details live in docs/.

# The route's code, shown in README.md (short) and docs/loop.md (in full): one copy each.
ROUTE_FACTORY = """```python
# mytrain.py
def make_fwd():
    model, x = build_stage(0).cuda(), make_batch()
    return lambda: model(x)
```"""
_CHARACTERIZE = """```bash
ecal characterize mytrain:make_fwd mytrain:make_bwd --name fwd --name bwd \\
     --device nvml:0 -o sigs.json --results sweep.jsonl     # resumable{note}
```"""
ROUTE_CHARACTERIZE = _CHARACTERIZE.format(note="")
ROUTE_CHARACTERIZE_LOOP = _CHARACTERIZE.format(note="; docs/characterize.md")
ROUTE_WORKLOAD = """```json
{"format": "ecal.workload/1",
 "elements": {"fwd": {"source": "sigs.json", "work": "mytrain:make_fwd"},
              "bwd": {"source": "sigs.json", "work": "mytrain:make_bwd"}},
 "shape": {"kind": "1f1b", "stages": 4, "microbatches": 8, "forward": "fwd", "backward": "bwd"},
 "idle_power_w": 122, "transitions": {"constant": {"time_s": 0.002}}}
```"""
ROUTE_APPLY = """```python
from measure.apply import PlanApplier, task_name
with PlanApplier.from_schedule("schedule.json", rank=pp_rank, device="nvml:0") as applier:
    for step in range(steps):
        for inst, mb in my_1f1b_order(pp_rank):
            with applier.element(task_name(pp_rank, inst, mb)):
                run(inst, mb)
```"""

def readme_md() -> str:
    """The README: what it is, set up, demo, the route into a training loop, CLI, API, file
    formats, guarantees and limits, the benchmark, adaptive characterization, more, cite."""
    return f'''# energy-calculus

**Spend less GPU energy without missing your deadline.** energy-calculus measures the
time–energy frontier of each piece of your GPU work (kernel, layer, pipeline stage) over SM
clock, memory clock, power limit and SM split; composes frontiers with an algebra that carries
measurement uncertainty (⊗ back to back, ⊕ on one GPU, ⊕multi across GPUs, any DAG); picks
every task's operating point for least energy under a deadline, paying for clock switches, with
a proven bound; then runs the plan and checks it against a measurement. It implements the
*Energy Calculus* (E = s·T + d) next to Zeus (power limits) and Perseus/lowtime (per-stage
clocks): it reads what they measure and exports to Zeus ([docs/zeus.md](docs/zeus.md)).

![Element frontiers and the composed 1F1B step, simulated H200](docs/demo/frontiers.png) ![The planned step: tasks per GPU coloured by power](docs/demo/timeline.png)

*`ecal demo --out docs/demo` (simulated H200); `bash docs/make_figures.sh` regenerates every figure and output here.*

## Set up

Python ≥ 3.10, no GPU needed. The main job — characterize, plan, run and measure a
pipeline-parallel training step on the bundled **simulated** H200 (under a minute):

```bash
python3 -m venv .venv && . .venv/bin/activate && pip install -e . && ecal demo
```

The tests, in that environment, as CI runs them (`.ci/run`):

```bash
pip install -e ".[test,zeus,ray]" && {TEST_COMMAND}
```

Extras: `.[highs]` (HiGHS MILP back end; CBC otherwise), `.[torch]` (SM splits through CUDA green
contexts), `.[zeus]`, `.[ray]`, `.[bench]` (lowtime). On a real GPU, clock locks and power limits need root.

## The demo

A 1F1B step on four simulated H200s: plan 1, from elements characterized alone, is run and
flagged (Eq. 23); what deviated is characterized; plan 2 is run next to the baselines, so the
savings are **measured** ([docs/demo.md](docs/demo.md): every step, in full).

```text
$ ecal demo
{demo_excerpt(o("demo"))}
```

## From your training step to a plan in your loop

In full: [docs/loop.md](docs/loop.md). **1. Characterize your code** ([docs/characterize.md](docs/characterize.md)):
a factory builds model and batch outside every timed window and returns the step.

{ROUTE_FACTORY}

{ROUTE_CHARACTERIZE}

**2. Describe the step** in a workload file ([docs/workload.md](docs/workload.md)): elements, shape
(1F1B, GPipe, interleaved 1F1B, chain, DAG), idle power, switch costs ([docs/steady_state.md](docs/steady_state.md)).

{ROUTE_WORKLOAD}

**3. Plan, run, measure** against every task at the top clock (bundled example, simulated). The measurement
is authoritative: here the assumed 2 ms switches and bubble power were wrong, and the step ran 0.6 % late.

```text
$ ecal plan ecal/examples/workload_1f1b.json --deadline 1.05x -o plan.json --schedule schedule.json
{route_plan_excerpt(o("route_plan"))}
$ ecal run plan.json --workload ecal/examples/workload_1f1b.json
{route_run_excerpt(o("route_run"))}
```

**4. Apply it in your loop** ([docs/examples/README.md](docs/examples/README.md); try
`python docs/examples/pytorch_1f1b_loop.py --device sim`):

{ROUTE_APPLY}

## Command line

| command | does |
|---|---|
| `ecal characterize WORK...` | signatures of a preset or your `module:factory` over a grid; resumable |
| `ecal frontier FILE` | Pareto frontier per element (`--criterion TE/Td/Tsd`) |
| `ecal compose FILE` / `ecal check FILE` | predicted T, E ± σ / Eq. 23 against measured composites; `--pairs`: which to characterize jointly |
| `ecal plan WORKLOAD --deadline 1.05x` | least-energy operating point per task, switch costs, bound and gap |
| `ecal pareto WORKLOAD` | the energy-vs-deadline curve; `--plan-at D` gives any point's plan |
| `ecal run PLAN` | execute a plan, measure it, Eq. 23 per device and step, measured savings |
| `ecal campaign FILE` | many elements over many GPUs (local or `--ray`) into one SQLite store |
| `ecal store import/export/list STORE` | that store: import and export signature files and results logs |
| `ecal import KIND` / `ecal export zeus-pfo` | `h200`, `nv-dvfs`, `zeus-monitor`, `zeus-plo`, `perseus`, … / to Zeus |
| `ecal transitions WORKLOAD` | measure the switch costs a workload's plan will pay |
| `ecal demo` / `ecal selftest` / `ecal restore` / `ecal schema` | the closed loop on the simulator / check your GPU first / put back GPU settings / the file formats |

WORKLOAD: a workload file, a Perseus profile CSV or a problem JSON; `--json` for scripts. Exit
codes: `0` ok, `1` flagged or deadline missed, `2` bad input, `3` your work raised, `70` a bug in ecal (traceback), `130` interrupted. In full: [docs/cli.md](docs/cli.md).

## Python API

Independent libraries `frontier` (algebra), `solvers` (planning), `measure` (devices, execution); more: [docs/api.md](docs/api.md).

```python
{example_code("docs/api_quickstart.py")}
```

```text
{o("api_quickstart")}
```

## File formats

| file | written by | format (all: `ecal schema`, [docs/formats.md](docs/formats.md)) |
|---|---|---|
| signatures (JSON) | `characterize -o`, `import`, `frontier -o` | [frontier/io.py](frontier/io.py) |
| results log (JSON lines) | `characterize --results` | [measure/results_log.py](measure/results_log.py) |
| campaign store (SQLite) | `campaign`, `store import` | [measure/store.py](measure/store.py), [docs/campaign.md](docs/campaign.md) |
| workload (JSON) | you | [docs/workload.md](docs/workload.md) |
| problem, plan (JSON) | `plan -o`, `demo` | [solvers/io.py](solvers/io.py), [solvers/plan.py](solvers/plan.py) |
| schedule (per rank, in order) | `plan --schedule` | [measure/schedule.py](measure/schedule.py) |
| transitions, interaction table | `measure_transitions`, `demo` | [frontier/transition.py](frontier/transition.py), [frontier/interaction_io.py](frontier/interaction_io.py) |

## Guarantees and limits

- **The GPU is put back** on exit, error or signal, also on a full disk; after a kill, the next
  run or `sudo ecal restore` restores it from a journal written before each change.
- **Nothing measured is lost or mixed**: points appended as measured; a resume on another device,
  driver, seed or protocol is refused. **Shared nodes**: 0700 state; planted files refused.
- **Deadlines**: makespan + z·σ_T ≤ deadline at `--confidence` (0.95), P(met) stated; `ecal run`
  says `met` / `MISSED by X ms`, exit 1 on a miss (σ_T excludes thermal drift: see limits).
- **Plans are honest** ([docs/certificates.md](docs/certificates.md)): the bound is its own;
  `optimal` only when proven; switches never free by accident; σ: k uses add k²·var.
- **Limits**: a real H200 checked read-only only ([selftest](docs/selftest.md): a capped kernel beside low-power work runs faster than ⊗ says); simulated 1.05x plans still often end
  0.1–0.6 % late (thermal context); counters resolve ~1 %. In full: [docs/guarantees.md](docs/guarantees.md).

## Benchmark

Our planner against lowtime 0.3.0 (Perseus's solver) on Perseus-format profiles, one process,
same accounting, default install plus lowtime (ratios carry over between machines, times do not).
`max_gap_pct`: each plan's proven gap; `ours_worse_at`: lowtime plans our curve does not match or beat.

```bash
pip install -e ".[bench]" && python experiments/bench_solvers.py --lowtime-8x32
```

{short_bench()}

All columns: [bench_solvers.md](experiments/results/bench_solvers.md); with `.[highs]`: [bench_solvers_highs.md](experiments/results/bench_solvers_highs.md);
time against size (512–8,192 tasks): [bench_scaling.md](experiments/results/bench_scaling.md), [figure](experiments/results/bench_scaling.png).

## Adaptive characterization

`ecal characterize WORK --adaptive` measures only the points that can matter (target: {adaptive_target()}).
Against the full grid (`python experiments/adaptive_characterization.py`), "expected" judges both plans by the
simulator's noise-free values; the large measured gaps are the full grid's lucky runs ([docs/adaptive.md](docs/adaptive.md)):

{short_adaptive()}

![Adaptive vs full grid: measured points and frontiers](experiments/results/adaptive_characterization.png)

## More

Using it: [cli](docs/cli.md), [demo](docs/demo.md), [loop](docs/loop.md), [api](docs/api.md), [characterize](docs/characterize.md), [workload](docs/workload.md),
[steady state](docs/steady_state.md), [campaign](docs/campaign.md), [adaptive](docs/adaptive.md), [zeus](docs/zeus.md), [selftest](docs/selftest.md).
What holds: [guarantees](docs/guarantees.md), [certificates](docs/certificates.md), [simulator](docs/simulator.md). How it works: [solver](docs/solver.md), [studies](docs/studies.md).

## Cite

The calculus: cite the paper this toolkit implements, *Energy Calculus: A Compositional Algebra
of Energy in Computational Systems* (ML.ENERGY group, University of Michigan). The toolkit: cite
this repository (energy-calculus {VERSION}) and the commit you used.
'''


# ---------------------------------------------------------------------------------------------
# docs/ pages that hold what the README leaves out.
def demo_page_md() -> str:
    """docs/demo.md: what the demo does, its full output and its figures."""
    return f'''# The demo: plan, run, localize, characterize, plan again

`ecal demo` runs the main job end to end on the bundled **simulated** H200 (no GPU needed;
`ecal demo --out DIR` keeps every file it writes). The workload is a synchronous 1F1B step:
4 stages × 8 microbatches, one GPU per stage, each task a compute ⊕ send pair.

1. **Plan 1**, composed from elements characterized alone (a flat 2 ms per switch, bubbles at
   the top clock's ready power), is **run** on four simulated H200s and checked with Eq. 23.
2. What deviated is **localized** from per-task windows of that run and **characterized**:
   switch latencies between the operating points in use, bubble power per GPU from the
   measured waits, and the compute ∥ send pairs whose co-run deviates, measured jointly.
3. **Plan 2** uses those measurements and is run next to two baselines (every GPU at its top
   clock and limit; the best single operating point), so the savings are **measured**.
   What still deviates beyond σ is said and traced, not hidden.
4. The energy saved, measured against the measured baselines, with σ from both sides.

```text
$ ecal demo --out docs/demo
{o("demo")}
```

![Element frontiers and the composed 1F1B step](demo/frontiers.png)
![The planned step: tasks per GPU coloured by power](demo/timeline.png)
![Energy vs deadline for the round-2 problem](demo/pareto.png)

A plan is as good as its characterization: plan 2's measured step can still end a little past
its deadline (co-runs run slower in the heat of repeated steps than characterized), so plan
with that margin and check with `ecal run` ([guarantees.md](guarantees.md)).
'''


def loop_page_md() -> str:
    """docs/loop.md: from your training step to a plan in your training loop, in full."""
    return f'''# From your training step to a plan in your training loop

The README's route with every detail and the full outputs (`docs/make_figures.sh` pastes them
from real runs on the bundled example).

**1. Characterize your code.** Name it `module:attribute`; it is imported from the current
folder. A factory builds model and batch once, outside every timed window, and returns the
step (a plain zero-argument step works too). Without `--grid`, the grid comes from your
GPU's own supported clocks and power limits; several works share one ready-power calibration
per operating point (43 % less device time for 4 elements, `experiments/bench_ready_power.py`).

{ROUTE_FACTORY}

{ROUTE_CHARACTERIZE_LOOP}

**2. Describe the step** in a workload file ([workload.md](workload.md)): the elements, where their
signatures are, the shape — 1F1B, GPipe, interleaved 1F1B, a chain or a DAG —, idle power
and switch costs. Switches are never free by accident: a workload without `transitions` is
refused with one line naming the ways to give them. `ecal transitions workload.json --device
nvml:0 -o transitions.json` measures every switch between the operating points your
signatures use and fits a rule for the rest (`"transitions": {{"file": "transitions.json"}}`);
a constant you know also does; `"transitions": "free"` plans them free and every plan prints
that as an assumption ([workload.md](workload.md)). A step that repeats pays the switch from
its last task back to its first (`steady_state`, the default for pipelines;
[steady_state.md](steady_state.md)).

{ROUTE_WORKLOAD}

**3. Plan, then run the plan and measure it.** `ecal run` executes the plan with your work
at the planned clocks (a real GPU runs single-device plans; `--device sim` runs the bundled
example on simulated H200s) and against every task at the top clock. On the bundled
example (its elements are simulated presets):

```text
$ ecal plan ecal/examples/workload_1f1b.json --deadline 1.05x -o plan.json --schedule schedule.json
{o("route_plan")}
$ ecal run plan.json --workload ecal/examples/workload_1f1b.json
{o("route_run")}
```

**The deadline, at a confidence.** The plan keeps the deadline at `--confidence P` (default
0.95): its predicted makespan plus z_P·σ_T meets the deadline, σ_T being the plan's
propagated σ of the makespan. When the least-energy plan at the deadline does not, it is
planned again at the deadline less z·σ_T (`solved at`; the method's bound, gap and `optimal`
are for that deadline). Every plan states P(makespan ≤ deadline) from its σ, in its summary
and its file (`p_meets_deadline`). Here: 3.9 J (0.14 %) more than the plan at the deadline
itself, 3.4 ms earlier, P 0.99 instead of 0.54.

**What happened, and the exit status.** `ecal run` says `deadline met` or `deadline MISSED by
X ms (Y %)` for the measured step against the deadline the plan keeps, how many measured
steps ran over, and ends with one `result:` line; it exits 1 when the deadline was missed or
an Eq. 23 test of the plan flagged, 0 otherwise (a baseline's own flags are noted, not
counted). The measurement is authoritative: here the example's assumed 2 ms switch and
122 W bubbles are wrong (the switches took 68.4 ms a step against 30.0 ms planned, the
bubbles drew less), and the step misses. With the switches measured
(`ecal/examples/transitions_sim_h200.json`, what `ecal transitions` gives on the simulator)
they cost what was planned (66.0 ms against 66.0 ms), and on seeds 0–4 the step met the
deadline twice and missed by +0.10 to +0.33 % three times: the tasks at clocks near the
power cap (1680–1830 MHz) run up to 0.8 ms slower each than characterized, depending on the
die's state when they start (the entry context), which σ_T does not cover
([workload.md](workload.md#a-deadline-kept-at-a-confidence)).

**4. Apply it in your loop.** `schedule.json` lists each rank's tasks
(`s{{stage}}/{{forward|backward}}/{{microbatch}}`) with their clocks. The hook syncs before a
switch, hands only the knobs that change to a helper thread (about 20 µs per element on the
training thread against 1.5 ms inline, `experiments/bench_applier.py`), skips calibration when
the schedule carries ready power, counts switches per iteration, and restores the GPU on
exit, error or signal ([examples/README.md](examples/README.md); try `python docs/examples/pytorch_1f1b_loop.py
--device sim`):

{ROUTE_APPLY}

**Zeus users** ([zeus.md](zeus.md)): `ecal import zeus-monitor LOG.csv` (one element per window
name and GPU), `ecal import zeus-plo profile.json`, and `ecal export zeus-pfo schedule.json -o
freqs.py` for Zeus's pipeline-frequency optimizer (SM clocks only: power limits, memory
clocks and SM splits cannot be carried, and ecal warns).

'''


def guarantees_page_md() -> str:
    """docs/guarantees.md: the guarantees and limits in full, and what to do after a kill."""
    return '''# Guarantees and limits

- **The GPU is put back.** Every setting is journalled (fsynced) before it changes and
  restored on exit, error, Ctrl-C, SIGTERM, SIGHUP, SIGQUIT; after SIGKILL or a crash the next
  run or `sudo ecal restore` restores it from the journal. One process per GPU.
- **Nothing measured is lost or mixed.** Points are appended as measured; a resume that
  differs in element, device (name, UUID), driver, seed or protocol is refused. The host is
  recorded but not checked, on purpose: the GPU's UUID identifies the card wherever it is
  plugged in, and a simulator's results do not depend on the host. A results log holds one
  measurement: a second header (two logs joined) or a point of another element is refused
  with its line number, on resume and by `ecal store import`, and the file is left as it is.
  On the simulator an interrupted and resumed sweep equals an uninterrupted one bit for bit.
- **Plans are honest** ([certificates.md](certificates.md)): every plan meets its deadline (one predicate);
  its bound is the method's own, never clamped; `optimal` only when proven; the same input
  gives the same plan under any load (work budgets; a wall-clock net says `time_capped`).
  Checked against brute force on 2,000 instances in the tests.
- **σ is the algebra's.** A signature used k times adds k²·var; a plan's and each device's σ
  count shared leaves once.
- **Limits.** Plans were run on the simulator and a strict fake of NVML. A real H200 was used
  read-only on 2026-12-04 (`ecal selftest`, `experiments/gpu_validate.py`, co-runs at four SM
  splits, a thermal probe: [selftest.md](selftest.md), [simulator.md](simulator.md)); no plan
  has yet run on it. Two findings bound what is promised there: a power-capped element runs
  faster beside low-power work than ⊗ of its signatures says (T −4.8 %, E +1.6–2.3 % on
  GEMM ⊗ copy), so a plan that sequences capped and uncapped work is conservative in time and
  optimistic in energy by a few per cent; and the simulator gets the energy sign of split co-runs
  wrong at three of four splits, so measure such pairs on the card. Real runs of multi-GPU plans go through your own
  launcher and `PlanApplier`. Energy counters resolve about 1 %: plan differences below that
  are not observable. A plan is as good as its characterization: in the demo, plan 2's
  measured step still ends 0.2–0.5 % past its deadline (co-runs run slower in the heat of
  repeated steps than characterized), so plan with that margin and check with `ecal run`.

## If a run was killed

- Before changing a GPU setting, ecal writes down what it found: one journal per GPU UUID in
  `$ECAL_STATE_DIR` (default `~/.cache/energy-calculus`), fsynced before the NVML call.
- Ctrl-C, SIGTERM, SIGHUP, SIGQUIT, an error or a normal exit restore the GPU before ecal
  exits; a second Ctrl-C waits for the restore to finish.
- After SIGKILL, an out-of-memory kill, a crash or a power loss the journal stays. The next
  run that opens the GPU (`--device nvml:N`) restores it first and says so on stderr; or run
  `sudo ecal restore` (every GPU with a journal) or `sudo ecal restore --device nvml:N`
  (`--json` for scripts). Every journalled setting is tried and reported on its own; one that
  fails stays in the journal (exit 2), and ecal refuses the GPU with a message naming
  `ecal restore` until a restore succeeds.
- The power limit is read before the first change and put back exactly. NVML cannot read back
  a clock lock, so SM and memory clock locks are reset; a lock another tool set earlier
  (`nvidia-smi -lgc`) is not re-applied.
- One process may change a GPU at a time; a second gets an error naming the holder's PID.
  `--read-only` takes no lock and changes nothing.
- By hand: `sudo nvidia-smi -i N -rgc -rmc` resets the clock locks and
  `sudo nvidia-smi -i N -pl W` sets the power limit back (W is in the journal).
- A results file resumes where the run stopped: `ecal characterize … --results r.jsonl`
  again. A torn last line is dropped and that point measured again; a file that is not an
  energy-calculus results file is refused (exit 2) and left unchanged. `r.jsonl.lock` beside
  the real file is the writer's rendezvous, removed when it finishes; a second writer through
  any name of the file (a symlink, a hard link) is refused with the holder's PID.

## Shared machines

The tool may run as root on nodes where other users write `/tmp` and shared folders, and
where disks fill up.

- **Where state lives.** Device journals and GPU locks are in `$ECAL_STATE_DIR`, else
  `~/.cache/energy-calculus`: created with mode 0700 whatever the umask, and used only while
  it is a real folder owned by the caller and not writable by group or others (otherwise one
  line says what to do: `chmod 700`, `chown`, or another `ECAL_STATE_DIR`). Nothing is
  imported or run from it.
- **What is refused, and left untouched** (one line, exit 2):
  - a symlink another user owns anywhere on an output path (`-o`, `--results`, a store), or
    a symlink into a file another user owns; your own links are followed as before;
  - a lock file, journal or journal temp file that is a symlink, not a regular file, or holds
    content that is not ours (`data.jsonl.lock` with your notes in it stays as it is);
  - a journal written by a user other than root or the caller, or with values outside the
    device's own range: `ecal restore` does not apply it;
  - a results log with two headers (logs joined with `cat`) or a point of another element;
  - a number that is not finite in any field of a point entering a store, derived ones
    included (E = s·T + d overflowing): the whole import is refused. A stored row that
    cannot be read (an older store, a damaged row) is skipped with an `ecal: warning:` line
    naming it; the other points are still read.
- **When a disk fills.** The GPU comes back first: restoring the card never waits on the
  journal, which is updated afterwards, best effort (a failure is reported with its path).
  Before the first change a journal that cannot be written refuses the change, so nothing is
  changed. Results logs keep every complete point (a record cut off by the full disk is
  removed again, or dropped on resume) and a store keeps every committed transaction; the
  error is one line naming the file (`r.jsonl: No space left on device`,
  `runs.sqlite: ... database or disk is full`). Free space, then run `ecal restore` if a
  journal was left, and rerun the same command: it resumes.
- **A damaged store** (`database disk image is malformed`) is one line naming it, exit 2, in
  `ecal store`, `ecal frontier` and `ecal campaign`: restore it from a copy.

## Tests

`.[test]` alone runs everything but the Zeus and Ray round trips, which then skip with a
reason. Tests that read `../shared/data` (real measurements) skip with a reason when it is
absent.
'''


# ---------------------------------------------------------------------------------------------
def api_page_md() -> str:
    """docs/api.md: the Python API example in full, with its output."""
    return f'''# The Python API in one page

`frontier` (the algebra; numpy/scipy), `solvers` (planning; imports `frontier`) and `measure`
(devices, protocols, execution; imports `frontier`) are independent libraries; `ecal` is the
command line over them. `docs/api_example.py`, run by `docs/make_figures.sh`:

```python
{example_code("docs/api_example.py")}
```

```text
{o("api")}
```
'''


def cli_page_md() -> str:
    """docs/cli.md: every command, its conventions and exit codes, with pasted output."""
    return f'''# The command line, command by command

Every output below is pasted from a real run by `docs/make_figures.sh` (simulated H200 and
the bundled examples).

## Commands, conventions, exit codes

| command | does |
|---|---|
| `ecal characterize WORK...` | signatures of a preset or your `module:factory` over a grid; resumable results file |
| `ecal frontier FILE` | Pareto frontier per element (`--criterion TE/Td/Tsd`: safe before ⊗, ⊕, ⊕multi) |
| `ecal compose FILE` / `ecal check FILE` | predicted T, E ± σ and Eq. 13 bias bound / Eq. 23 against measured composites; `compose SIGS.json --expr 'step={{"seq": ["a", "b"]}}'` composes any signature file (characterize or frontier output) without writing a workbook |
| `ecal check --pairs WORKLOAD` | context-insensitivity tests: which pairs must be characterized jointly |
| `ecal plan WORKLOAD --deadline 1.05x` | least-energy operating point per task with switch costs, a raw bound and gap |
| `ecal pareto WORKLOAD` | the energy-vs-deadline curve |
| `ecal run PLAN` | execute a plan, measure it: deadline met or MISSED, Eq. 23 per device and step, measured savings |
| `ecal transitions WORKLOAD` | measure what switching clocks or power limits costs, for the workload's `transitions` |
| `ecal campaign FILE` | many elements over many GPUs (local or `--ray`), into one SQLite store ([campaign.md](campaign.md)) |
| `ecal store import/export/list STORE` | that store: import signature files and results logs (keyed, idempotent, all or nothing), export them, list what it holds ([campaign.md](campaign.md)) |
| `ecal import KIND` / `ecal export zeus-pfo` | `h200`, `nv-dvfs`, `zeus-monitor`, `zeus-plo`, `perseus`, … / to Zeus |
| `ecal transitions WORKLOAD` | measure the switch costs a workload's plan will pay |
| `ecal demo` / `ecal selftest` / `ecal restore` / `ecal schema` | the closed loop on the simulator / check your GPU first / put back GPU settings / the file formats |

A WORKLOAD is a workload file, a Perseus profile CSV or a problem JSON. Each command's output
is another's input; `--json` for scripts; examples in `--help`. Exit codes: `0` ok; `1`
flagged: `check` found a composite (or `--pairs` a pair) that deviates, or `run` measured a
plan that missed its deadline or that an Eq. 23 test of the plan flagged (the run completed,
`-o` written; a baseline's own flag is a note, not the plan's); `2` bad input (one line
naming file and field; no output written or changed; an infeasible deadline, a workload
without `transitions`); `3` your own work raised (GPU restored, measured points kept); `70` a
bug in ecal (its traceback, then one line saying so: only the project's own errors and the
system's are reported as bad input); `130` interrupted (GPU restored; outputs all written or
none).

## Compose and check

`ecal/examples/attention_tp2.json` is the worked example of the calculus — a Llama-3.2-3B
attention layer with tensor parallelism on two GPUs, `RMSNorm ⊗ Linear1 ⊗ ((RoPE ⊗ Attention ⊗
Linear2) ⊕ AllReduce)` per GPU, `⊕multi` across GPUs (illustrative numbers):

```text
$ ecal compose ecal/examples/attention_tp2.json
{o("compose")}
```

`ecal/examples/h200_compositions.json` holds real H200 measurements (NVML energy counter):
elements measured alone, and four composites measured directly. `check` applies Eq. 23
(|measured − predicted| > c_α·√(σ²_pred + σ²_meas)) to T and E:

```text
$ ecal check ecal/examples/h200_compositions.json
{o("check")}
```

This is the physics, not a bug: GEMMs back to back hit the 700 W cap and throttle; between
copies they throttle less, so the sequence runs 5 % faster than predicted (energy agrees);
two streams on one GPU contend, so the parallel composites take far longer than the max of
their parts. The calculus's answer is to characterize such pairs jointly (`--bias-aware`
accepts the Eq. 13 bias bound as tolerance).

## Characterize and frontier

```text
$ ecal characterize gemm_bf16_8192 -o gemm.json --plot gemm_characterize.png
{o("characterize")}
$ ecal frontier gemm.json --plot gemm_frontier.png
```

![GEMM frontier on the simulated H200](gemm_frontier.png)

The default grid is `sm_clock_mhz=1980:990:-90,power_limit_w=700,500`; each measured point is
appended (flush + fsync) to `--results FILE` as it is taken and a rerun resumes. On a real
GPU: `ecal characterize mymodule:step --device nvml:0` (clock locks and power limits need
root; `--read-only` sweeps only SM allocations and never changes a device setting). Every
output of the simulated device says SIMULATED.

## Plan and pareto

`ecal/examples/pipeline_4x8.csv` is a Perseus-format profile (`stage,instruction,frequency,
time,energy`; 60 SM clocks, imbalanced stages, made by Perseus's profile generator);
`--idle-power-w` (older name `--p2p-power-w`) is the power of a GPU blocked on communication (default 75 W).

```text
$ ecal plan ecal/examples/pipeline_4x8.csv --deadline 1.05x --transition-time-s 0.001 -o plan.json --plot plan.png --schedule schedule.json
{o("plan")}
$ ecal pareto ecal/examples/pipeline_4x8.csv --plot pareto.png -o pareto.json
{o("pareto")}
```

Every point the curve reports is a plan you can get back and apply. The grid points are whole
plans in the curve file (`plans[]`); the points interpolated between them keep their choice, an
option index per task (`dense[].choice`). `--plan-at D` writes the plan of the least-energy
point that meets D (the energy the curve reports at D); with `--curve FILE` it reads a curve
written by `-o` instead of computing it again. The plan's `deadline_s` is its point's own (at
most D). `--schedule`, `ecal run` and `ecal export` take it like `ecal plan`'s. In Python:
`curve = pareto(problem); plan = curve.plan_at("1.07x")`.

```text
$ ecal pareto ecal/examples/pipeline_4x8.csv --curve pareto.json --plan-at 1.07x -o plan_at.json
{o("plan_at")}
```

A 1 ms clock switch here is priced at the stage's blocking power; the plan holds a clock where
switching does not pay. Every search is budgeted by work, never by seconds, so the same input
gives the same plan on any machine and under any load; `--time-limit-s` is only a wall-clock
safety net, and a plan it cut short says `time_capped` (docs/certificates.md). Every tuning
knob is one frozen `solvers.SolveOptions` ([solver.md](solver.md)); a second search with other
DP caps in a worker process (`SolveOptions.portfolio`) is off by default: it saved 0.0004 % on
16×64 (`experiments/results/solver_ablation.md`).

![Plan timeline](plan.png)
![Energy vs deadline](pareto.png)

`schedule.json` is what a training loop reads: per GPU, each task's start and its
`sm_clock_mhz`/`power_limit_w`/`sm_count`, in execution order (format in `measure/schedule.py`).
`measure.PlanApplier` applies such a plan around each element's execution on a real or
simulated device, counts the switches it makes and restores the device afterwards.

## Plan a workload file

```text
$ ecal plan ecal/examples/workload_1f1b.json --deadline 1.05x -o plan.json --schedule schedule.json
{o("route_plan")}
```
'''


# ---------------------------------------------------------------------------------------------
def studies_page_md() -> str:
    """docs/studies.md: how it works, the studies, and the solver's history (research notes)."""
    return f'''# How it works, the studies, and the solver's history

Research notes moved out of the README: the decisions behind the calculus, the simulator,
the studies in `experiments/`, and how the fast method's gap was brought down (its numbers
are from the runs recorded in `experiments/results/`; since then every search is budgeted by
work: docs/certificates.md).

## How it works, and the decisions that matter

- **Signatures** `Signature(s_w, time_s, d_j, var_time_s2, var_energy_j2, n, devices, omega,
  kappa, theta, meta)`: E = s·T + d, s the *ready* power at ω_dev (a GPU with a context alive:
  ~123 W on the H200, not the 79 W deep idle). Variances are those of the *estimate* (standard
  error²); σ²_d = σ²_E − s²σ²_T (clamped and flagged if noise makes it negative).
- **Uncertainty is delta-method over distinct measurements.** Every composite carries, per
  measured leaf, the sensitivity of its T and E to that leaf's T and d. A signature used k
  times adds k²·var, not k·var: its estimation error is shared. Counting the 245 GEMMs of an
  H200 composite as independent would shrink σ by √245 ≈ 15.7× and make Eq. 23 flag correct
  predictions.
- **Operators**: ⊗ sums; ⊕ pays static power once over the makespan (E = s·max T + Σd, shared
  ω_dev, SM allocations must fit); ⊕multi sums static power of disjoint devices over the common
  makespan (the GPU that finishes first idles). `dag()` generalizes all three: static power
  per device over the makespan (idle included), dynamic energy per task, switch costs.
  Max of times: dominant branch, or Clark's moments (`max_method="clark"`).
- **Pruning is operator-aware.** (T, E) dominance is only safe before ⊗. Before ⊕ a branch off
  the critical path pays only d, so frontiers keep points undominated in (T, d) per ω_dev (and
  SM count); before ⊕multi in (T, s, d). `pareto_frontier(sigs, criterion="TE"|"Td"|"Tsd")`.
- **Transitions are elements.** Switching ω_dev costs (τ, ε) from a `TransitionTable` or a
  rule; zero when unchanged; solvers may decide not to switch.
- **Exactness is reported, not assumed.** Every plan states its method (exact chain DP,
  exact series-parallel DP, MILP via PuLP with CBC or HiGHS, or the fast hull-LP/Lagrangian
  method for large DAGs), its proven lower bound and gap, and its status (`optimal` only when
  proven; a MILP stopped by its time limit says `time_limit`). Brute force checks every
  method on small instances in the tests.
- **Devices are restored, nothing measured is lost or mixed.** Clock/limit changes are
  validated before anything changes, journalled before each NVML call, and restored on exit,
  exception, SIGINT, SIGTERM, SIGHUP, SIGQUIT and at interpreter exit; after a kill the
  journal restores them (below). A missing permission names the NVML call and what to do.
  Sweeps append each point as measured (fsynced); a results file records the GPU's name,
  UUID and driver, the host, the seed and the protocol, and a resume that differs in any of
  them is refused. One process per GPU and one writer per results file. On the simulator a
  point's noise depends only on its key and the seed, so an interrupted and resumed sweep
  equals an uninterrupted one bit for bit.

## Measuring real GPUs

The NVML energy counter advances about every 100 ms, so naive windows are noisy. The protocol
starts each window on a counter tick and, at the end, waits for the next tick and subtracts
the ready power × the wait (`experiments/protocol_precision.py`, simulated counter calibrated
to the H200): a 0.6 s tick-aligned window has 0.4–0.9 % energy spread versus 4.5–4.8 % for a
naive 0.6 s window, and reaches 1 % relative standard error in 2.5 GPU-seconds per point
versus 30.3 for 5 s windows with 5 s cooldown (12×).

`experiments/gpu_validate.py` is one script for a machine with a GPU that never changes device
settings (under 4 minutes): bf16 GEMM, a large copy, SDPA backends (κ), GEMM at several SM
allocations through green contexts, sequential/parallel composites checked with Eq. 23, and
the closed loop (a step predicted from elements alone and measured, the flagged pair measured
jointly, the step predicted again and measured again). It has not yet been run on a real GPU
in this repository (no GPU was available); its `--device sim` path is tested (there, round 1
is flagged at +13.7 % T and round 2 lies within σ).

### If a run was killed

What ecal does before, during and after a kill, and how to restore a GPU by hand:
[guarantees.md](guarantees.md#if-a-run-was-killed).

The simulated H200 (`measure.SimulatedGPU`) is a physics model — roofline time, static power
rising with clock, voltage and temperature, dynamic power ∝ C·V²·f × activity, the power cap
enforced by lowering the clock, a thermal RC state, a 100 ms counter with noise — calibrated
so its default operating point reproduces the measured H200 elements within their spread.
Its co-run model (streams without green contexts take turns, one board clock fits the shared
cap, HBM bandwidth is shared, fitted L2 and memory-pressure terms that also slow disjoint
green-context partitions) reproduces the two real H200 parallel composites it was fitted or checked on: GEMM ∥ copy +91 % T / +10 % E against +94 % / +11 % measured, GEMM ∥
axpy +74 % T against +74 %; where it still disagrees (GEMM ⊗ copy: the real cap averages
power across kernels) is listed below and in `docs/simulator.md`
(`python experiments/sim_corun_calibration.py`):

{corun_table()}

## Studies (`experiments/`)

Each is one command and writes its table (`.md`, `.json`) and figure to `experiments/results/`.

| command | shows | data |
|---|---|---|
| `python experiments/study_attention_tp.py` | the worked example: Llama-3.2-3B attention layer, TP=2, frontier over SM clock × compute/AllReduce SM split; a 1.1× deadline picks 1710 MHz with 124+8 SMs (12 % less than the fastest point); 129+3 starves the link, 116+16 costs 4 % more | simulated H200 |
| `python experiments/study_power_limits.py` | Zeus NSDI'23 traces → per-workload power-cap frontiers → the cap under a deadline; median 9.3 % (1.05×) and 14.3 % (1.10×) less energy than the max cap over 218 configurations | `../shared/data/zeus` |
| `python experiments/study_kernel_clocks.py` | NV-DVFS kernels → clock frontiers → a 10-kernel chain planned exactly: 12.3 % (V100) / 18.4 % (RTX 8000) saved at 1.05×; 10 ms switches cut 7–8 switches to 2 | `../shared/data/nv-dvfs` |
| `python experiments/study_cross_hardware.py` | the same chain on V100 and RTX 8000 from each card's own signatures, algebra unchanged; memory-bound kernels go lower on the RTX 8000 | `../shared/data/nv-dvfs` |
| `python experiments/h200_composition.py` | real H200 composites vs predictions (table below) | `../shared/data/h200` |
| `python experiments/protocol_precision.py` | naive vs tick-aligned windows (above) | simulated H200 |
| `python experiments/bench_solvers.py` | our solvers vs lowtime 0.3.0 on Perseus-format profiles (table below) | shared profile generator |
| `python experiments/switch_gap_study.py` | with 1 ms switches: our plan and bound vs HiGHS's MILP and the exact model's LP relaxation on 64–512-task pipelines (table below), proven optima on smaller ones, and with `--radius` HiGHS's search next to our plan | shared profile generator |
| `python experiments/steady_state_rounding.py` | with 1 ms switches: what holding discrete clocks in the LP's own steady-state cycles costs over the LP (0.2–0.5 % of the bound on 8×32 and 16×64) | shared profile generator |
| `python experiments/steady_state_holds.py` | with 1 ms switches: our plan against plans that hold one clock per stage (or two, with one switch) through the 1F1B steady state: {holds_verdict} | shared profile generator |
| `python experiments/bench_switch_lp.py` | constant switch costs with one column per clock instead of the transport matrix: the MILP proves 2×4 (60 clocks) optimal in 15 s instead of no proof in 120 s; the exact LP bound on 4×8–16×64 (`--large`), where our 16×64 plan is 0.49 % above it | shared profile generator |
| `python experiments/search_spread.py` | with 1 ms switches: how far one search's plan moves with its kick seed and label caps, and what the two-search portfolio proves per seed (8×32, 16×64; seeds 0–3) | shared profile generator |

Real H200, composed predictions vs direct measurements (σ = standard error of the mean):

```text
$ python experiments/h200_composition.py
{Path("docs/out/h200.txt").read_text().rstrip()}
```

Solvers vs lowtime (Perseus's solver) in one process, same profiles, same accounting
(lowtime's plan at each deadline evaluated on the measured options it assigns; 2-core machine,
`python experiments/bench_solvers.py --lowtime-8x32` with `.[bench]`):

{bench_table}

With `.[highs]` (warm LP re-solves) the same run gives {highs_note}
(`experiments/results/bench_solvers_highs.md`).

Targets and where we stand: the 8×32 whole frontier runs ≥ 20× faster than lowtime with every
grid point within 0.5 % of its bound; chains of 2,000 tasks × 60 options with switches solve
exactly in seconds (10,000 tasks in about 30 s, `experiments/bench_scaling.py`); 16×64 (2,048
tasks) with switch costs plans in about 30 s and 32×128 (8,192 tasks) in under 30 s at a gap
under 1 % (`results/bench_scaling.md`), with a proven gap on 16×64 of {gaps_16x64} against a 0.5 % target (`max_gap_pct`; below: why, and how it moves
with the search's seed); `ours_worse_at` counts lowtime deadlines where its plan beats ours.

Why switch costs leave a gap near 0.5 %: `experiments/switch_gap_study.py` solves smaller
pipelines of the same kind (20 clocks, 1 ms switches) with HiGHS's MILP and with the LP
relaxation of the exact model (the best bound an LP or Lagrangian method can give):

{gap_note}

On every case the best plan found — ours, or HiGHS's after 60 s — is {study_best} above that
LP, and HiGHS's branch and bound lifts the bound by at most {study_lift}. Our bound equals the LP
on the two smaller cases (the fast method solves that LP itself there, see below) and is
0.001–0.005 % below it on the 512-task ones (the ascent below). Pipelines small enough for
HiGHS to finish (`--cases 2x4,4x4,3x6 --deadlines 1.05x,1.2x --milp-s 240`,
`results/switch_gap_optimum.md`) split the gap in two. The optimum itself lies {optimum_lp} above the LP, so no LP-class bound proves less there. Our plan lies
{optimum_ours} above HiGHS's best. With all 60 clocks, HiGHS on the ±4-clock neighbourhood of
our 4×8 plan (`--cases 4x8 --clock-step 1 --radius 4 --deadlines 1.05x,1.2x`,
`results/switch_gap_neighbourhood.md`, 150 s) finds {nb_note}. On 16×64 that MILP, even at ±1
clock, ends 120 s with a plan {nb_16x64:.2f} % dearer than ours (`--cases 16x64 --clock-step 1 --radius 1 --milp-s 120`).

`experiments/steady_state_rounding.py` shows where the rest of the gap comes from: the LP fits
every stage to the pipeline's common period (127.4 ms on 16×64 at 1.05x) with fractional
clocks, while a plan must hold one of 60 discrete clocks per cycle (switching between forward
and backward would cost two latencies a cycle). Rounding the LP's own steady state that way
already costs 0.34 % of the bound at 1.05x and 0.50 % at 1.2x (16×64; 8×32: 0.22 % and
0.43 %), before any ramp. That is measured against the LP without switches; the LP with
switches below already sees 0.24 points of it on 16×64 at 1.05x. Every stage loses part of a
clock step, whatever the common period, and a stage cannot mix two clocks across cycles
either: each change costs a 1 ms latency on the critical path, more than the step gains.

The fast method therefore works on the held steady state as a whole (`solvers/hold.py`).
After half of its search budget it takes the best plan and
1. builds its *hold start*: the plan's ramps kept, and in a common window of the schedule
   every device with switch costs holds one clock (or a slower one and then a faster one) at
   the slowest common busy-time ratio the ramps allow;
2. *re-plans* around a hold: every device held at one level through 20–80 % of the makespan,
   possibly slower than the ramps allow, and everything else planned again as a problem of
   its own (hull LP, starts, search with a quarter of the budget), the ramps then running
   faster to pay for it. The level is the one whose held problem has the lowest hull LP among
   up to 24 candidates up to 2 % slower (warm re-solves, 0.03–0.1 s each on 16×64); the pick
   ran 0.7–1.6 % slower than the slowest level that fits the plan's ramps. On 16×64 at 1.05x
   the plan's steady state then runs at periods of 127.44–127.56 ms instead of the LP's
   127.36 ms: several stages have a clock just above the LP's period;
3. spends the last quarter searching from the re-plan, the hold start and the plan;
4. re-plans the best plan path by path once more with wider DP caps, on a quarter more work,
   and then again with still wider caps on 0.85 times the work (below).

At the same work, and against the bound before the ascent below, the re-plan lowers the
proven gap on 16×64 from 0.706 % / 0.714 % to 0.565 % / 0.568 % (1.05x / 1.2x) and on 8×32
from 0.566 % / 0.571 % to 0.410 % / 0.526 % (20 clocks, `switch_gap_study`: 0.807 % →
0.684 %; 0.620 % with the ascent's bound). Where the held problem's LP is no cheaper than the
plan (the bundled 4×8), nothing is re-planned and the budget goes to the
search as before. A pipeline-specific check (`experiments/steady_state_holds.py`,
`results/steady_state_holds.md`: one or two held clocks per stage over the 1F1B cycles, every
common period within ±3 %, the plan's ramps kept) on 8×32 and 16×64 at 1.05x and 1.2x:
{holds_verdict}; {holds_detail}.

With constant switch costs the exact model's LP needs only one column per clock for each
device pair (z_ω ≥ X_u,ω − X_w,ω, solver-notes §4) instead of the 60×60 transport matrix, and
has the same value. Solved on 16×64 at 1.05x (`experiments/bench_switch_lp.py --large`,
`results/bench_switch_lp.md`; 247 k columns, 1–2 minutes), it is 49,690.9 J. The fast
method's bound now comes within 1.0 J of it in about 5 s (1.2x: 0.7 J): it starts from the
duals of a cheap surrogate LP and climbs the Lagrangian by supergradient steps that keep the
duals a flow (`solvers/ascent.py`: each step projects the plan-to-be's path lengths onto the
flow-conserving directions with one sparse Laplacian solve, and takes a Polyak step; 150
steps of 0.03 s). Plain supergradient steps, which leave the flow, had gained nothing: the
slack terms charge every conservation error at the deadline. That took the proven gap from
0.565 % / 0.568 % to 0.510 % / 0.520 %, and on 8×32 from 0.410 % / 0.526 % to 0.361 % / 0.478 %.

That left the plan, then 0.508 % / 0.518 % above that LP: no LP or Lagrangian bound could
prove 0.5 % for it, and the target needed a plan 4–8 J (0.01–0.02 %) cheaper. The search now
ends by re-planning its best plan path by path once more with wider DP label caps (64 per
option and 256 in all instead of 16 and 64; the first of `SolveOptions.search.final_stages`, `solvers/options.py`), on a quarter
more work (about 1.6 s on 16×64). Once the kicks have stalled, that closer-to-exact polish
took 1.4–7.8 J (median 4.4 J) off each of 18 searched plans, where the same work again on the
search itself took 1–3 J. That reached 0.497 % / 0.506 %: 0.5 % at 1.05x, not yet at 1.2x.

Where one search lands is partly luck (`experiments/search_spread.py`,
`results/search_spread.md`, kick seeds 0–3): {spread}. A search with other DP caps (24/96)
ends in other local optima, not better ones on average, but *other* ones: the better of the
two is much steadier than either. So on 500 tasks or more the fast method runs both: 16/64
in this process after the bound, and 24/96 meanwhile in a worker process (`SolveOptions.portfolio`,
`solvers/portfolio.py`, `solvers/workers.py`; since `experiments/solver_ablation.py` measured it at
0.0004 % it is off by default), which computes no bound and so gets 1.3 times the
work (the bound's 5.5 s on 16×64 when it was chosen; 3.5 s now); the cheaper plan wins. Each search stops on its own
work budget, so the plan is the same whether they run side by side or, on one core, one
after the other in twice the time. A fresh interpreter is the worker, not
`multiprocessing`: a forked child of a process whose HiGHS has started threads can deadlock,
and a spawned one imports the caller's `__main__` again. Anything that goes wrong in the
worker makes this process run that search itself.

Then two speed-ups paid for a last step. The DP that re-plans a path now keeps each option's
labels in a row of its own and sorts rows instead of every label at once, and the
Lagrangian's per-device Viterbi steps all devices together when every switch costs one
constant (`solvers/lagrangian.py`, `viterbi_lockstep`: the cheapest way into a clock is staying
on it or the cheapest switch from another, O(options) instead of O(options²)). Both keep the
same labels and the same arithmetic, so plans and bounds are bit for bit what they were: the
DP runs 1.9× faster on 16×64 windows and the bound takes 3.5 s instead of 5.8 s. The time
saved goes to a second final polish with caps of 128 per option and 512 in all, on 0.85 times
the search's work (`SolveOptions.search.final_stages`; about 4 s on 16×64). It starts from the first polish's
plan and keeps it unless it finds a cheaper one, so no plan gets dearer: on the benchmark's
16×64 plans it took 2.4 J (1.05x) and 1.5 J (1.2x) off, and 1.5–9.2 J off each of the 40
searches below (two per seed, four seeds, five deadlines).

Over kick seeds 0–3 on 16×64 at 1.05x, 1.1x, 1.15x, 1.2x and 1.3x (the last three:
`search_spread.py --cases 16x64 --deadlines 1.1x,1.15x,1.3x`,
`results/search_spread_more_deadlines.md`), one 16/64 search with both final polishes
proves ≤ 0.5 % in {single_all} runs (with the first polish only: 9 of 20). With the first
polish only, the pair with 24/96 at equal work did in 13 of 20, and at 1.3 times the work in
19 of 20 (the miss: 0.501 %); with both it does in {port_all}, at most {port_max}: the
closest run is {port_margin} J under the 0.5 % line. Per deadline: {portfolio};
{more_deadlines}. With the shipped seed the benchmark's plans prove {gaps_16x64} in
{walls_16x64} on this 2-core machine (23.3 s / 23.8 s with one final polish and the slower DP
and bound). The margins are a few joules (0.007–0.03 points): the target holds on these
pipelines and deadlines with every seed tried, which is evidence for them, not for every
pipeline.
{holds_note_text}
At the LP's prices the plan's excess splits about evenly (`clock_regret_j` and
`priced_slack_j` in `results/bench_switch_lp.md`; {regret_note}): what its clock sequences
cost above each device's cheapest, and priced slack, flow on paths it leaves shorter than
the makespan. Both
come from the LP's freedom to mix clocks: a task may take a fixed mix of two clocks, and
when its neighbour on the device takes the same mix the LP pays no switch at all, while a
ramp can shift a little of the mix per task and pay that fraction of a switch. A plan picks
one clock per task, and each change is a whole switch.

The fast method uses this LP for its bound where it has at most 20,000 columns (on the 4×8
example above at 1.05x it takes 0.095 points off the proven gap; with switches of 5 J and no
latency, 0.51 points), and the MILP uses the same rows (2×4 with 60 clocks: proven optimal in 15 s, where
the transport matrix proves nothing in 120 s).
'''


# ---------------------------------------------------------------------------------------------
PAGES = {"README.md": readme_md, "docs/cli.md": cli_page_md, "docs/studies.md": studies_page_md,
         "docs/demo.md": demo_page_md, "docs/api.md": api_page_md, "docs/loop.md": loop_page_md,
         "docs/guarantees.md": guarantees_page_md}


def main() -> None:
    """Write every page; refuse a README longer than README_MAX_LINES."""
    texts = {path: build() for path, build in PAGES.items()}
    n = texts["README.md"].count("\n")
    if n > README_MAX_LINES:
        raise SystemExit(f"README.md would be {n} lines (at most {README_MAX_LINES}): shorten it")
    for path, text in texts.items():
        Path(path).write_text(text)
    print(f"wrote {', '.join(texts)} (README.md: {n} lines)")


if __name__ == "__main__":
    main()
