"""How closely the simulated H200 reproduces the measured H200 elements (``data/h200``).

Each element is measured on the simulator with the default protocol at the default operating
point (green-context GEMMs at their SM allocation) and compared with the real windows' mean and
spread. Used by the tests and for the README's calibration table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .protocol import Protocol, measure_point, measure_ready_power_w
from .sim import PRESETS, SimulatedGPU


def _kernel_for(el: Mapping[str, Any]) -> tuple[Any, int | None]:
    name = el["name"]
    if name.startswith("gemm_bf16_8192_green"):
        return PRESETS["gemm_bf16_8192"], int(el["omega"]["sm_alloc"])
    return PRESETS[name], None


def compare_to_h200(data: Mapping[str, Any] | None = None, seed: int = 0,
                    gap_s: float = 5.0) -> list[dict[str, Any]]:
    """Rows ``{element, sim_time_s, h200_time_s, sim_energy_j, h200_energy_j, h200_energy_sd_j,
    time_err_pct, energy_err_pct, energy_err_in_sd}`` plus a first row for ready power."""
    if data is None:
        from frontier.h200 import load_measurements

        data = load_measurements()
    gpu = SimulatedGPU(seed=seed)
    ready_data = data["static_power_W"]["ready_idle_context_alive_1980MHz"]
    ready_sim = measure_ready_power_w(gpu)
    rows: list[dict[str, Any]] = [{
        "element": "ready power (W)", "sim_time_s": None, "h200_time_s": None,
        "sim_energy_j": ready_sim, "h200_energy_j": sum(ready_data) / len(ready_data),
        "h200_energy_sd_j": None, "time_err_pct": None,
        "energy_err_pct": 100 * (ready_sim / (sum(ready_data) / len(ready_data)) - 1), "energy_err_in_sd": None}]
    for el in data["elements"]:
        k, sm = _kernel_for(el)
        sig = measure_point(gpu, k, el["name"], Protocol(), ready_w=ready_sim, sm_count=sm)
        sd = float(el["E_sd_J"])
        rows.append({
            "element": el["name"], "sim_time_s": sig.time_s, "h200_time_s": float(el["T_s"]),
            "sim_energy_j": sig.energy_j, "h200_energy_j": float(el["E_J"]), "h200_energy_sd_j": sd,
            "time_err_pct": 100 * (sig.time_s / el["T_s"] - 1),
            "energy_err_pct": 100 * (sig.energy_j / el["E_J"] - 1),
            "energy_err_in_sd": (sig.energy_j - el["E_J"]) / sd if sd > 0 else None,
        })
        gpu.idle(gap_s)
    return rows


def calibration_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of :func:`compare_to_h200` rows."""
    out = ["| element | T sim (ms) | T H200 (ms) | ΔT (%) | E sim (J) | E H200 (J) ± sd | ΔE (%) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["sim_time_s"] is None:
            out.append(f"| {r['element']} | | | | {r['sim_energy_j']:.1f} | {r['h200_energy_j']:.1f} | "
                       f"{r['energy_err_pct']:+.1f} |")
            continue
        out.append(f"| {r['element']} | {r['sim_time_s'] * 1e3:.4g} | {r['h200_time_s'] * 1e3:.4g} | "
                   f"{r['time_err_pct']:+.1f} | {r['sim_energy_j']:.4g} | {r['h200_energy_j']:.4g} ± "
                   f"{r['h200_energy_sd_j']:.2g} | {r['energy_err_pct']:+.1f} |")
    return "\n".join(out)
