"""Frontier plots (matplotlib, Agg; never opens a window).

Every function takes an optional ``ax`` (draw into an existing axes) and an optional ``path``
(write the figure there atomically: temp file + rename; format from the suffix), and returns
the :class:`matplotlib.figure.Figure`. Units are auto-scaled (µs/ms/s, mJ/J/kJ) and shown in
the axis labels. Plots of simulated data say so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

# Figures are built with matplotlib.figure.Figure directly (no pyplot): no window ever opens,
# no global backend is switched under the caller, and saving renders with Agg.
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .errors import EnergyCalculusError
from .pareto import Frontier, pareto_frontier
from .signature import Signature

_TIME_UNITS = ((1e-3, 1e6, "µs"), (1.0, 1e3, "ms"), (float("inf"), 1.0, "s"))
_ENERGY_UNITS = ((1e-3, 1e6, "µJ"), (1.0, 1e3, "mJ"), (1e3, 1.0, "J"), (float("inf"), 1e-3, "kJ"))


def time_unit(t_max_s: float) -> tuple[float, str]:
    """(scale, unit) to show times up to ``t_max_s``: µs below 1 ms, ms below 1 s, else s."""
    for lim, scale, unit in _TIME_UNITS:
        if t_max_s < lim:
            return scale, unit
    return 1.0, "s"  # pragma: no cover


def energy_unit(e_max_j: float) -> tuple[float, str]:
    """(scale, unit) to show energies up to ``e_max_j``: µJ, mJ, J or kJ."""
    for lim, scale, unit in _ENERGY_UNITS:
        if e_max_j < lim:
            return scale, unit
    return 1e-3, "kJ"  # pragma: no cover


def save_figure(fig: Figure, path: str | os.PathLike) -> Path:
    """Write ``fig`` to ``path`` atomically (format from the suffix; see ``frontier.files.atomic_write``)."""
    from .files import atomic_write

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight"))


def _axes(ax: Axes | None, figsize=(7.0, 4.8)) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def is_simulated(sigs: Iterable[Signature]) -> bool:
    """Whether any signature says it comes from the simulated GPU."""
    for s in sigs:
        m = s.meta
        if m.get("simulated") or "simulat" in str(m.get("source", "")).lower() \
                or "simulat" in str(m.get("backend", "")).lower() \
                or "simulat" in str(m.get("device_name", "")).lower():
            return True
    return False


def _mark_simulated(ax: Axes, sigs: Iterable[Signature]) -> None:
    if is_simulated(sigs):
        ax.text(0.99, 0.99, "SIMULATED GPU", transform=ax.transAxes, ha="right", va="top",
                fontsize=8, color="tab:red", alpha=0.8,
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="tab:red", alpha=0.7))


def _label_subset(n: int, max_labels: int) -> list[int]:
    """Evenly spread indices (always the two ends) so that at most ``max_labels`` are labelled."""
    if n <= max_labels:
        return list(range(n))
    if max_labels <= 1:
        return [0]
    step = (n - 1) / (max_labels - 1)
    return sorted({round(i * step) for i in range(max_labels)})


def _pick_labels(x: Sequence[float], y: Sequence[float], max_labels: int,
                 xlim: tuple[float, float] | None = None, ylim: tuple[float, float] | None = None,
                 min_sep: float = 0.08) -> list[int]:
    """Up to ``max_labels`` indices, ends first, then evenly spread candidates, skipping any
    point closer than ``min_sep`` (in axes-fraction units, from the axes limits) to one
    already labelled."""
    n = len(x)
    if n == 0 or max_labels <= 0:
        return []
    x0, x1 = xlim if xlim is not None else (min(x), max(x))
    y0, y1 = ylim if ylim is not None else (min(y), max(y))
    xr = (x1 - x0) or 1.0
    yr = (y1 - y0) or 1.0
    nx = [(v - x0) / xr for v in x]
    ny = [(v - y0) / yr for v in y]
    order = [0, n - 1] + [i for i in _label_subset(n, max(2, 2 * max_labels)) if i not in (0, n - 1)]
    chosen: list[int] = []
    for i in order:
        if len(chosen) >= max_labels:
            break
        if i in chosen:
            continue
        if all((nx[i] - nx[j]) ** 2 + (ny[i] - ny[j]) ** 2 >= min_sep**2 for j in chosen):
            chosen.append(i)
    return sorted(chosen)


def _short_labels(points: Sequence[Signature]) -> tuple[list[str], str]:
    """Labels for plotting: knob tokens shared by every point (``mem877``) are dropped and
    returned separately, so composite labels stay short."""
    from .pareto import point_label as full

    split = []
    for p in points:
        choice = p.meta.get("choice")
        parts = [str(c) for c in choice] if choice else [full(p)]
        split.append([c.split("/") for c in parts])
    tokens = [set(tok for part in sp for tok in part) for sp in split]
    common = set.intersection(*tokens) if tokens else set()
    # keep a token if removing it would leave some part empty
    for sp in split:
        for part in sp:
            if all(tok in common for tok in part):
                common -= set(part)
    labels = []
    for sp in split:
        parts = ["/".join(tok for tok in part if tok not in common) for part in sp]
        labels.append("+".join(parts))
    return labels, "/".join(sorted(common))


def _staircase(ax: Axes, fr: Frontier, t_end: float, ts: float, es: float, **kw) -> None:
    """E*(D) = cheapest energy with T ≤ D: a step line from the fastest point to ``t_end``."""
    t = list(fr.times_s) + [max(t_end, float(fr.times_s[-1]))]
    e = list(fr.energies_j) + [float(fr.energies_j[-1])]
    ax.step([x * ts for x in t], [y * es for y in e], where="post", **kw)


def _frontier_points(ax, fr, ts, es, color, label, marker="o", lw=1.6, ms=5, zorder=3):
    t, e = fr.times_s * ts, fr.energies_j * es
    sd_t = [p.sd_time_s * ts for p in fr]
    sd_e = [p.sd_energy_j * es for p in fr]
    if any(sd_t) or any(sd_e):
        ax.errorbar(t, e, xerr=sd_t, yerr=sd_e, fmt="none", ecolor=color, elinewidth=0.8,
                    capsize=2, alpha=0.8, zorder=zorder)
    ax.plot(t, e, marker=marker, color=color, lw=lw, ms=ms, label=label, zorder=zorder)


def _annotate(ax, fr, max_labels, ts, es, x_span, color="0.15") -> str:
    """Label a readable subset of ``fr``'s points; returns the knob tokens common to all."""
    x = [p.time_s * ts for p in fr.points]
    y = [p.energy_j * es for p in fr.points]
    labels, common = _short_labels(fr.points)
    lo, hi = x_span
    mid = (lo + hi) / 2
    for i in _pick_labels(x, y, max_labels, ax.get_xlim(), ax.get_ylim()):
        # Left half: label up-right; right half: down-left (for a falling frontier that is
        # the empty, unachievable side), so labels stay inside the axes and off the curve.
        right = x[i] <= mid
        ax.annotate(labels[i], (x[i], y[i]), xytext=(7, 5) if right else (-7, -6),
                    textcoords="offset points", fontsize=7.5, color=color,
                    ha="left" if right else "right", va="bottom" if right else "top",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8),
                    zorder=6)
    return common


def plot_frontier(sigs_or_frontier: Frontier | Iterable[Signature], path: str | os.PathLike | None = None,
                  title: str | None = None, label_points: bool = True, ax: Axes | None = None,
                  max_labels: int = 8) -> Figure:
    """Achievable set (grey), its (T, E) frontier (line, ±σ error bars), the cheapest energy
    within each deadline (dashed staircase), and ``κ @ ω`` labels on a readable subset of
    frontier points (at most ``max_labels``, ends first, none crowding another).

    Given a :class:`Frontier`, its points are the achievable set drawn; given signatures, the
    frontier is computed with :func:`~frontier.pareto.pareto_frontier`.
    """
    if isinstance(sigs_or_frontier, Frontier):
        pts = list(sigs_or_frontier.points)
        name = sigs_or_frontier.name
    else:
        pts = list(sigs_or_frontier)
        name = None
    if not pts:
        raise EnergyCalculusError("plot_frontier: no signatures to plot")
    fr = pareto_frontier(pts, "TE", name=name)
    fig, ax = _axes(ax)
    t_all = [p.time_s for p in pts]
    ts, tu = time_unit(max(t_all))
    es, eu = energy_unit(max(p.energy_j for p in pts))
    on_frontier = {id(p) for p in fr.points}
    dominated = [p for p in pts if id(p) not in on_frontier]
    if dominated:
        ax.scatter([p.time_s * ts for p in dominated], [p.energy_j * es for p in dominated],
                   s=16, color="0.55", alpha=0.7, lw=0, zorder=2,
                   label=f"achievable, dominated ({len(dominated)})")
    _staircase(ax, fr, max(t_all) * 1.02, ts, es, color="tab:blue", lw=0.9, ls="--", alpha=0.55,
               label="cheapest E within deadline", zorder=2)
    _frontier_points(ax, fr, ts, es, "tab:blue", f"frontier ({len(fr)} of {len(pts)} points)")
    common = ""
    if label_points:
        common = _annotate(ax, fr, max_labels, ts, es, (min(t_all) * ts, max(t_all) * ts))
    ax.set_xlabel(f"time per run T ({tu})")
    ax.set_ylabel(f"energy per run E ({eu})")
    t = title if title is not None else f"Operating frontier: {fr.name}"
    if common and title is None:
        t += f"  (all at {common})"
    ax.set_title(t, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    _mark_simulated(ax, pts)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_compositions(frontiers: Sequence[Frontier], composite: Frontier,
                      path: str | os.PathLike | None = None, title: str | None = None,
                      ax: Axes | Sequence[Axes] | None = None, label_points: bool = True,
                      max_labels: int = 6) -> Figure:
    """Each element's frontier and the composite's.

    By default two panels side by side — left, the element frontiers (one colour each); right,
    the composite frontier (bold, with its cheapest-within-deadline staircase and labels of the
    per-element choices) — because a composite sits at a much larger T and E than its parts.
    Pass ``ax`` as one Axes to draw everything on it, or as a pair of Axes for the two panels.
    """
    frontiers = list(frontiers)
    if not isinstance(composite, Frontier) or not all(isinstance(f, Frontier) for f in frontiers):
        raise EnergyCalculusError("plot_compositions: pass Frontier objects (see pareto_frontier)")
    if ax is None:
        fig = Figure(figsize=(11.0, 4.6), layout="constrained")
        ax_el, ax_c = fig.subplots(1, 2)
    elif isinstance(ax, Axes):
        fig, ax_el, ax_c = ax.figure, ax, ax
    else:
        ax_el, ax_c = ax
        fig = ax_el.figure
    all_pts = [p for f in [*frontiers, composite] for p in f]
    markers = "sD^v<>ph*"

    def units(pts):
        return time_unit(max(p.time_s for p in pts)), energy_unit(max(p.energy_j for p in pts))

    (ts, tu), (es, eu) = units(all_pts if ax_el is ax_c else [p for f in frontiers for p in f] or all_pts)
    for i, f in enumerate(frontiers):
        _frontier_points(ax_el, f, ts, es, f"C{i % 10}", f"{f.name} ({len(f)})",
                         marker=markers[i % len(markers)], lw=1.2, ms=4)
    if ax_el is not ax_c:
        ax_el.set_xlabel(f"time T ({tu})")
        ax_el.set_ylabel(f"energy E ({eu})")
        ax_el.set_title("element frontiers", fontsize=10)
        ax_el.grid(True, alpha=0.3)
        ax_el.legend(fontsize=8, loc="best")
        (ts, tu), (es, eu) = units(list(composite.points))
    _staircase(ax_c, composite, float(composite.times_s[-1]) * 1.03, ts, es, color="black", lw=0.9,
               ls="--", alpha=0.5, zorder=3, label="cheapest E within deadline")
    _frontier_points(ax_c, composite, ts, es, "black", f"composite ({len(composite)} points)",
                     lw=2.0, ms=4.5, zorder=4)
    common = ""
    if label_points:
        ct = composite.times_s * ts
        common = _annotate(ax_c, composite, max_labels, ts, es, (float(ct.min()), float(ct.max()) * 1.03))
    ax_c.set_xlabel(f"time T ({tu})")
    ax_c.set_ylabel(f"energy E ({eu})")
    sub = "composite frontier"
    if common:
        sub += f"\n(every part at {common})"
    ax_c.set_title(sub, fontsize=10)
    ax_c.grid(True, alpha=0.3)
    ax_c.legend(fontsize=8, loc="best")
    if composite.meta.get("thinned"):
        ax_c.text(0.01, 0.01, f"ε-thinned: E ≤ x{composite.meta.get('energy_bound_factor', 1):.4g} optimal",
                  transform=ax_c.transAxes, fontsize=7.5, color="0.3")
    fig.suptitle(title if title is not None else f"Composition: {composite.name}", fontsize=11)
    _mark_simulated(ax_c, all_pts)
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = ["plot_frontier", "plot_compositions", "save_figure", "time_unit", "energy_unit",
           "is_simulated"]
