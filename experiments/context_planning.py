"""Planning with the thermal entry context on the simulator (issue 29): does composing each plan
with its entry context (``ecal plan --contexts``) bring the prediction closer to what runs?

For each workload (the bundled 1F1B example and variants of it): ``execution.contexts``
characterizes every element@ω option at the cold entry and pre-heated to ``--warm-c`` on the
simulated H200 and fits its thermal model; then the workload is planned at 1.05x and
confidence 0.95 at the null context and in context (periodic entry), and both plans run on
seeds 0..N−1 (fresh simulated GPUs per run); the null-context plan's runs are also held
against its own prediction in context (same choices, same runs: what the context model alone
changes in the prediction). Reported per plan: the predicted makespan and
energy, the measured means, the prediction's error (measured − predicted, % of predicted,
mean over seeds ± its standard error), and the runs that met the deadline. The in-context
row also says how many tasks were composed with their entry temperature.

Usage: python experiments/context_planning.py [--seeds 10] [--warm-c 60] [--repeats 8] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from tune_deadlines import PROTO, rows_table, variants  # noqa: E402

from execution.context_plan import MIN_Z, plan_context  # noqa: E402
from execution.contexts import characterize_contexts  # noqa: E402
from execution.reorder import contexts_document  # noqa: E402
from execution.run import run_plan  # noqa: E402
from execution.runnable import WorkloadRef, open_run_devices, workload_work_table  # noqa: E402
from execution.workload import load_workload  # noqa: E402
from frontier.files import write_json_atomic, write_text_atomic  # noqa: E402
from solvers.confidence import solve_at_confidence  # noqa: E402
from solvers.context import with_context  # noqa: E402

CONFIDENCE = 0.95
NAMES = ("1f1b 4x8 (bundled)", "1f1b 4x8 measured switches", "gpipe 4x8")
COLS = ["workload", "plan", "in_context_tasks", "pred_ms", "meas_ms", "err_time_pct", "sd_err_time_pct",
        "err_energy_pct", "sd_err_energy_pct", "met", "planned_entry_c", "run_task_c"]


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0)


def runner(file: Path, warmup_steps: int) -> Any:
    """Run a plan of the workload on fresh simulated GPUs after ``warmup_steps`` unmeasured
    steps (``ecal run``'s default is one; a long job runs at its thermal steady state)."""
    wl = WorkloadRef.of(file).load(file)

    def run(plan: Any, seed: int) -> Any:
        gpus = open_run_devices(list(wl.problem.index.devices), "sim", seed)
        try:
            table = workload_work_table(wl, gpus, str(file))
            return run_plan(plan, wl.problem, table, seed=seed, protocol=PROTO, devices=gpus,
                            warmup_steps=warmup_steps)
        finally:
            for g in gpus.values():
                g.close()

    return run


def rows_for(name: str, file: Path, seeds: int, warm_c: float, tmp: Path, repeats: int,
             min_z: float = MIN_Z, warmup_steps: int = 1) -> list[dict[str, Any]]:
    """The two rows (null context, in context) of one workload."""
    t0 = time.perf_counter()
    chars = characterize_contexts(file, device="sim", seed=0, warm_c=(warm_c,), repeats=repeats)
    ctx_file = tmp / (file.stem + ".contexts.json")
    ctx_file.write_text(json.dumps(contexts_document(chars, "sim", True)))
    char_s = time.perf_counter() - t0
    wl = load_workload(file)
    problem = wl.problem
    run = runner(file, warmup_steps)
    ctx = plan_context(wl, ctx_file, min_z=min_z)
    null = solve_at_confidence(problem, "1.05x", CONFIDENCE)
    plans = {"null context": null,
             "null plan, predicted in context": with_context(null, problem, ctx),
             "in context": solve_at_confidence(problem, "1.05x", CONFIDENCE, context=ctx)}
    out = []
    null_runs: list[Any] = []
    for label, plan in plans.items():
        # the same choices run the same on the same seeds: the null plan's runs are measured
        # once and held against both of its predictions
        runs = null_runs if label.startswith("null plan") else [run(plan, s) for s in range(seeds)]
        null_runs = null_runs or runs
        D = plan.target_deadline_s
        pred_t, _ = plan.in_context_makespan_s
        pred_e = plan.context["energy_j"] if plan.context else plan.energy_j
        pt = [100 * (r.step.measured_time_s / pred_t - 1) for r in runs]
        pe = [100 * (r.step.measured_energy_j / pred_e - 1) for r in runs]
        (et, set_), (ee, see) = _mean_sd(pt), _mean_sd(pe)
        rec = plan.context
        planned = [v["entry_temp_c"] for v in (rec or {}).get("tasks", {}).values() if v]
        ran = [t for r in runs for t in r.meta["task_temperature_c"].values()]
        out.append({"workload": name, "plan": label,
                    "planned_entry_c": statistics.fmean(planned) if planned else float("nan"),
                    "run_task_c": statistics.fmean(ran) if ran else float("nan"),
                    "in_context_tasks": f"{rec['in_context']}/{problem.n_tasks}" if rec else "-",
                    "pred_ms": 1e3 * pred_t,
                    "meas_ms": 1e3 * statistics.fmean(r.step.measured_time_s for r in runs),
                    "err_time_pct": et, "sd_err_time_pct": set_, "err_energy_pct": ee,
                    "sd_err_energy_pct": see,
                    "met": f"{sum(r.step.measured_time_s <= D * (1 + 1e-9) for r in runs)}/{len(runs)}",
                    "pred_j": pred_e,
                    "meas_j": statistics.fmean(r.step.measured_energy_j for r in runs),
                    "deadline_ms": 1e3 * D, "characterize_s": char_s,
                    "thermal": {d: vars(c.mechanism) for d, c in chars.items()}})
        print({k: out[-1][k] for k in COLS}, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--warm-c", type=float, default=60.0)
    ap.add_argument("--repeats", type=int, default=8, help="entry runs per option and temperature")
    ap.add_argument("--warmup-steps", type=int, default=1,
                    help="unmeasured steps before each run's measured ones (ecal run: 1)")
    ap.add_argument("--min-z", type=float, default=MIN_Z,
                    help="compose in context only the options whose change passes this z (0: all)")
    ap.add_argument("--only", action="append", default=None, metavar="NAME")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "context_planning"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="context_planning_"))
    files = variants(tmp)
    rows: list[dict[str, Any]] = []
    for name in a.only or NAMES:
        rows += rows_for(name, Path(files[name]), a.seeds, a.warm_c, tmp, a.repeats, a.min_z,
                         a.warmup_steps)
        out = Path(a.out)
        write_json_atomic(out.with_suffix(".json"), {"rows": rows, "seeds": a.seeds, "warm_c": a.warm_c,
                                                     "confidence": CONFIDENCE, "deadline": "1.05x"})
        head = ["# context_planning", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
                "`err_*_pct`: measured − predicted, % of predicted, mean over the seeds ± `sd_*` its "
                "standard error; `met`: runs whose measured step met the deadline; "
                "`in_context_tasks`: tasks composed with their entry temperature; `planned_entry_c`: their "
                "mean entry temperature in the plan (periodic entry: a long job's steady state); "
                "`run_task_c`: the mean die temperature the runs read at every task.", ""]
        write_text_atomic(out.with_suffix(".md"), "\n".join(head) + "\n" + rows_table(rows, COLS, 4))
    print(rows_table(rows, COLS, 4))


if __name__ == "__main__":
    main()
