"""Do tuned plans keep their deadline when they run? ``ecal tune`` on workloads that differ from
the bundled one, each tuned plan then run on seeds it was not tuned on (issue 29).

Workloads: the bundled simulated 1F1B example (``ecal/examples/workload_1f1b.json``) and
variants of it written to a temporary folder: fewer microbatches, two stages, GPipe,
interleaved 1F1B (2 chunks), steady state off, switches measured on the simulator
(``transitions_sim_h200.json``) instead of the assumed 2 ms. For each: ``execution.tune.tune``
at 1.05x, confidence 0.95, seed 0; then the round-1 plan (the model alone) and the tuned plan
are each run on seeds 1..``--seeds`` (``execution.run.run_plan``, no baselines). Reported:
rounds, converged, and per plan the runs that met the deadline, the worst measured overrun
and the mean measured energy.

    python experiments/tune_deadlines.py            # 4 held-out seeds, ~15 min on 2 cores

Writes experiments/results/tune_deadlines.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from _common import rows_table  # noqa: E402

from execution.run import run_plan  # noqa: E402
from execution.runnable import WorkloadRef, open_run_devices, workload_work_table  # noqa: E402
from execution.tune import tune  # noqa: E402
from frontier.files import write_json_atomic, write_text_atomic  # noqa: E402
from measure.protocol import Protocol  # noqa: E402
from solvers.confidence import solve_at_confidence  # noqa: E402

EXAMPLES = ROOT / "ecal" / "examples"


def variants(tmp: Path) -> dict[str, Path]:
    """name -> workload file: the bundled example and its variants (elements by absolute path)."""
    base = json.loads((EXAMPLES / "workload_1f1b.json").read_text())
    for el in base["elements"].values():
        el["source"] = str(EXAMPLES / el["source"])
    shape = base["shape"]
    out = {"1f1b 4x8 (bundled)": EXAMPLES / "workload_1f1b.json"}
    changes = {
        "1f1b 4x4": {"shape": {**shape, "microbatches": 4}},
        "1f1b 2x8": {"shape": {**shape, "stages": 2}},
        "gpipe 4x8": {"shape": {**shape, "kind": "gpipe"}},
        "interleaved 4x8 v=2": {"shape": {**shape, "kind": "interleaved-1f1b", "chunks": 2}},
        "1f1b 4x8 steady state off": {"steady_state": False},
        "1f1b 4x8 measured switches": {"transitions": {"file": str(EXAMPLES / "transitions_sim_h200.json")}},
    }
    for name, ch in changes.items():
        path = tmp / (name.replace(" ", "_").replace("(", "").replace(")", "").replace("=", "") + ".json")
        path.write_text(json.dumps({**base, **ch, "name": name.replace(" ", "-")}))
        out[name] = path
    return out


def held_out(path: Path, plan, seeds: list[int]) -> dict[str, float]:
    """Run ``plan`` on each seed: runs that met the deadline, worst overrun, mean energy."""
    wl = WorkloadRef.of(path).load(path)
    over, energies, met = [], [], 0
    for seed in seeds:
        gpus = open_run_devices(list(wl.problem.index.devices), "sim", seed)
        try:
            table = workload_work_table(wl, gpus, str(path))
            res = run_plan(plan, wl.problem, table, seed=seed, protocol=Protocol(target_rse=0.01), devices=gpus)
        finally:
            for g in gpus.values():
                g.close()
        met += bool(res.deadline_met)
        over.append(100 * (res.step.measured_time_s / res.deadline_s - 1))
        energies.append(res.step.measured_energy_j)
    return {"met": met, "runs": len(seeds), "worst_overrun_pct": max(over),
            "mean_energy_j": statistics.fmean(energies)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=4, help="held-out seeds 1..N")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "tune_deadlines"))
    ap.add_argument("--only", action="append", default=None, metavar="NAME",
                    help="run only this workload (repeatable); the other rows are kept from --out's JSON")
    a = ap.parse_args()
    seeds = list(range(1, a.seeds + 1))
    out = Path(a.out)
    tmp = Path(tempfile.mkdtemp(prefix="tune_deadlines_"))
    kept = {}
    if a.only and out.with_suffix(".json").exists():
        kept = {r["workload"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, path in variants(tmp).items():
        if a.only and name not in a.only:
            if name in kept:
                rows.append(kept[name])
            continue
        r = tune(path, "1.05x", seed=0)
        wl = WorkloadRef.of(path).load(path)
        first = solve_at_confidence(wl.problem, r.deadline_s, 0.95)
        model, tuned = held_out(path, first, seeds), held_out(path, r.plan, seeds)
        rows.append({"workload": name, "tasks": wl.problem.n_tasks, "deadline_ms": 1e3 * r.deadline_s,
                     "rounds": len(r.rounds), "converged": r.converged,
                     "model_met": f"{model['met']}/{model['runs']}",
                     "model_worst_pct": model["worst_overrun_pct"],
                     "tuned_met": f"{tuned['met']}/{tuned['runs']}",
                     "tuned_worst_pct": tuned["worst_overrun_pct"],
                     "energy_cost_pct": 100 * (tuned["mean_energy_j"] / model["mean_energy_j"] - 1)})
        print(rows[-1], flush=True)
        write_json_atomic(out.with_suffix(".json"), {"rows": rows, "seeds": seeds})   # a row at a time
    cols = list(rows[0])
    lines = ["# tune_deadlines", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             "`model_*`: the plan from the model alone (round 1); `tuned_*`: the plan `ecal tune` "
             "returned; `*_worst_pct`: the largest measured step over the deadline (negative: "
             "every run early); `energy_cost_pct`: the tuned plan's mean measured energy against "
             "the model-alone plan's.", ""]
    write_text_atomic(out.with_suffix(".md"), "\n".join(lines) + "\n" + rows_table(rows, cols, 3))
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
