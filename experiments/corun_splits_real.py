"""GEMM ∥ copy at four SM splits, on a real GPU through ``NVMLDevice.run_parallel`` (issue 30).

The simulator's green-context co-run model (docs/simulator.md) was checked on one real split
(96 + 32). This measures all four splits of ``measure.calibration.SPLIT_CORUNS`` the same way
on the device at hand, read-only (no clock or power-limit change):

* each side alone on its partition (``characterize`` with ``sm_count``: a green context);
* the co-run, both sides started together on the partitions of **one** split of the device
  (``NVMLDevice.run_parallel``; granted counts and disjointness recorded), each side repeated
  ``k`` times so that it runs about ``--branch-s`` alone;
* ⊕ of the alone signatures (``frontier.compose.par`` of each side's ``k``-fold sequence)
  against the measured co-run: deviation in T and E and the Eq. 23 verdict;

and one pair through ``measure.joint.characterize_pairs`` (the interaction-table path) to show
it runs on the GPU. ``--device sim`` runs the same on the simulated H200, so the two tables
can be set side by side. Writes JSON (``--out``) and prints a Markdown table.

    python experiments/corun_splits_real.py --out corun_splits.json          # GPU 0, ~1.5 min
    python experiments/corun_splits_real.py --device sim --out sim.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from gpu_validate import SimBackend, TorchBackend  # noqa: E402

SPLITS = ((64, 64), (96, 32), (112, 16), (120, 8))


def run(backend: Any, branch_s: float) -> dict[str, Any]:
    """Measure every split; return the JSON-ready result."""
    from frontier.compose import par, seq
    from frontier.deviation import deviation
    from measure import Protocol, characterize, measure_point, measure_ready_power_w, restoring
    from measure.joint import JointPair, characterize_pairs

    dev = backend.device
    proto = Protocol(window_s=0.6, target_rse=0.01, min_windows=3, max_windows=6)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with restoring(dev):
        ready = measure_ready_power_w(dev, proto)

        def alone(name: str, work: Any, sm: int) -> Any:
            res = characterize(work, device=dev, grid={"sm_count": [sm]}, protocol=proto,
                               name=name, progress=None, ready_power_w=ready)
            return res.signatures[0]

        for a_sm, b_sm in SPLITS:
            g = alone("gemm_bf16_8192", backend.gemm, a_sm)
            c = alone("copy_2GiB", backend.copy, b_sm)
            k1, k2 = max(1, round(branch_s / g.time_s)), max(1, round(branch_s / c.time_s))
            name = f"gemm@{a_sm} || copy@{b_sm}"
            work = backend.par_work([(backend.gemm, k1, a_sm), (backend.copy, k2, b_sm)])
            meas = measure_point(dev, work, name, proto, ready_w=ready)
            split = getattr(dev, "last_split", None)
            pred = par(seq([g] * k1), seq([c] * k2), sm_total=backend.sm_total, name=name)
            r = deviation(pred, meas, name=name)
            rows.append({"split": [a_sm, b_sm], "k": [k1, k2],
                         "partitions": split.to_dict() if split is not None else None,
                         "alone": {"gemm_time_s": g.time_s, "gemm_energy_j": g.energy_j,
                                   "copy_time_s": c.time_s, "copy_energy_j": c.energy_j},
                         "predicted": {"time_s": pred.time_s, "energy_j": pred.energy_j},
                         "measured": {"time_s": meas.time_s, "energy_j": meas.energy_j},
                         "deviation": r.to_dict()})
            print(f"  {r.summary()}", file=sys.stderr, flush=True)
        pair = JointPair("gemm_bf16_8192", backend.gemm, "copy_2GiB", backend.copy,
                         splits=((96, 32),))
        table = characterize_pairs(dev, [pair], protocol=proto, progress=None)
        joint = [{"key": e.key.label(), "time_s": e.signature.time_s,
                  "energy_j": e.signature.energy_j,
                  "partitions": e.signature.meta["joint"].get("partitions")}
                 for e in table.entries]
    return {"format": "energy-calculus/corun-splits", **dev.describe(), "ready_power_w": ready,
            "elapsed_real_s": time.monotonic() - t0, "branch_s": branch_s, "splits": rows,
            "joint_pair": joint, "date": time.strftime("%Y-%m-%d")}


def table(result: dict[str, Any]) -> str:
    """Markdown: one row per split."""
    lines = ["| co-run | granted | disjoint | ⊕ pred T / E | measured T / E | dev T / E (%) | Eq. 23 |",
             "|---|---|---|---|---|---|---|"]
    for r in result["splits"]:
        p, m, d = r["predicted"], r["measured"], r["deviation"]
        parts = r["partitions"]
        granted = "+".join(str(x["granted"]) for x in parts["partitions"]) if parts else "-"
        disjoint = ("yes" if parts["disjoint"] else "**no**") if parts else "-"
        lines.append(f"| gemm@{r['split'][0]} ∥ copy@{r['split'][1]} | {granted} | {disjoint} | "
                     f"{p['time_s'] * 1e3:.1f} ms / {p['energy_j']:.1f} J | "
                     f"{m['time_s'] * 1e3:.1f} ms / {m['energy_j']:.1f} J | "
                     f"{d['error_time_pct']:+.1f} / {d['error_energy_pct']:+.1f} | "
                     f"{'FLAGGED' if d['flagged'] else 'ok'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="nvml:0", help="nvml:INDEX or sim (default: nvml:0)")
    ap.add_argument("--branch-s", type=float, default=0.25,
                    help="how long each side runs alone per co-run, s (default: 0.25)")
    ap.add_argument("--out", type=Path, default=None, help="JSON to write (default: none)")
    args = ap.parse_args(argv)
    backend = SimBackend() if args.device == "sim" else TorchBackend(int(args.device.split(":")[1]))
    result = run(backend, args.branch_s)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(f"{result['device']}: ready power {result['ready_power_w']:.1f} W, "
          f"{result['elapsed_real_s']:.0f} s")
    print(table(result))
    print(f"joint pair (measure.joint on this device): {result['joint_pair']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
