"""How well the simulated H200's co-run model reproduces the real H200 composites.

    python experiments/sim_corun_calibration.py [--data PATH] [--seed 0] [--out experiments/results]
                                                 [--no-fit]

For each of the four composites in ``data/h200/measurements.json`` (two same-device parallel
runs, two sequences) it measures, with the project's protocol (``measure.measure_point`` on a
``SimulatedGPU``, each point from the null context):

* the simulator's composite (parallel: one ``run_parallel`` call with the parts as streams, no
  SM partition, like two CUDA streams; sequential: the parts in turn on one stream),
* the simulator's ⊕ / ⊗ prediction from its elements measured alone,

and puts them next to the real composite and the real prediction from the real elements
(``frontier.h200``). Deviation = measured / predicted − 1. A row agrees in *direction* when both
deviations have the same sign and in *size* when they are within a factor 1.5 of each other
(deviations under 2 % on both sides agree: that is the real windows' spread).

The one co-run parameter fitted to data, ``SimSpec.corun_l2_interference``, is re-fitted here
(bisection on the GEMM ∥ axpy@4SM time deviation; unless ``--no-fit``) and printed next to the
value the simulator uses; the GEMM ∥ copy row is not fitted (it checks the model).

Writes ``sim_corun_calibration.md`` (the table) and ``sim_corun_calibration.json`` to the
output folder, atomically.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from frontier.errors import EnergyCalculusError
from frontier.h200 import load_measurements
from frontier.io import write_json_atomic
from measure.calibration import (
    COMPOSITES,
    compare_composites_to_h200,
    corun_table,
    simulate_composites,
)
from measure.replay import H200_MEASUREMENTS, shared_data_dir
from measure.sim import H200, with_spec

OUT_DEFAULT = Path(__file__).resolve().parent / "results"
FIT_COMPOSITE = "par_gemm8192_axpy_sm4"
SIZE_FACTOR = 1.5


def sim_time_deviation_pct(alpha: float, seed: int = 0) -> float:
    """The simulator's GEMM ∥ axpy@4SM time deviation from its ⊕ prediction (%) at
    ``corun_l2_interference = alpha``."""
    r = simulate_composites(seed, spec=with_spec(corun_l2_interference=alpha), only=(FIT_COMPOSITE,))
    c = r["composites"][FIT_COMPOSITE]
    return 100.0 * (c["measured"].time_s / c["predicted"].time_s - 1.0)


def fit_l2_interference(target_pct: float, seed: int = 0, lo: float = 0.0, hi: float = 10.0,
                        iters: int = 14) -> float:
    """``corun_l2_interference`` at which the simulated GEMM ∥ axpy@4SM deviates from ⊕ by
    ``target_pct`` (bisection; the deviation grows with the parameter)."""
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if sim_time_deviation_pct(mid, seed) < target_pct:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _markdown(rows: list[dict[str, Any]], fitted: float | None, data: Path, seed: int) -> str:
    head = [
        "# Simulated H200 co-runs against the real H200 composites",
        "",
        f"Real: `{data}` (NVML energy counter, naive windows). Simulator: `measure.sim.SimulatedGPU` "
        f"(seed {seed}), measured with the project's tick-aligned protocol. Predictions: ⊕ (parallel) "
        "or ⊗ (sequential) of the elements measured alone, on each side. Deviation = measured / "
        f"predicted − 1. Size agrees when the two deviations are within a factor {SIZE_FACTOR:g} "
        "(or both under 2 %).",
        "",
        f"`corun_l2_interference` in use: {H200.corun_l2_interference:g}"
        + (f"; re-fitted to {FIT_COMPOSITE} time: {fitted:.3g}" if fitted is not None else ""),
        "",
    ]
    return "\n".join(head) + corun_table(rows, SIZE_FACTOR) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=shared_data_dir() / H200_MEASUREMENTS,
                    help="measurements.json (default: ../shared/data/h200/measurements.json)")
    ap.add_argument("--seed", type=int, default=0, help="simulator seed")
    ap.add_argument("--out", type=Path, default=OUT_DEFAULT, help="output folder")
    ap.add_argument("--no-fit", action="store_true", help="skip re-fitting the interference")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"sim_corun_calibration: {args.data}: no such file (the shared data folder is absent; "
              "pass --data or set ECAL_SHARED_DATA)", file=sys.stderr)
        return 2
    try:
        data = load_measurements(args.data)
        rows = compare_composites_to_h200(data, seed=args.seed, size_factor=SIZE_FACTOR)
    except EnergyCalculusError as exc:
        print(f"sim_corun_calibration: error: {exc}", file=sys.stderr)
        return 2
    fitted = None
    if not args.no_fit:
        target = next(r["real_dev_time_pct"] for r in rows if r["composite"] == FIT_COMPOSITE)
        fitted = fit_l2_interference(target, args.seed)
    md = _markdown(rows, fitted, args.data, args.seed)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    out_md = args.out / "sim_corun_calibration.md"
    tmp = out_md.with_name(out_md.name + ".tmp")
    tmp.write_text(md, encoding="utf-8")
    tmp.replace(out_md)
    out_json = args.out / "sim_corun_calibration.json"
    write_json_atomic(out_json, {
        "about": "simulated H200 co-runs and sequences against the real H200 composites",
        "data": str(args.data), "seed": args.seed, "size_factor": SIZE_FACTOR,
        "composites": [c[0] for c in COMPOSITES],
        "corun_l2_interference": {"in_use": H200.corun_l2_interference, "refitted": fitted,
                                  "fitted_to": f"{FIT_COMPOSITE} time deviation"},
        "units": {"time": "s", "energy": "J"}, "rows": rows,
    })
    print(f"wrote {out_md} and {out_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
