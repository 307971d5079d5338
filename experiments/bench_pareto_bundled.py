"""``ecal pareto`` on the bundled examples, as a new user runs it: time, points cut short by the
safety net, and whether the curve is the same with two busy loops beside it (issue 31).

For each bundled workload: the default ``ecal pareto WORKLOAD -o curve.json`` once on its own,
then again with two CPU-bound busy processes running; the two curve files must be identical
except their wall-time fields (``wall_s``). With ``--vs-ilp`` each curve's energies are also
compared with ``--method ilp``'s at the same deadlines (slow: minutes per curve).

    python experiments/bench_pareto_bundled.py [--vs-ilp]

Writes experiments/results/bench_pareto_bundled.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from _common import rows_table  # noqa: E402

from frontier.files import write_json_atomic, write_text_atomic  # noqa: E402

EXAMPLES = ROOT / "ecal" / "examples"
WORKLOADS = ("workload_1f1b.json", "pipeline_4x8.csv")


def _busy(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for i in range(100_000):
            x ^= i


def pareto(workload: Path, out: Path, *extra: str) -> tuple[float, dict]:
    """Run ``ecal pareto`` (this checkout's code); (wall s, the curve file)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "ecal", "pareto", str(workload), "-o", str(out),
                        *extra], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"ecal pareto {workload.name} failed ({r.returncode}): {r.stderr[-1000:]}")
    return wall, json.loads(out.read_text())


def strip_wall(x: Any) -> Any:
    """The document without its wall-time fields."""
    if isinstance(x, dict):
        return {k: strip_wall(v) for k, v in x.items() if k != "wall_s"}
    if isinstance(x, list):
        return [strip_wall(v) for v in x]
    return x


def _plans(doc: dict) -> list[dict]:
    return doc.get("plans") or doc.get("points") or []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vs-ilp", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_pareto_"))
    rows = []
    for name in WORKLOADS:
        wl = EXAMPLES / name
        quiet_s, quiet = pareto(wl, tmp / f"{name}.quiet.json")
        stop = mp.Event()
        busy = [mp.Process(target=_busy, args=(stop,), daemon=True) for _ in range(2)]
        for b in busy:
            b.start()
        try:
            loaded_s, loaded = pareto(wl, tmp / f"{name}.loaded.json")
        finally:
            stop.set()
            for b in busy:
                b.join()
        plans = _plans(quiet)
        row: dict[str, Any] = {
            "workload": name, "points": len(plans), "method": quiet.get("method"),
            "quiet s": quiet_s, "loaded s": loaded_s,
            "time-capped points": sum(1 for p in plans if p.get("time_capped")),
            "identical under load": strip_wall(quiet) == strip_wall(loaded),
            "max gap %": 100 * max((p.get("gap") or 0.0) for p in plans) if plans else 0.0}
        if a.vs_ilp:
            # the same grid (it ends at the free optimum's makespan, which both find), so
            # points are matched by deadline; unmatched ones are left out
            ilp_s, ilp = pareto(wl, tmp / f"{name}.ilp.json", "--method", "ilp")
            by_d = {round(p["deadline_s"], 6): p["energy_j"] for p in _plans(ilp)}
            worse = [p["energy_j"] / by_d[round(p["deadline_s"], 6)] - 1.0 for p in plans
                     if round(p["deadline_s"], 6) in by_d]
            row["matched points"] = len(worse)
            row["ilp s"] = ilp_s
            row["max % above ilp"] = 100 * max(worse) if worse else float("nan")
        rows.append(row)
        print(row, flush=True)
    cols = list(rows[0])
    write_json_atomic(a.out / "bench_pareto_bundled.json", {"rows": rows, "cpus": os.cpu_count()})
    write_text_atomic(a.out / "bench_pareto_bundled.md", "\n".join([
        "# `ecal pareto` on the bundled examples",
        "",
        f"`python experiments/bench_pareto_bundled.py{' --vs-ilp' if a.vs_ilp else ''}` on "
        f"{os.cpu_count()} cores; the default command (`ecal pareto WORKLOAD -o curve.json`), "
        "once alone and once beside two busy processes. Identical: the two curve files are the "
        "same but for their wall-time fields.",
        "",
        rows_table(rows, cols, digits=4),
        ""]))


if __name__ == "__main__":
    main()
