"""Study 2 — power limits from real training traces (Zeus NSDI'23).

What it shows: the Zeus power traces (epoch time and average power of 6 DNN workloads at every
GPU power limit, on A40, P100, RTX 6000 and V100; ``../shared/data/zeus/nsdi23-traces``) become
per-workload power-cap frontiers (time, energy per epoch); under a deadline of 1.05× and 1.10×
the fastest epoch the frontier picks a cap, and we report what that saves against leaving the
cap at its maximum (the default).

Run:

    python experiments/study_power_limits.py [--gpus a40,p100,rtx6000,v100]
        [--deadlines 1.05,1.10] [--out experiments/results]

Writes ``study_power_limits.{md,json,png}`` under the output folder (atomically).

Static power: the traces record only the average board power per epoch, so the loader's
default s = 0 W is used (all energy counted as dynamic). The choice of a cap for one job under a
deadline needs only E = s·T + d per epoch, which the trace measures whole, so it does not depend
on the split; s would matter only when composing the job in parallel with others or when
charging idle power for the time left before the deadline (not done here: the GPU is assumed to
move on to the next job).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    RESULTS_DIR,
    console_table,
    display_path,
    markdown_table,
    shared_file,
    write_json,
    write_text_atomic,
)

from frontier.pareto import Frontier, pareto_frontier
from frontier.signature import Signature
from measure.replay import load_zeus_trace

GPUS: dict[str, str] = {"a40": "A40", "p100": "P100", "rtx6000": "RTX 6000", "v100": "V100"}
TRACE = "zeus/nsdi23-traces/summary_power_{gpu}.csv"

#: One representative configuration per workload: the default batch size of the Zeus paper's
#: workloads (the closest batch size present is used when a GPU lacks it).
DEFAULT_BATCH: dict[str, int] = {
    "cifar100/shufflenetv2": 1024,
    "imagenet/resnet50": 256,
    "librispeech/deepspeech2": 192,
    "movielens-1m/ncf": 1024,
    "squad/bert_base_uncased": 32,
    "sentiment140/bert_base_uncased": 128,
}
STATIC_POWER_W = 0.0


@dataclass(frozen=True)
class CapChoice:
    """The cap a deadline picks for one configuration, and what the maximum cap costs."""

    deadline_factor: float
    deadline_s: float
    chosen: Signature
    max_cap: Signature

    @property
    def saved(self) -> float:
        """Energy saved against the maximum cap (fraction)."""
        return 1.0 - self.chosen.energy_j / self.max_cap.energy_j


def workload_of(config: str) -> str:
    """``dataset/network`` of a ``dataset/network/bsN/optimizer`` element name."""
    return "/".join(config.split("/")[:2])


def batch_of(config: str) -> int:
    """The batch size of an element name."""
    return int(config.split("/")[2].removeprefix("bs"))


def representative(configs: Sequence[str], workload: str) -> str:
    """The configuration of ``workload`` closest (in log batch size) to its default batch size."""
    mine = sorted(c for c in configs if workload_of(c) == workload)
    target = DEFAULT_BATCH.get(workload, 0)
    if not target:
        return mine[0]
    return min(mine, key=lambda c: (abs(math.log(batch_of(c) / target)), c))


def cap_frontier(config: str, sigs: Sequence[Signature]) -> Frontier:
    """(T, E) power-cap frontier of one configuration (one epoch per point)."""
    return pareto_frontier(sigs, "TE", name=config)


def choose_cap(sigs: Sequence[Signature], fr: Frontier, factor: float) -> CapChoice:
    """Cheapest frontier point within ``factor`` × the fastest epoch; the max cap for comparison."""
    deadline_s = factor * fr.fastest.time_s
    chosen = fr.energy_at(deadline_s)
    max_cap = max(sigs, key=lambda s: s.omega.power_limit_w)
    return CapChoice(factor, deadline_s, chosen, max_cap)


@dataclass(frozen=True)
class GpuResult:
    """One GPU's traces: every configuration's frontier and choices."""

    key: str
    name: str
    source: Path
    sigs: dict[str, list[Signature]]
    frontiers: dict[str, Frontier]
    choices: dict[str, list[CapChoice]]   # config → one choice per deadline factor


def analyse_gpu(key: str, factors: Sequence[float]) -> GpuResult | None:
    """Load one GPU's trace and choose caps for every configuration (None if the file is absent)."""
    path = shared_file(TRACE.format(gpu=key))
    if path is None:
        return None
    sigs = load_zeus_trace(path, static_power_w=STATIC_POWER_W)
    frontiers = {c: cap_frontier(c, v) for c, v in sigs.items()}
    choices = {c: [choose_cap(sigs[c], frontiers[c], f) for f in factors] for c in sigs}
    return GpuResult(key, GPUS[key], path, sigs, frontiers, choices)


def workloads(res: GpuResult) -> list[str]:
    """Workloads present in a GPU's trace, in the order of ``DEFAULT_BATCH``."""
    present = {workload_of(c) for c in res.sigs}
    return [w for w in DEFAULT_BATCH if w in present] + sorted(present - set(DEFAULT_BATCH))


def table_rows(res: GpuResult, factors: Sequence[float]) -> list[list[Any]]:
    """One row per workload (its representative configuration, plus the median over all its
    configurations at the last deadline factor)."""
    rows = []
    for w in workloads(res):
        cfg = representative(list(res.sigs), w)
        ch = res.choices[cfg]
        caps = sorted(s.omega.power_limit_w for s in res.sigs[cfg])
        allcfg = [res.choices[c][-1].saved for c in res.sigs if workload_of(c) == w]
        row = [res.name, w, cfg.split("/", 2)[2], f"{caps[0]:g}–{caps[-1]:g}",
               f"{ch[0].max_cap.time_s:.1f}", f"{ch[0].max_cap.energy_j / 1e3:.2f}"]
        for c in ch:
            row += [f"{c.chosen.omega.power_limit_w:g}", f"{c.chosen.time_s / c.max_cap.time_s:.3f}",
                    f"{100 * c.saved:.1f}"]
        row += [f"{100 * statistics.median(allcfg):.1f} (n={len(allcfg)})"]
        rows.append(row)
    return rows


def headers(factors: Sequence[float]) -> list[str]:
    """Column names of :func:`table_rows`."""
    h = ["GPU", "workload", "config", "caps W", "T@max s", "E@max kJ"]
    for f in factors:
        h += [f"cap@{f:g}× W", f"T/T@max @{f:g}×", f"saved @{f:g}× %"]
    return h + [f"median saved, all batch sizes @{factors[-1]:g}× %"]


def plot(results: Sequence[GpuResult], factors: Sequence[float], path: Path) -> None:
    """Per GPU: each workload's representative frontier, normalised to the max cap, with the
    caps chosen at each deadline marked."""
    from matplotlib.figure import Figure

    from frontier.plot import save_figure

    n = len(results)
    cols = 2 if n > 1 else 1
    nrows = math.ceil(n / cols)
    fig = Figure(figsize=(6.2 * cols, 4.6 * nrows))
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    markers = ["o", "s", "^", "D"]
    for ax, res in zip(axes, results):
        seen: list[tuple[float, float]] = []
        for i, w in enumerate(workloads(res)):
            cfg = representative(list(res.sigs), w)
            base = res.choices[cfg][0].max_cap
            front = res.frontiers[cfg].points
            line, = ax.plot([p.time_s / base.time_s for p in front], [p.energy_j / base.energy_j for p in front],
                            marker=".", lw=1.2, label=f"{w} ({cfg.split('/')[2]})")
            others = [p for p in res.sigs[cfg] if p not in front]
            ax.scatter([p.time_s / base.time_s for p in others], [p.energy_j / base.energy_j for p in others],
                       s=8, color=line.get_color(), alpha=0.35, lw=0)
            seen += [(p.time_s / base.time_s, p.energy_j / base.energy_j) for p in res.sigs[cfg]]
            for k, c in enumerate(res.choices[cfg]):
                ax.plot(c.chosen.time_s / base.time_s, c.chosen.energy_j / base.energy_j,
                        marker=markers[k % len(markers)], ms=9, mfc="none", mec=line.get_color(), mew=1.6)
                if i == 0:
                    ax.plot([], [], marker=markers[k % len(markers)], ls="", mfc="none", mec="k",
                            label=f"cap chosen at {c.deadline_factor:g}× fastest")
        ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
        ax.axvline(1.0, color="0.6", lw=0.8, ls=":")
        # Zoom on the region deadlines of a few % care about (slow caps go off to the right).
        x_hi = max(1.3, 1.15 * max(factors))
        ys = [y for x, y in seen if x <= x_hi]
        ax.set_xlim(0.98 * min(x for x, _ in seen), x_hi)
        ax.set_ylim(0.97 * min(ys), 1.03 * max(ys))
        ax.set_xlabel("epoch time / time at max cap")
        ax.set_ylabel("epoch energy / energy at max cap")
        ax.set_title(f"{res.name}: power-cap frontiers (Zeus NSDI'23 traces, real; faint: dominated)",
                     fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper right")
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    save_figure(fig, path)


def gpu_json(res: GpuResult) -> dict[str, Any]:
    """JSON-ready per-GPU result: every configuration's points and choices."""
    out = {}
    for c, sigs in res.sigs.items():
        out[c] = {
            "points": [{"power_limit_w": s.omega.power_limit_w, "time_s": s.time_s, "energy_j": s.energy_j}
                       for s in sorted(sigs, key=lambda s: s.omega.power_limit_w)],
            "frontier_caps_w": [p.omega.power_limit_w for p in res.frontiers[c].points],
            "choices": [{"deadline_factor": ch.deadline_factor, "deadline_s": ch.deadline_s,
                         "cap_w": ch.chosen.omega.power_limit_w, "time_s": ch.chosen.time_s,
                         "energy_j": ch.chosen.energy_j, "max_cap_w": ch.max_cap.omega.power_limit_w,
                         "max_cap_energy_j": ch.max_cap.energy_j, "saved": ch.saved}
                        for ch in res.choices[c]],
        }
    return {"name": res.name, "source": display_path(res.source), "configs": out}


def run_study(gpus: Sequence[str] = tuple(GPUS), factors: Sequence[float] = (1.05, 1.10),
              out_dir: Path | None = RESULTS_DIR, quiet: bool = False) -> dict[str, Any] | None:
    """Run the study; returns the JSON-ready result (None when no trace is found).

    ``out_dir=None`` writes nothing (tests)."""
    results = [r for r in (analyse_gpu(g, factors) for g in gpus) if r is not None]
    if not results:
        print("Zeus traces not found under ../shared/data/zeus/nsdi23-traces; nothing to do.")
        return None
    say = (lambda *a: None) if quiet else print
    say("Study 2 — power limits from real traces (Zeus NSDI'23 power traces)")
    for r in results:
        say(f"  data: {display_path(r.source)} ({len(r.sigs)} configurations)")
    say(f"  static power assumed s = {STATIC_POWER_W:g} W: the traces give average board power only; the "
        f"cap chosen for one job needs only E per epoch, which does not depend on the split")
    say(f"  deadlines: {', '.join(f'{f:g}' for f in factors)}× the fastest epoch of each configuration; "
        f"baseline: the maximum cap (default)\n")
    rows = [r for res in results for r in table_rows(res, factors)]
    hdr = headers(factors)
    say(console_table(hdr, rows))
    overall = {f: [res.choices[c][k].saved for res in results for c in res.sigs] for k, f in enumerate(factors)}
    summary = [f"Over all {len(overall[factors[0]])} configurations: median saving "
               + ", ".join(f"{100 * statistics.median(v):.1f} % at {f:g}×" for f, v in overall.items())
               + "; the chosen cap is below the maximum in "
               + ", ".join(f"{sum(1 for x in v if x > 0)}/{len(v)} at {f:g}×" for f, v in overall.items())
               + ". Near the top of the voltage-frequency curve power grows faster than speed, so "
                 "the first steps below the maximum cap cost little epoch time and save much "
                 "energy; where the max cap is not even the fastest point (NCF), the saving is free."]
    say("\n" + summary[0])
    out = {"study": "power_limits", "static_power_w": STATIC_POWER_W, "deadline_factors": list(factors),
           "gpus": {res.key: gpu_json(res) for res in results}, "notes": summary,
           "table": {"headers": hdr, "rows": rows}}
    if out_dir is not None:
        out_dir = Path(out_dir)
        md = ("# Study 2 — power limits from real traces (Zeus NSDI'23)\n\n"
              + "".join(f"Data: `{display_path(r.source)}`.\n" for r in results)
              + f"\nStatic power assumed s = {STATIC_POWER_W:g} W (no idle reading in the traces; the "
                "cap choice for one job depends only on energy per epoch).\n\n"
              + markdown_table(hdr, rows) + "\n" + summary[0] + "\n")
        write_text_atomic(out_dir / "study_power_limits.md", md)
        write_json(out_dir / "study_power_limits.json", out)
        plot(results, factors, out_dir / "study_power_limits.png")
        say(f"\nwrote {out_dir}/study_power_limits.{{md,json,png}}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default=",".join(GPUS), help=f"comma-separated: {', '.join(GPUS)}")
    ap.add_argument("--deadlines", default="1.05,1.10", help="deadline factors of the fastest epoch")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)
    gpus = [g.strip() for g in a.gpus.split(",") if g.strip()]
    bad = [g for g in gpus if g not in GPUS]
    if bad:
        ap.error(f"unknown GPU(s) {bad}; known: {sorted(GPUS)}")
    factors = [float(x) for x in a.deadlines.split(",") if x.strip()]
    return 0 if run_study(gpus, factors, out_dir=a.out) is not None else 1


if __name__ == "__main__":
    sys.exit(main())
