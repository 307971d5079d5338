"""Reordering as an energy lever, on the simulated H200 (issue 29).

Two cases, each through the command line a user has (``ecal characterize``, ``ecal reorder``,
``ecal plan``, ``ecal run``), in a scratch folder:

1. **Nine independent jobs on one GPU**, marked ``reorderable``: three memory-bound jobs at
   full power (``M``, 6 s, ~606 W, uncapped), three compute jobs under a 200 W power cap
   (``S``, ~4 s; the cap turns leakage into a lower clock, so they slow down on a hot die), and
   three light jobs (``C``, 6 s, ~108 W at 1005 MHz). Given order: each capped job right
   after a memory job (``m1 s1 m2 s2 m3 s3 c1 c2 c3``). ``ecal reorder`` characterizes the
   three elements at two entry temperatures, fits the thermal model and searches the 1680
   distinct orders at the periodic fixed point (steps back to back, as ``ecal run`` runs
   them). Both orders are then planned and run with ``ecal run`` on seeds 0–4 (20 steps
   each): predicted against measured step energy and time, and their differences.
2. **A refusal.** Two jobs ``m c`` with ``ecal reorder --entry cold`` (a single pass from the
   cooled device): ``c m`` costs less *inside the pass* but leaves the die hotter, and what
   follows a single pass is not known, so the tool refuses it. Both orders run back to back
   with ``ecal run`` show where that saving goes: the next step pays it.

Physics that decides the outcome (the simulator's model: leakage linear in temperature, a
first-order RC die): over a periodic step, ∫Θ dt = Θ_amb·T + R·E, so for elements whose time
does not depend on temperature, the total leakage, and so the step energy, is the same in
every order. Order can only matter through elements whose *time* depends on the die
temperature: power-capped ones. Their energy rises with temperature, but the heat they absorb
is heat their uncapped neighbours do not leak, so the net effect is the difference of the two
slopes.

    python experiments/reorder_example.py          # writes experiments/results/reorder_example.md
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, doc_body, markdown_table, write_text_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEEDS = range(5)
REPEATS = int(os.environ.get("REORDER_REPEATS", "40"))
WORK = '''"""Jobs of the reorder example (simulated kernels, run in order as one task)."""
from measure.sim import preset

M = [preset("traced_memory_50000us")] * 120     # 6 s, ~606 W, uncapped
S = [preset("traced_compute_50000us")] * 20     # ~4 s under a 200 W cap
C = [preset("axpy_triton_sm4")] * 240           # ~6 s, ~108 W at 1005 MHz
'''
GRIDS = {"M": "sm_clock_mhz=1980,power_limit_w=700", "S": "sm_clock_mhz=1980,power_limit_w=200",
         "C": "sm_clock_mhz=1005,power_limit_w=700"}
NINE = ["m1", "s1", "m2", "s2", "m3", "s3", "c1", "c2", "c3"]
TWO = ["m", "c"]


def ecal(folder: Path, *args: str, ok: tuple[int, ...] = (0,)) -> str:
    """``python -m ecal ARGS`` in ``folder`` (which holds the jobs' module); its stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)])}
    p = subprocess.run([sys.executable, "-m", "ecal", *args], cwd=folder, env=env,
                       capture_output=True, text=True)
    if p.returncode not in ok:
        raise RuntimeError(f"ecal {' '.join(args)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p.stdout


def workload(folder: Path, name: str, tasks: list[str]) -> Path:
    """A chain of the tasks (element = the task's first letter), all reorderable."""
    doc = {"format": "ecal.workload/1", "name": name,
           "elements": {e: {"source": f"{e}.json", "work": f"reorder_jobs:{e}"} for e in "MSC"},
           "shape": {"kind": "chain", "tasks": [{"name": t, "element": t[0].upper()} for t in tasks]},
           "idle_power_w": 80.0, "transitions": {"constant": {"time_s": 0.005}},
           "reorderable": [tasks]}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def measure(folder: Path, wl: Path) -> dict[str, Any]:
    """``ecal plan`` + ``ecal run`` on every seed: the step's measured E and T, per seed and
    pooled (mean over seeds; σ of that mean from each run's σ of its mean)."""
    plan = folder / f"{wl.stem}.plan.json"
    ecal(folder, "plan", wl.name, "--deadline", "2x", "-o", plan.name)
    runs = []
    for s in SEEDS:
        out = folder / f"{wl.stem}.run{s}.json"
        ecal(folder, "run", plan.name, "--no-baselines", "--target-rse", "0.0001", "--seed", str(s),
             "-o", out.name, ok=(0, 1))
        st = json.loads(out.read_text())["step"]
        runs.append((st["measured_energy_j"], st["sd_measured_energy_j"], st["measured_time_s"],
                     st["sd_measured_time_s"], st["n_steps"]))
    n = len(runs)
    return {"e": sum(r[0] for r in runs) / n, "sd_e": math.sqrt(sum(r[1] ** 2 for r in runs)) / n,
            "t": sum(r[2] for r in runs) / n, "sd_t": math.sqrt(sum(r[3] ** 2 for r in runs)) / n,
            "steps": sum(r[4] for r in runs), "per_seed": runs}


def characterize(folder: Path) -> None:
    (folder / "reorder_jobs.py").write_text(WORK)
    for e, grid in GRIDS.items():
        ecal(folder, "characterize", f"reorder_jobs:{e}", "--name", e, "--grid", grid,
             "--min-windows", "3", "--max-windows", "3", "-o", f"{e}.json")


def case_lever(folder: Path) -> tuple[list[str], dict[str, Any]]:
    wl = workload(folder, "nine", NINE)
    res = json.loads(ecal(folder, "reorder", wl.name, "-o", "nine.reordered.json", "--repeats",
                          str(REPEATS), "--json"))
    g = res["groups"][0]
    best = g["chosen"] if g["substituted"] else g["best_order"]
    other = workload(folder, "nine_best", best)
    given_m, best_m = measure(folder, wl), measure(folder, other)
    if g["substituted"]:
        pred_de, sd_pred = g["saving_j"], g["sd_saving_j"]
        pred_dt = g["saving_time_s"]
    else:
        pred_de, sd_pred = g["best_saving_j"], g["sd_best_saving_j"]
        pred_dt = g["best_saving_time_s"]
    pred_best_e = g["given_energy_j"] - pred_de
    pred_best_t = g["given_time_s"] - pred_dt
    meas_de = given_m["e"] - best_m["e"]
    sd_meas = math.hypot(given_m["sd_e"], best_m["sd_e"])
    meas_dt = given_m["t"] - best_m["t"]
    sd_meas_t = math.hypot(given_m["sd_t"], best_m["sd_t"])
    th = res["thermal"]["gpu0"]
    rows = [
        ["given: " + " ".join(NINE), f"{g['given_energy_j']:.1f} ± {g['sd_step_energy_j']:.1f}",
         f"{given_m['e']:.1f} ± {given_m['sd_e']:.1f}", f"{g['given_time_s']:.3f}",
         f"{given_m['t']:.3f} ± {given_m['sd_t']:.3f}"],
        [("chosen: " if g["substituted"] else "best (not substituted): ") + " ".join(best),
         f"{pred_best_e:.1f}", f"{best_m['e']:.1f} ± {best_m['sd_e']:.1f}", f"{pred_best_t:.3f}",
         f"{best_m['t']:.3f} ± {best_m['sd_t']:.3f}"],
        ["**difference** (given − other)", f"**{pred_de:.1f} ± {sd_pred:.1f}**",
         f"**{meas_de:.1f} ± {sd_meas:.1f}**", f"{pred_dt * 1e3:.0f} ms",
         f"{meas_dt * 1e3:.0f} ± {sd_meas_t * 1e3:.0f} ms"],
        ["null-context algebra (⊗ commutes)", "difference 0", "", "difference 0", ""],
    ]
    lines = [
        "## 1. Nine jobs: the order the algebra picks, measured\n",
        f"`ecal reorder nine.json -o nine.reordered.json --repeats {REPEATS}` (periodic steps): "
        f"{g['orders_evaluated']} distinct orders evaluated "
        f"({'all' if g['exhaustive'] else 'local search'}); thermal model fitted from "
        f"{th['windows']} windows: ambient {th['ambient_c']:.1f} °C, R_th {th['r_th_c_per_w']:.4f} °C/W, "
        f"τ {th['tau_s']:.2f} s, σ_Θ {th['sigma_temp_c']:.2f} °C (the simulator's own: 28.0 °C, "
        "0.0520 °C/W, 4.00 s). Substituted: "
        f"{'yes' if g['substituted'] else 'no (' + str(g['kept']) + ')'}.\n",
        f"Measured: `ecal plan W --deadline 2x` then `ecal run PLAN --target-rse 0.0001 --seed s` for "
        f"s = 0–4 ({given_m['steps']} and {best_m['steps']} measured steps in all); mean over seeds, "
        "σ of that mean.\n",
        markdown_table(["order", "E predicted J", "E measured J", "T predicted s", "T measured s"], rows),
        "Per element, the signatures `ecal reorder` characterized (entry temperature: E ± σ of "
        "the mean, T):\n",
        markdown_table(["element", "cooled entry", "warm entry"],
                       [[k, *(f"{p['entry_temp_c']:.1f} °C: {p['energy_j']:.1f} ± {p['sd_energy_j']:.1f} J, "
                              f"{p['time_s']:.3f} s" for p in v)]
                        for k, v in th["signatures"].items()]),
    ]
    summary = {"predicted_saving_j": pred_de, "sd_predicted_saving_j": sd_pred,
               "measured_saving_j": meas_de, "sd_measured_saving_j": sd_meas,
               "predicted_saving_time_s": pred_dt, "measured_saving_time_s": meas_dt,
               "sd_measured_saving_time_s": sd_meas_t, "step_energy_j": given_m["e"],
               "substituted": g["substituted"], "best": best}
    return lines, summary


def case_refusal(folder: Path) -> tuple[list[str], dict[str, Any]]:
    wl = workload(folder, "two", TWO)
    cold = json.loads(ecal(folder, "reorder", wl.name, "--entry", "cold", "-o", "two.cold.json",
                           "--repeats", str(REPEATS), "--json"))["groups"][0]
    per = json.loads(ecal(folder, "reorder", wl.name, "-o", "two.periodic.json",
                          "--repeats", str(REPEATS), "--json"))["groups"][0]
    swapped = workload(folder, "two_swapped", list(reversed(TWO)))
    a, b = measure(folder, wl), measure(folder, swapped)
    ref = cold["refused"][0] if cold["refused"] else None
    meas_de = a["e"] - b["e"]
    sd = math.hypot(a["sd_e"], b["sd_e"])
    rows = [
        ["single pass from the cooled die (`--entry cold`)",
         f"{ref['saving_j']:.1f}" if ref else "none", ref["reason"] if ref else "not refused",
         "refused" if ref else ("substituted" if cold["substituted"] else "kept")],
        ["steps back to back (default `--entry periodic`; repeated, `m c` and `c m` are one cycle)",
         f"{per['best_saving_j']:.1f} ± {per['sd_best_saving_j']:.1f}", "—",
         "substituted" if per["substituted"] else "kept"],
        ["measured, `ecal run` seeds 0–4 (back to back)", f"{meas_de:.1f} ± {sd:.1f}", "—", "—"],
    ]
    lines = [
        "## 2. Two jobs: a reorder refused because the exit contexts differ\n",
        "`ecal reorder two.json --entry cold` and `ecal reorder two.json` (periodic); the saving is "
        "`m c` minus `c m`.\n",
        markdown_table(["evaluation", "saving of c m, J", "why", "tool"], rows),
        f"Group exit temperature: `m c` {cold['group_exit_temp_c']['given']:.1f} °C"
        + (f", `c m` {cold['group_exit_temp_c']['given'] + ref['exit_diff_c']:.1f} °C "
           f"(tolerance c_α·σ_Θ = {cold['tolerance_c']:.2f} °C)." if ref else "."),
        "",
    ]
    return lines, {"refused": ref is not None, "single_pass_saving_j": ref["saving_j"] if ref else None,
                   "measured_saving_j": meas_de, "sd_measured_saving_j": sd}


def reading(lever: dict[str, Any], refusal: dict[str, Any]) -> str:
    beyond = abs(lever["measured_saving_j"]) > 1.96 * lever["sd_measured_saving_j"]
    agree = abs(lever["measured_saving_j"] - lever["predicted_saving_j"]) <= 1.96 * math.hypot(
        lever["sd_measured_saving_j"], lever["sd_predicted_saving_j"])
    pct = 100 * lever["measured_saving_j"] / lever["step_energy_j"]
    return "\n".join([
        f"- **Case 1.** Reordering the nine jobs changed the measured step energy by "
        f"{lever['measured_saving_j']:.1f} ± {lever['sd_measured_saving_j']:.1f} J ({pct:.2f} % of "
        f"the step), {'beyond' if beyond else 'within'} 1.96 σ; the context-carrying algebra predicted "
        f"{lever['predicted_saving_j']:.1f} ± {lever['sd_predicted_saving_j']:.1f} J "
        f"({'consistent' if agree else 'not consistent'} with the measurement at 1.96 σ), and the "
        "null-context algebra predicts no difference at all. The time changes more: "
        f"{lever['measured_saving_time_s'] * 1e3:.0f} ± {lever['sd_measured_saving_time_s'] * 1e3:.0f} ms "
        f"measured, {lever['predicted_saving_time_s'] * 1e3:.0f} ms predicted (the capped jobs run "
        "slower on a hot die).",
        "- The effect is small because it is a difference of two slopes: a capped job's energy rises "
        "with the die temperature (≈0.1 %/°C at 200 W), but the heat it takes in is not leaked by "
        "its uncapped neighbours (leakage ≈0.12–0.17 W/°C here). With only uncapped jobs the "
        "periodic step energy is the same in every order (∫Θ dt is fixed by the step's energy); "
        "the simulator has no thermal slowdown beyond the power cap. On this simulator, then, "
        "order is an energy lever only for power-capped work, and a weak one: a few joules per "
        "capped job per ~15 °C of entry difference.",
        f"- **Case 2.** In a single pass from a cooled die `c m` saves "
        f"{refusal['single_pass_saving_j']:.1f} J inside the pass; the tool refuses it because the die "
        "is left hotter and what follows is not known. Run back to back (what follows is the next "
        f"step), the two orders measure {refusal['measured_saving_j']:.1f} ± "
        f"{refusal['sd_measured_saving_j']:.1f} J apart: the single-pass saving is paid by the work "
        "that follows, which is what Property 5.1 (ii) guards against."
        if refusal["refused"] else "- **Case 2.** The tool did not refuse (see the table).",
    ])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="reorder_example_") as tmp:
        folder = Path(tmp)
        characterize(folder)
        lever_lines, lever = case_lever(folder)
        refusal_lines, refusal = case_refusal(folder)
    parts = ["# Reordering as an energy lever (simulated H200)\n", doc_body(__doc__) + "\n",
             f"Command: `python experiments/reorder_example.py` (simulated H200; seeds 0–4; "
             f"{REPEATS} runs per element and entry temperature).\n",
             *lever_lines, *refusal_lines, "## Reading\n", reading(lever, refusal), ""]
    out = RESULTS_DIR / "reorder_example.md"
    write_text_atomic(out, "\n".join(parts))
    (RESULTS_DIR / "reorder_example.json").write_text(json.dumps({"lever": lever, "refusal": refusal},
                                                                 indent=1))
    print("\n".join(parts))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
