"""Ready power calibrated once per (device, ω_dev) in a campaign: the device time it saves.

A campaign characterizes several elements (here the four elements of a pipeline stage's step on
the simulated H200: forward, backward, its GEMM and a 2 GiB copy) over the same grid on one
device. Ready (static) power belongs to the device at an ω_dev, not to the element; before
``measure.ReadyPowerCache`` each element's sweep calibrated it again at every ω_dev (three
tick-aligned 1 s idle windows each, about 3.2 s of device time). With the cache, the first
element's calibration serves the others.

The table gives the device seconds of the whole campaign (virtual time on the simulator: what a
real GPU would be busy for) without and with reuse, for the default grid of ``ecal
characterize`` and for a small three-clock grid, under the default protocol. Every signature is
checked to be identical between the two runs (on the simulator a calibration depends only on
the seed and the ω_dev, so reuse changes nothing but the time).

    python experiments/bench_ready_power.py            # prints the table, writes results/
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from _common import (  # noqa: E402
    RESULTS_DIR,
    console_table,
    doc_body,
    markdown_table,
    write_json,
    write_text_atomic,
)

from measure import Protocol, ReadyPowerCache, SimulatedGPU, characterize, default_grid, preset  # noqa: E402

ELEMENTS = ("stage_forward", "stage_backward", "gemm_bf16_8192", "copy_2GiB")
SMALL_GRID = "sm_clock_mhz=1980,1620,1260,power_limit_w=700"


def campaign(grid: str, reuse: bool, seed: int = 0) -> dict:
    """Characterize :data:`ELEMENTS` on one simulated H200; device seconds and calibrations."""
    dev = SimulatedGPU(seed=seed)
    shared = ReadyPowerCache()
    t0 = dev.time_s()
    sigs, calib_s, calibrations = [], 0.0, 0
    for name in ELEMENTS:
        cache = shared if reuse else ReadyPowerCache()     # a fresh cache = calibrate again
        before_s, before_n = cache.calibration_time_s, cache.calibrations
        res = characterize(preset(name), device=dev, grid=grid, protocol=Protocol(),
                           progress=None, ready_cache=cache)
        calib_s += cache.calibration_time_s - before_s
        calibrations += cache.calibrations - before_n
        sigs.append([(s.time_s, s.energy_j, s.var_time_s2, s.var_energy_j2) for s in res.signatures])
    return {"device_s": dev.time_s() - t0, "calibration_s": calib_s,
            "calibrations": calibrations, "signatures": sigs}


def main() -> int:
    """Run both grids with and without reuse; print and write the table."""
    grids = {"default (ecal characterize)": default_grid(SimulatedGPU().operating_set()).label(),
             "small (3 clocks)": SMALL_GRID}
    rows, doc = [], {"elements": list(ELEMENTS), "grids": {}}
    for label, grid in grids.items():
        off, on = campaign(grid, reuse=False), campaign(grid, reuse=True)
        if off["signatures"] != on["signatures"]:
            raise SystemExit(f"{label}: reuse changed a signature (it must not on the simulator)")
        n_dev = on["calibrations"]
        saved = 1 - on["device_s"] / off["device_s"]
        rows.append([label, n_dev, f"{off['device_s']:.1f}", f"{off['calibration_s']:.1f}",
                     f"{off['calibration_s'] / off['device_s']:.0%}", off["calibrations"],
                     f"{on['device_s']:.1f}", on["calibrations"], f"{saved:.0%}",
                     f"{off['device_s'] / on['device_s']:.2f}x"])
        doc["grids"][label] = {"grid": grid, "omega_dev": n_dev,
                               "without_reuse": {k: off[k] for k in ("device_s", "calibration_s", "calibrations")},
                               "with_reuse": {k: on[k] for k in ("device_s", "calibration_s", "calibrations")},
                               "device_time_saved": saved}
    head = ["grid", "ω_dev", "device s (no reuse)", "of it calibrating", "share", "calibrations",
            "device s (reuse)", "calibrations", "saved", "speed-up"]
    print(f"campaign of {len(ELEMENTS)} elements on the simulated H200, default protocol\n")
    print(console_table(head, rows))
    RESULTS_DIR.mkdir(exist_ok=True)
    write_json(RESULTS_DIR / "bench_ready_power.json", doc)
    write_text_atomic(RESULTS_DIR / "bench_ready_power.md",
                      "# Ready power reused across a campaign\n\n" + doc_body(__doc__) + "\n\n"
                      + f"Elements: {', '.join(ELEMENTS)}.\n\n" + markdown_table(head, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
