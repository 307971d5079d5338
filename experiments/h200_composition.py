"""Real-H200 composition check: predict four measured composites from element signatures and
test each with Eq. 23 on time and energy.

    python experiments/h200_composition.py [--data PATH] [--alpha 0.05] [--out experiments/results]

Prints a table (composite, predicted T and E ± σ, measured T and E ± σ, error %, z for T and
E, flagged), and writes ``h200_composition.json`` and ``h200_composition.png`` (predicted vs
measured with ±c_α·σ error bars) to the output folder, atomically. The data are real NVML
energy-counter measurements on one NVIDIA H200 (``data/h200/measurements.json``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from matplotlib.figure import Figure

from frontier.deviation import DeviationResult, deviation
from frontier.errors import EnergyCalculusError
from frontier.files import write_json_atomic
from frontier.h200 import (
    element_signatures,
    load_measurements,
    measured_signature,
    predict_composition,
    static_power_w,
)
from frontier.plot import save_figure
from measure.replay import H200_MEASUREMENTS, shared_data_dir

OUT_DEFAULT = Path(__file__).resolve().parent / "results"


def run(data_path: Path, alpha: float) -> tuple[list[dict], list[DeviationResult], float]:
    """Predict every composite, test it; returns per-composite rows, results and s (W)."""
    data = load_measurements(data_path)
    s = static_power_w(data)
    sigs = element_signatures(data)
    rows, results = [], []
    for comp in data["compositions"]:
        pred = predict_composition(data, comp, sigs)
        meas = measured_signature(comp, s)
        r = deviation(pred, meas, alpha=alpha)
        rb = deviation(pred, meas, alpha=alpha, bias_aware=True)
        results.append(r)
        rows.append({
            "name": comp["name"], "how": comp.get("how"), "parts": comp["parts"],
            "predicted": {"time_s": pred.time_s, "sd_time_s": pred.sd_time_s,
                          "energy_j": pred.energy_j, "sd_energy_j": pred.sd_energy_j,
                          "bias_bound_j": r.bias_bound_j},
            "measured": {"time_s": meas.time_s, "sd_time_s": meas.sd_time_s,
                         "energy_j": meas.energy_j, "sd_energy_j": meas.sd_energy_j, "n": meas.n},
            "deviation": r.to_dict(),
            "flagged_energy_bias_aware": rb.flagged_energy,
        })
    return rows, results, s


def table(results: list[DeviationResult]) -> str:
    """The printed table."""
    head = (f"{'composite':<24} {'T pred (ms)':>16} {'T meas (ms)':>16} {'E pred (J)':>14} "
            f"{'E meas (J)':>14} {'dT %':>7} {'dE %':>7} {'z_T':>8} {'z_E':>7}  flagged")
    lines = [head, "-" * len(head)]
    for r in results:
        flag = ",".join(x for x, f in (("T", r.flagged_time), ("E", r.flagged_energy)) if f) or "-"
        lines.append(
            f"{r.name:<24} "
            f"{r.predicted_time_s * 1e3:>8.1f} ± {r.sd_predicted_time_s * 1e3:<5.2f} "
            f"{r.measured_time_s * 1e3:>8.1f} ± {r.sd_measured_time_s * 1e3:<5.2f} "
            f"{r.predicted_energy_j:>7.1f} ± {r.sd_predicted_energy_j:<4.1f} "
            f"{r.measured_energy_j:>7.1f} ± {r.sd_measured_energy_j:<4.1f} "
            f"{r.error_time_pct:>+7.2f} {r.error_energy_pct:>+7.2f} {r.z_time:>+8.1f} {r.z_energy:>+7.2f}  {flag}")
    return "\n".join(lines)


def figure(results: list[DeviationResult]) -> Figure:
    """Predicted vs measured T and E per composite, error bars ±c_α·σ."""
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    x = list(range(len(results)))
    names = [r.name.replace("_", "\n", 1) for r in results]
    c = results[0].c_alpha if results else 1.96
    for ax, what, scale, unit in ((axes[0], "time", 1e3, "ms"), (axes[1], "energy", 1.0, "J")):
        key_p, key_m = f"predicted_{what}_{'s' if what == 'time' else 'j'}", f"measured_{what}_{'s' if what == 'time' else 'j'}"
        sd_p, sd_m = f"sd_{key_p}", f"sd_{key_m}"
        ax.errorbar([i - 0.12 for i in x], [getattr(r, key_p) * scale for r in results],
                    yerr=[c * getattr(r, sd_p) * scale for r in results], fmt="o", capsize=4,
                    label="predicted (composed)")
        ax.errorbar([i + 0.12 for i in x], [getattr(r, key_m) * scale for r in results],
                    yerr=[c * getattr(r, sd_m) * scale for r in results], fmt="s", capsize=4,
                    label="measured")
        for i, r in enumerate(results):
            flagged = r.flagged_time if what == "time" else r.flagged_energy
            pct = r.error_time_pct if what == "time" else r.error_energy_pct
            top = max(getattr(r, key_p), getattr(r, key_m)) * scale
            ax.annotate(f"{pct:+.1f}%{' *' if flagged else ''}", (i, top), textcoords="offset points",
                        xytext=(0, 8), ha="center", fontsize=8, color="C3" if flagged else "k")
        ax.set_xticks(x, names, fontsize=7)
        ax.set_ylabel(f"{what} ({unit})")
        ax.set_title(f"{what}: predicted vs measured (±{c:.2f}σ; * = flagged by Eq. 23)", fontsize=9)
        ax.margins(y=0.15)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Real NVIDIA H200 (NVML energy counter): composed predictions vs direct measurement",
                 fontsize=10)
    fig.tight_layout()
    return fig


def save_figure_atomic(fig: Figure, path: Path) -> None:
    """Render to a temp file in the same folder, then rename into place."""
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=shared_data_dir() / H200_MEASUREMENTS,
                    help="measurements.json (default: ../shared/data/h200/measurements.json)")
    ap.add_argument("--alpha", type=float, default=0.05, help="significance level of Eq. 23")
    ap.add_argument("--out", type=Path, default=OUT_DEFAULT, help="output folder")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"h200_composition: {args.data}: no such file (the shared data folder is absent; "
              f"pass --data or set ECAL_SHARED_DATA)", file=sys.stderr)
        return 2
    try:
        rows, results, s = run(args.data, args.alpha)
    except EnergyCalculusError as exc:
        print(f"h200_composition: error: {exc}", file=sys.stderr)
        return 2
    print(f"Real H200 composition check ({args.data}); static power {s:.1f} W; "
          f"alpha = {args.alpha} (c_a = {results[0].c_alpha:.2f}); σ = standard error of the mean\n")
    print(table(results))
    out_json = args.out / "h200_composition.json"
    write_json_atomic(out_json, {
        "about": "Eq. 23 check of four real H200 composites predicted from element signatures",
        "data": str(args.data), "static_power_w": s, "alpha": args.alpha,
        "units": {"time": "s", "energy": "J", "power": "W"}, "composites": rows,
    })
    out_png = args.out / "h200_composition.png"
    save_figure_atomic(figure(results), out_png)
    print(f"\nwrote {out_json} and {out_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
