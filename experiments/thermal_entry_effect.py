"""How much does the entry temperature move an element's energy and time? (issue 29)

The algebra can now carry the entry context (``frontier.context``: a first-order thermal model
per device, signatures at two or more entry temperatures, ⊗ that hands the exit temperature
on). Whether a planner should pay for it depends on the size of the effect against the ~1 %
to which energy is measured. This script measures it three ways:

1. **Simulated H200, ground truth.** The same work (0.5 s of invocations) entered at 35, 55 and 75 °C, at the
   default 700 W limit and at tight caps (a cap converts leakage into a lower clock): the change
   of E and T against the 35 °C entry.
2. **Fit of the thermal model from what a device reports.** Windows of work and idle at several
   powers, read as NVML would (temperature in whole °C, the 100 ms energy counter), fitted by
   ``frontier.context.fit_thermal``; the fitted R_th and τ against the simulator's own.
3. **Context-carrying ⊗ on held-out sequences.** Alternating GEMM and copy chunks under a 300 W
   cap, entered cold and hot: measured E against the null-context prediction and against
   ``seq_in_context`` with the fitted model and signatures characterized at 35 and 75 °C.
4. **The real H200 windows** (``../shared/data/h200``, when present): per element, the entry
   temperatures its windows saw and the window-to-window spread of E, to say whether an entry
   effect of the simulated size could be resolved there at all.

    python experiments/thermal_entry_effect.py      # writes experiments/results/thermal_entry_effect.md
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, doc_body, markdown_table, shared_data_dir, write_text_atomic  # noqa: E402

from frontier.context import (  # noqa: E402
    ContextualSignature,
    ThermalObservation,
    fit_thermal,
    seq_in_context,
)
from frontier.signature import Signature  # noqa: E402
from measure.sim import SimulatedGPU, preset  # noqa: E402

ENTRIES_C = (35.0, 55.0, 75.0)
READING = """\
On the simulated H200 the entry temperature moves one element's energy by 0.1–2.2 % over a
40 °C difference, most under a tight cap (leakage turned into a lower clock). In sequences whose
elements heat and cool the die in turn, the error of the null-context prediction stays below
1 %, and carrying the context with a model fitted from NVML-like readings (whole °C, 2 s
windows: R_th and τ come out 20–25 % low) does not beat it beyond that floor. The real H200
windows on record are naive windows with 2–9 % spread of mean power, so an entry effect of
this size cannot be resolved in them. Energy is measured to about 1 %: the context-carrying
algebra is built and tested (``frontier.context``), and planning with it waits for a device or
workload where the effect exceeds that floor (long hot phases under tight caps, air-cooled
cards), measured with tick-aligned windows and entry temperatures held apart on purpose.
"""
CAPS_W = (700.0, 450.0, 300.0)


def _gpu(cap_w: float, entry_c: float, seed: int = 0) -> SimulatedGPU:
    g = SimulatedGPU(seed=seed, start_temperature_c=entry_c)
    g.set_operating_point(g.operating_set().default.with_(power_limit_w=cap_w))
    return g


def _invocations(kernel: str, cap_w: float, duration_s: float) -> int:
    """How many invocations of ``kernel`` take about ``duration_s`` at ``cap_w`` (35 °C entry):
    the same count is then run from every entry, so E and T compare like for like."""
    g = _gpu(cap_w, 35.0)
    t0 = g.time_s()
    g.run(preset(kernel), 1)
    return max(1, round(duration_s / (g.time_s() - t0)))


def _chunk(g: SimulatedGPU, kernel: str, n: int) -> tuple[float, float]:
    """Run ``n`` invocations of ``kernel``; (time_s, true energy_j) of that run."""
    t0, e0 = g.time_s(), g.true_energy_j()
    g.run(preset(kernel), n)
    return g.time_s() - t0, g.true_energy_j() - e0


def entry_effect_rows() -> list[list[str]]:
    """Part 1: ΔE and ΔT of 0.5 s of work against its 35 °C entry, per cap and kernel."""
    rows = []
    for kernel in ("gemm_bf16_8192", "copy_2GiB"):
        for cap in CAPS_W:
            base = None
            cells = []
            n = _invocations(kernel, cap, 0.5)
            for entry in ENTRIES_C:
                t, e = _chunk(_gpu(cap, entry), kernel, n)
                base = base or (t, e)
                cells.append(f"{100 * (e / base[1] - 1):+.2f} / {100 * (t / base[0] - 1):+.2f}")
            rows.append([kernel, f"{cap:.0f}", *cells[1:]])
    return rows


def probe_observations(seed: int = 0) -> list[ThermalObservation]:
    """Part 2: 1 s windows of work and idle at several powers, read as NVML reports them."""
    g = _gpu(700.0, 40.0, seed)
    obs = []
    plan = [("gemm_bf16_8192", 700.0), (None, 0), ("copy_2GiB", 700.0), ("gemm_bf16_8192", 400.0),
            (None, 0), ("gemm_bf16_8192", 700.0), ("gemm_bf16_4096", 300.0), (None, 0)] * 3
    for kernel, cap in plan:
        if cap:
            g.set_operating_point(g.operating_set().default.with_(power_limit_w=cap))
        entry, t0, e0 = g.temperature_c(), g.time_s(), g.energy_j()
        if kernel is None:
            g.idle(2.0)
        else:
            _chunk(g, kernel, _invocations(kernel, cap, 2.0))
        dt, de = g.time_s() - t0, g.energy_j() - e0
        obs.append(ThermalObservation(entry, dt, de / dt, g.temperature_c()))
    return obs


def _signature_at(kernel: str, cap_w: float, entry_c: float, chunk_s: float) -> Signature:
    """A chunk's signature measured from ``entry_c`` (ground truth of one run)."""
    g = _gpu(cap_w, entry_c)
    s = g.static_power_w(temperature_c=entry_c)
    t, e = _chunk(g, kernel, _invocations(kernel, cap_w, chunk_s))
    return Signature(f"{kernel}@{entry_c:.0f}C", s_w=s, time_s=t, d_j=e - s * t)


def sequence_rows(mech, chunk_s: float = 1.0, cap_w: float = 300.0) -> list[list[str]]:
    """Part 3: alternating GEMM/copy chunks, entered cold and hot; measured vs predicted E."""
    kernels = ("gemm_bf16_8192", "copy_2GiB")
    cs = {k: ContextualSignature(k, {35.0: _signature_at(k, cap_w, 35.0, chunk_s),
                                     75.0: _signature_at(k, cap_w, 75.0, chunk_s)})
          for k in kernels}
    rows = []
    for entry in (35.0, 75.0):
        g = _gpu(cap_w, entry)
        n = {k: _invocations(k, cap_w, chunk_s) for k in kernels}
        e_meas = sum(_chunk(g, kernels[i % 2], n[kernels[i % 2]])[1] for i in range(8))
        seq_elems = [cs[kernels[i % 2]] for i in range(8)]
        null = seq_in_context(seq_elems, mechanism=None).signature.energy_j
        ctx = seq_in_context(seq_elems, entry_c=entry, mechanism=mech).signature.energy_j
        rows.append([f"{entry:.0f}", f"{e_meas:.1f}", f"{100 * (null / e_meas - 1):+.2f}",
                     f"{100 * (ctx / e_meas - 1):+.2f}"])
    return rows


def real_rows() -> list[list[str]]:
    """Part 4: the real H200 windows' entry temperatures and E spread, per element."""
    path = shared_data_dir() / "h200" / "measurements.json"
    if not path.exists():
        return []
    rows = []
    for el in json.loads(path.read_text())["elements"]:
        ws = [w for w in el.get("windows", []) if "temp0_C" in w and "E_J" in w]
        if len(ws) < 3:
            continue
        temp = np.array([w["temp0_C"] for w in ws], float)
        e = np.array([w["E_J"] / w["T_s"] for w in ws], float)      # power, W: windows differ in length
        spread = 100 * e.std(ddof=1) / e.mean()
        rows.append([el["name"], f"{temp.min():.0f}–{temp.max():.0f}", f"{spread:.1f}"])
    return rows


def main() -> None:
    eff = entry_effect_rows()
    obs = probe_observations()
    mech = fit_thermal(obs)
    sim = SimulatedGPU().spec
    seqs = sequence_rows(mech)
    real = real_rows()
    parts = [
        "# Thermal entry effect\n", doc_body(__doc__) + "\n",
        "Command: `python experiments/thermal_entry_effect.py` (simulated H200; seeds fixed).\n",
        "## 1. ΔE / ΔT (%) of 0.5 s of work against its 35 °C entry (simulator ground truth)\n",
        markdown_table(["kernel", "cap W", "entry 55 °C", "entry 75 °C"], eff),
        "## 2. Thermal model fitted from NVML-like readings\n",
        markdown_table(["", "R_th °C/W", "τ s", "ambient °C"],
                       [["simulator", f"{sim.thermal_r_c_per_w:.4f}", f"{sim.thermal_tau_s:.2f}",
                         f"{sim.ambient_c:.1f}"],
                        ["fitted (24 windows)", f"{mech.r_th_c_per_w:.4f}", f"{mech.tau_s:.2f}",
                         f"{mech.ambient_c:.1f}"]]),
        "## 3. Eight alternating 1 s GEMM/copy chunks at 300 W: prediction error of E (%)\n",
        markdown_table(["entry °C", "measured E J", "null context", "context carried"], seqs),
    ]
    if real:
        parts += ["## 4. Real H200 windows: entry temperatures seen and spread of mean power\n",
                  markdown_table(["element", "entry °C", "window spread of P, %"], real)]
    parts += ["## Reading\n", READING]
    out = RESULTS_DIR / "thermal_entry_effect.md"
    write_text_atomic(out, "\n".join(parts))
    print("\n".join(parts))
    print(f"wrote {out}")
    assert math.isfinite(mech.tau_s)


if __name__ == "__main__":
    main()
