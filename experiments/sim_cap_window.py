"""The power cap as a time average: ``SimSpec.cap_window_s`` fitted to the real H200, and checked.

    python experiments/sim_cap_window.py [--thermal PATH] [--data PATH] [--selftest PATH ...]
                                          [--out experiments/results]

The H200's firmware limits a time average of board power, not the power at every instant: a
capped GEMM started after idle averages well above the 700 W limit over its first tenths of a
second, and only windows of seconds sit at the limit. The simulator models this with an
exponential moving average of board power (time constant ``cap_window_s``) that the clock is
lowered to keep under the limit (``measure.sim``).

**Fit** (the only data the parameter sees): the two GEMM entries after idle in the read-only
thermal probe (``experiments/results/thermal_real_h200.json``, phases 1 and 5: energy-counter
ticks every ~100 ms). For each window ``[0, w]`` after the GEMM starts (w = 0.1 … 10 s) the
average power relative to that phase's steady power (its last 10 s) is compared with the
simulator's (idle 15 s, then the GEMM; true energy), and ``cap_window_s`` is the grid value with
the least squared error.

**Checks** (held out, nothing fitted to them):

* the probe's third entry, the GEMM/copy alternation (phase 7, ``mix``): its windows after idle,
  and its steady clock against the GEMM's alone (real: about 1700 vs 1470 MHz);
* ``data/h200``'s protocol comparison: the 8192 GEMM in 0.6 s tick-aligned windows against 3 s
  naive windows (short windows with idle between them average above the limit);
* the selftest's sequential composite on the H200 (``selftest_h200*.json``): a 4096 GEMM then
  a 256 MiB copy, one invocation each in turn, against ⊗ of the two measured alone (real:
  T −4.8 %, E +1.6 to +2.3 %).

Writes ``sim_cap_window.md`` and ``sim_cap_window.json`` to the output folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import write_json, write_text_atomic  # noqa: E402

from frontier.compose import seq  # noqa: E402
from measure.protocol import Protocol, measure_point, measure_ready_power_w  # noqa: E402
from measure.replay import H200_MEASUREMENTS, shared_data_dir  # noqa: E402
from measure.sim import H200, SimKernel, SimSpec, SimulatedGPU, preset, with_spec  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
THERMAL = RESULTS / "thermal_real_h200.json"
SELFTESTS = (RESULTS / "selftest_h200.json", RESULTS / "selftest_h200_run2.json")
WINDOWS_S = (0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
FIT_PHASES = (1, 5)
CHECK_PHASE = 7
GRID_S = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3, 0.5)
#: The selftest's real pair (measure.selftest.torch_works): bf16 4096 GEMM, 256 MiB copy.
COPY_256MIB = SimKernel("copy_256MiB", bytes=2 * 2**28, activity=0.0, kappa="torch copy_",
                        theta="copy of 256 MiB")


def real_entry_windows(ticks: list[dict[str, Any]], phase: int) -> dict[str, Any]:
    """Average power over ``[0, w]`` after phase ``phase`` starts, relative to its steady power
    (its last 10 s). The start is placed by the invocations done in the first tick at the
    phase's mean rate; the counter is interpolated linearly between ticks."""
    t = np.array([x["t_s"] for x in ticks])
    e = np.array([x["energy_mj"] for x in ticks]) / 1e3
    idx = [i for i, x in enumerate(ticks) if x["phase"] == phase]
    i0 = idx[0]
    rate = float(np.mean([ticks[i]["done"] for i in idx[5:50]])) / 0.1
    start = t[i0] - ticks[i0]["done"] / rate
    end = t[idx[-1]]
    steady = float((np.interp(end, t, e) - np.interp(end - 10, t, e)) / 10)
    avg = [float((np.interp(start + w, t, e) - np.interp(start, t, e)) / w) for w in WINDOWS_S]
    clocks = [ticks[i]["sm_mhz"] for i in idx if t[i] > end - 10]
    return {"phase": phase, "kind": ticks[i0]["kind"], "steady_w": steady,
            "avg_w": avg, "rel": [a / steady for a in avg], "clock_mhz": float(np.median(clocks))}


def sim_entry_windows(spec: SimSpec, work: list[SimKernel], seed: int = 0) -> dict[str, Any]:
    """The simulator's counterpart: idle 15 s, then ``work`` (one invocation of each kernel in
    turn) for 10 s; average power over ``[0, w]`` (true energy), relative to the last 10 s… of a
    20 s run (its steady power)."""
    gpu = SimulatedGPU(seed=seed, spec=spec)
    gpu.seed_point("cap-window")
    gpu.idle(15.0)
    t0, e0 = gpu.time_s(), gpu.true_energy_j()
    piece = max(1, int(0.004 / sum(gpu.kernel_state(k).time_s for k in work)))
    marks = [*WINDOWS_S, 20.0]
    avg: list[float] = []
    e_at: dict[float, float] = {}
    clocks: list[float] = []
    for w in marks:
        while gpu.time_s() - t0 < w:
            if w > 10:   # steady part: the first kernel's clock (the GEMM's, read while it runs)
                for _ in range(piece):
                    clocks.append(gpu.run_and_read(work[0], 1).sm_clock_mhz)
                    if len(work) > 1:
                        gpu.run(work[1:], 1)
            else:
                gpu.run(work if len(work) > 1 else work[0], n=piece)
        e_at[w] = gpu.true_energy_j() - e0
        avg.append(e_at[w] / (gpu.time_s() - t0))
    steady = (e_at[20.0] - e_at[10.0]) / 10.0
    return {"steady_w": steady, "avg_w": avg[:-1], "rel": [a / steady for a in avg[:-1]],
            "clock_mhz": float(np.median(clocks)) if clocks else float("nan")}


def fit_cap_window(real: list[dict[str, Any]], gemm: SimKernel) -> tuple[float, list[float]]:
    """The grid value of ``cap_window_s`` with the least squared error of the relative window
    powers over the fitted entries, and the error at each grid value."""
    errs = []
    for tau in GRID_S:
        sim = sim_entry_windows(with_spec(cap_window_s=tau), [gemm])
        errs.append(sum(sum((s - r) ** 2 for s, r in zip(sim["rel"], ph["rel"])) for ph in real))
    return GRID_S[int(np.argmin(errs))], errs


def sim_protocol_windows(spec: SimSpec, seed: int = 0) -> dict[str, float]:
    """The 8192 GEMM on the simulator, 0.6 s tick-aligned windows and 3 s windows (power, W)."""
    gpu = SimulatedGPU(seed=seed, spec=spec)
    gpu.seed_point("ready")
    ready = measure_ready_power_w(gpu)
    out = {}
    for name, proto in (("aligned_0.6s", Protocol(window_s=0.6)),
                        ("aligned_3s", Protocol(window_s=3.0, min_windows=3, max_windows=3))):
        gpu.seed_point(name)
        sig = measure_point(gpu, preset("gemm_bf16_8192"), name, proto, ready_w=ready)
        out[name] = sig.energy_j / sig.time_s
    return out


def sim_sequential(spec: SimSpec, seed: int = 0) -> dict[str, float]:
    """The selftest's sequential composite on the simulator (selftest protocol): 4096 GEMM then
    256 MiB copy in turn against ⊗ of each measured alone; deviations (%)."""
    proto = Protocol(window_s=0.6, warmup_s=0.2, target_rse=0.01, min_windows=3, max_windows=6)
    gpu = SimulatedGPU(seed=seed, spec=spec)
    gpu.seed_point("ready")
    ready = measure_ready_power_w(gpu, proto)
    g, c = preset("gemm_bf16_4096"), COPY_256MIB
    pts = []
    for name, work in (("gemm", g), ("copy", c), ("gemm;copy", [g, c])):
        gpu.seed_point(name)
        pts.append(measure_point(gpu, work, name, proto, ready_w=ready))
    pred = seq(pts[0], pts[1], name="gemm;copy")
    return {"dev_time_pct": 100 * (pts[2].time_s / pred.time_s - 1),
            "dev_energy_pct": 100 * (pts[2].energy_j / pred.energy_j - 1)}


def real_sequential(paths: tuple[Path, ...]) -> list[dict[str, float]]:
    """The selftest's sequential composite deviations (%) in the real reports found."""
    out = []
    for p in paths:
        if not p.exists():
            continue
        for chk in json.loads(p.read_text(encoding="utf-8"))["checks"]:
            if chk["name"] == "sequential_composite" and "deviation" in chk.get("data", {}):
                d = chk["data"]["deviation"]
                out.append({"file": p.name, "dev_time_pct": d["error_time_pct"],
                            "dev_energy_pct": d["error_energy_pct"]})
    return out


def run(thermal: Path, data: Path | None, selftests: tuple[Path, ...]) -> dict[str, Any]:
    """Fit and checks; a JSON-ready dict."""
    ticks = json.loads(thermal.read_text(encoding="utf-8"))["ticks"]
    gemm = preset("gemm_bf16_8192")
    fit_real = [real_entry_windows(ticks, p) for p in FIT_PHASES]
    tau, errs = fit_cap_window(fit_real, gemm)
    fitted = with_spec(cap_window_s=tau)
    old = with_spec(cap_window_s=0.0)
    mix_real = real_entry_windows(ticks, CHECK_PHASE)
    gemm_alone_clock = float(np.median([x["sm_mhz"] for x in ticks if x["phase"] in FIT_PHASES]))
    res: dict[str, Any] = {
        "about": "the power cap as a time average: cap_window_s fitted and checked on the real H200",
        "thermal": str(thermal), "windows_s": list(WINDOWS_S), "in_use": H200.cap_window_s,
        "fitted": tau, "grid_s": list(GRID_S), "grid_sq_err": errs,
        "fit": {"real": fit_real, "sim": sim_entry_windows(fitted, [gemm]),
                "sim_instantaneous": sim_entry_windows(old, [gemm])},
        "check_mix": {"real": mix_real, "real_gemm_alone_clock_mhz": gemm_alone_clock,
                      "sim": sim_entry_windows(fitted, [gemm, preset("copy_2GiB")]),
                      "sim_gemm_alone_clock_mhz": SimulatedGPU(spec=fitted).kernel_state(
                          gemm, temperature_c=60).sm_clock_mhz,
                      "sim_instantaneous": sim_entry_windows(old, [gemm, preset("copy_2GiB")])},
        "check_sequential": {"real": real_sequential(selftests), "sim": sim_sequential(fitted),
                             "sim_instantaneous": sim_sequential(old)},
    }
    if data is not None and data.exists():
        comp = json.loads(data.read_text(encoding="utf-8"))["protocol_comparison"]
        real_w = {k.split("/")[1]: v["E_J"] / v["T_s"] for k, v in comp.items()
                  if k.startswith("gemm_bf16_8192/")}
        res["check_protocol_windows"] = {"real_w": real_w, "sim_w": sim_protocol_windows(fitted),
                                         "sim_instantaneous_w": sim_protocol_windows(old)}
    return res


def markdown(r: dict[str, Any]) -> str:
    """The report."""
    ws = r["windows_s"]
    head = "| window after start | " + " | ".join(f"{w:g} s" for w in ws) + " |"
    sep = "|---" * (len(ws) + 1) + "|"

    def row(label: str, rel: list[float]) -> str:
        return f"| {label} | " + " | ".join(f"{100 * (x - 1):+.1f}" for x in rel) + " |"

    fit, mix = r["fit"], r["check_mix"]
    lines = [
        "# The power cap as a time average (simulator parameter `cap_window_s`)", "",
        "Generated by `python experiments/sim_cap_window.py`. Real: the read-only thermal probe on "
        f"an H200 (`{Path(r['thermal']).name}`, energy-counter ticks). Simulator: `measure.sim` "
        "with the firmware's cap on an exponential moving average of board power.", "",
        f"**Fitted**: `cap_window_s` = {r['fitted']:g} s (grid {', '.join(f'{g:g}' for g in r['grid_s'])}; "
        f"least squares over the windows below, GEMM entries after idle, phases "
        f"{', '.join(str(p['phase']) for p in fit['real'])}). In use: {r['in_use']:g} s.", "",
        "Average power over [0, w] after the work starts, % above its steady power:", "",
        head, sep,
        *[row(f"real GEMM entry, phase {p['phase']} (steady {p['steady_w']:.0f} W)", p["rel"])
          for p in fit["real"]],
        row(f"sim GEMM, cap_window_s = {r['fitted']:g} s (fitted)", fit["sim"]["rel"]),
        row("sim GEMM, cap_window_s = 0 (instantaneous)", fit["sim_instantaneous"]["rel"]),
        "", "**Checked on held-out data** (nothing fitted to these):", "",
        head, sep,
        row(f"real GEMM/copy alternation, phase {mix['real']['phase']}", mix["real"]["rel"]),
        row("sim GEMM/copy alternation (fitted window)", mix["sim"]["rel"]),
        row("sim GEMM/copy alternation, instantaneous cap", mix["sim_instantaneous"]["rel"]),
        "",
        "| check | real | sim, fitted window | sim, instantaneous cap |", "|---|---|---|---|",
        f"| steady SM clock, GEMM/copy alternation vs GEMM alone (MHz) | {mix['real']['clock_mhz']:.0f} vs "
        f"{mix['real_gemm_alone_clock_mhz']:.0f} | {mix['sim']['clock_mhz']:.0f} vs "
        f"{mix['sim_gemm_alone_clock_mhz']:.0f} | {mix['sim_instantaneous']['clock_mhz']:.0f} vs "
        f"{mix['sim_gemm_alone_clock_mhz']:.0f} |",
    ]
    seqc = r["check_sequential"]
    real_seq = "; ".join(f"{x['dev_time_pct']:+.1f} / {x['dev_energy_pct']:+.1f}" for x in seqc["real"]) or "absent"
    lines.append(f"| GEMM 4096 ; copy 256 MiB in turn vs ⊗, dev T / E (%) | {real_seq} | "
                 f"{seqc['sim']['dev_time_pct']:+.1f} / {seqc['sim']['dev_energy_pct']:+.1f} | "
                 f"{seqc['sim_instantaneous']['dev_time_pct']:+.1f} / "
                 f"{seqc['sim_instantaneous']['dev_energy_pct']:+.1f} |")
    pw = r.get("check_protocol_windows")
    if pw:
        lines.append(f"| GEMM 8192 board power, 0.6 s tick-aligned windows vs 3 s windows (W) | "
                     f"{pw['real_w'].get('aligned_0.6s', float('nan')):.0f} vs "
                     f"{pw['real_w'].get('naive_3s', float('nan')):.0f} (naive) | "
                     f"{pw['sim_w']['aligned_0.6s']:.0f} vs {pw['sim_w']['aligned_3s']:.0f} | "
                     f"{pw['sim_instantaneous_w']['aligned_0.6s']:.0f} vs "
                     f"{pw['sim_instantaneous_w']['aligned_3s']:.0f} |")
    lines += ["", "Not modelled: the real controller's undershoot about 0.9 s after the start "
              "(the real excess peaks near 0.8 s and is partly paid back); the clock the "
              "simulator sets per 50 ms chunk (per invocation in an alternation), where the "
              "card holds one clock for the board."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thermal", type=Path, default=THERMAL, help="the thermal probe's ticks")
    ap.add_argument("--data", type=Path, default=shared_data_dir() / H200_MEASUREMENTS,
                    help="measurements.json (protocol comparison; skipped when absent)")
    ap.add_argument("--selftest", type=Path, nargs="*", default=list(SELFTESTS),
                    help="real selftest reports (sequential composite)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="output folder")
    args = ap.parse_args(argv)
    if not args.thermal.exists():
        print(f"sim_cap_window: {args.thermal}: no such file", file=sys.stderr)
        return 2
    r = run(args.thermal, args.data, tuple(args.selftest))
    md = markdown(r)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "sim_cap_window.md", md)
    write_json(args.out / "sim_cap_window.json", r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
