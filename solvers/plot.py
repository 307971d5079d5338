"""Plots of plans and curves (matplotlib Agg; written atomically)."""

from __future__ import annotations

import os
from pathlib import Path

from .plan import ParetoCurve, Plan


def _save(fig, path: str | os.PathLike) -> Path:
    from frontier.plot import save_figure

    return save_figure(fig, path)


def plot_timeline(plan: Plan, path: str | os.PathLike, stamp: str | None = None) -> Path:
    """Gantt chart: one row per device, a bar per task coloured by its average power;
    ``stamp`` is appended to the title (as in :func:`plot_pareto`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm
    from matplotlib.colors import Normalize

    devs = list(dict.fromkeys(t.device for t in plan.tasks))
    powers = [t.power_w for t in plan.tasks] or [0.0]
    norm = Normalize(min(powers), max(max(powers), min(powers) + 1e-9))
    cmap = cm.get_cmap("viridis") if hasattr(cm, "get_cmap") else matplotlib.colormaps["viridis"]
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(devs)))
    for t in plan.tasks:
        y = devs.index(t.device)
        ax.barh(y, (t.end_s - t.start_s) * 1e3, left=t.start_s * 1e3, color=cmap(norm(t.power_w)),
                edgecolor="black", linewidth=0.2)
    ax.axvline(plan.deadline_s * 1e3, color="red", linestyle="--", linewidth=1, label="deadline")
    ax.set_yticks(range(len(devs)), devs)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(f"{plan.problem}: {plan.energy_j:.1f} J, makespan {plan.makespan_s * 1e3:.2f} ms, "
                 f"gap {plan.gap * 100:.2f} % ({plan.method})" + (f" — {stamp}" if stamp else ""),
                 fontsize=9)
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="power (W)")
    ax.legend(loc="lower right", fontsize=8)
    out = _save(fig, path)
    plt.close(fig)
    return out


def plot_pareto(curve: ParetoCurve, path: str | os.PathLike, others: dict | None = None,
                stamp: str | None = None) -> Path:
    """Energy vs deadline (plans and lower bounds); ``others`` adds labelled (deadlines_s,
    energies_j) series, e.g. lowtime's; ``stamp`` is appended to the title (``SIMULATED H200``
    on the simulator's curves, so a figure never passes for a measurement)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.step(curve.deadlines_s * 1e3, curve.energies_j, where="post", marker=".", label="plan")
    ax.plot(curve.deadlines_s * 1e3, curve.bounds_j, "k:", label="lower bound")
    for name, (d, e) in (others or {}).items():
        ax.plot([x * 1e3 for x in d], e, ".", markersize=2, label=name)
    ax.set_xlabel("deadline (ms)")
    ax.set_ylabel("energy (J)")
    ax.set_title(f"{curve.problem} ({curve.method})" + (f" — {stamp}" if stamp else ""), fontsize=9)
    ax.legend(fontsize=8)
    out = _save(fig, path)
    plt.close(fig)
    return out
