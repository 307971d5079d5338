"""The thermal mechanism on a real GPU: is a first-order RC model right on held-out data, and
how much does the entry temperature move a capped GEMM's time and energy?

Issue 29 puts the entry context into the algebra with a thermal mechanism
(:class:`frontier.context.ThermalMechanism`). On the simulator the mechanism is known; this
script asks the real card, read-only (no clock lock, no power limit: the card runs at its own
settings), in two parts:

``--measure`` (on the GPU, about 2 minutes): a schedule of phases, each a stretch of one kind
of work, sampled at every update of the NVML energy counter (a *tick*, ~100 ms on Hopper):

    idle 15 s → GEMM 35 s → idle 20 s → copy 20 s → idle 15 s → GEMM 20 s → idle 10 s
    → mix 15 s → idle 5 s

GEMM is a bf16 8192³ product (near the power limit), copy a 2 GiB device-to-device copy (a
second, lower power level, so that R_th and the ambient temperature can be told apart), mix
GEMM and copy alternating (is a power-capped GEMM clocked higher beside lower-power work?).
Work is issued in batches closed by CUDA events and the queue is kept full, so the GPU never
waits for the host and the number of batches done is known at every tick. Each tick records its time, the counter (mJ), the die temperature (°C) and the
number of products done. Written as JSON (``--out``).

``--fit FILE`` (anywhere, CPU): windows of at least ``--window-s`` between ticks become
:class:`frontier.context.ThermalObservation` s; the mechanism is fitted on the first half of the
schedule (through the copy phase) and judged on the rest (the second GEMM and its cooldown):
predicted against measured exit temperature per window, from the measured entry temperature
and the measured power. Then the entry effect: for the GEMM windows, time per product and
energy per product against entry temperature (a straight-line fit per °C, with its standard
error), and the change across the temperatures a GEMM meets in practice. Writes a Markdown
report (``--report``).

Usage::

    python experiments/thermal_entry_real.py --measure --out thermal_real.json   # on the GPU
    python experiments/thermal_entry_real.py --fit experiments/results/thermal_real_h200.json \\
        --report experiments/results/thermal_real_h200.md
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import deque
from pathlib import Path
from typing import Any

SCHEDULE = (("idle", 15.0), ("gemm", 35.0), ("idle", 20.0), ("copy", 20.0), ("idle", 15.0),
            ("gemm", 20.0), ("idle", 10.0), ("mix", 15.0), ("idle", 5.0))
FIT_PHASES = 5          # the first five phases are the fit set; the rest are held out
GEMM_N = 8192
COPY_BYTES = 2 * 2**30
BATCH = 8               # products (or copies) per event
QUEUE = 12              # batches in flight (~150 ms of GEMMs)


def measure(out: Path, index: int = 0) -> None:
    """Run the schedule on GPU ``index`` and write every tick (read-only NVML)."""
    import pynvml
    import torch

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = pynvml.nvmlDeviceGetName(h)
    dev = torch.device(f"cuda:{index}")
    a = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
    b = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
    c = torch.empty(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
    src = torch.empty(COPY_BYTES // 2, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    torch.mm(a, b, out=c)
    dst.copy_(src)
    torch.cuda.synchronize(dev)
    limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0

    def launch(kind: str) -> None:
        for i in range(BATCH):
            if kind == "gemm" or (kind == "mix" and i % 2 == 0):
                torch.mm(a, b, out=c)
            else:
                dst.copy_(src)

    # The queue is kept full (QUEUE batches in flight, each closed by an event) while the host
    # polls the counter, so a counter read (~4 ms on an H200) never leaves the GPU idle.
    ticks: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    last = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    for phase, (kind, dur) in enumerate(SCHEDULE):
        end = time.perf_counter() + dur
        done = 0
        pending: deque[Any] = deque()
        while time.perf_counter() < end:
            if kind == "idle":
                time.sleep(0.002)
            else:
                while len(pending) < QUEUE:
                    launch(kind)
                    ev = torch.cuda.Event()
                    ev.record()
                    pending.append(ev)
                while pending and pending[0].query():
                    pending.popleft()
                    done += BATCH
            e = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
            if e != last:
                last = e
                ticks.append({"t_s": time.perf_counter() - t0, "energy_mj": int(e),
                              "temp_c": pynvml.nvmlDeviceGetTemperature(h, 0),
                              "phase": phase, "kind": kind, "done": done,
                              "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, 1)})
        torch.cuda.synchronize(dev)
        print(f"phase {phase} {kind} {dur:.0f} s: {done} done, temp "
              f"{ticks[-1]['temp_c'] if ticks else '?'} C", flush=True)
    doc = {"format": "ecal.thermal-probe/1", "device": name, "power_limit_w": limit_w,
           "gemm_n": GEMM_N, "copy_bytes": COPY_BYTES, "schedule": SCHEDULE,
           "fit_phases": FIT_PHASES, "date": time.strftime("%Y-%m-%d"),
           "driver": pynvml.nvmlSystemGetDriverVersion(), "ticks": ticks}
    out.write_text(json.dumps(doc, indent=1))
    pynvml.nvmlShutdown()


def windows(ticks: list[dict[str, Any]], window_s: float) -> list[dict[str, Any]]:
    """Tick-to-tick windows of at least ``window_s`` inside one phase: entry and exit
    temperature, time, average power, products done."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(ticks) - 1:
        j = i + 1
        while j < len(ticks) and ticks[j]["phase"] == ticks[i]["phase"] \
                and ticks[j]["t_s"] - ticks[i]["t_s"] < window_s:
            j += 1
        if j >= len(ticks) or ticks[j]["phase"] != ticks[i]["phase"]:
            i = j if j < len(ticks) else len(ticks)
            continue
        a, b = ticks[i], ticks[j]
        dt = b["t_s"] - a["t_s"]
        out.append({"phase": a["phase"], "kind": a["kind"], "entry_c": a["temp_c"],
                    "exit_c": b["temp_c"], "time_s": dt,
                    "power_w": (b["energy_mj"] - a["energy_mj"]) / 1000.0 / dt,
                    "done": b["done"] - a["done"], "sm_mhz": b["sm_mhz"]})
        i = j
    return out


def _line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares slope, its standard error, and the intercept (scipy.stats.linregress)."""
    from scipy.stats import linregress

    r = linregress(xs, ys)
    return float(r.slope), float(r.stderr), float(r.intercept)


def fit(path: Path, window_s: float) -> str:
    """The Markdown report: mechanism fitted on the first phases, judged on the rest, and the
    GEMM's entry effect."""
    from frontier.context import ThermalObservation, fit_thermal

    doc = json.loads(path.read_text())
    ws = windows(doc["ticks"], window_s)
    obs = [ThermalObservation(w["entry_c"], w["time_s"], w["power_w"], w["exit_c"]) for w in ws]
    train = [o for o, w in zip(obs, ws) if w["phase"] < doc["fit_phases"]]
    held = [(o, w) for o, w in zip(obs, ws) if w["phase"] >= doc["fit_phases"]]
    th = fit_thermal(train)

    def err(o: ThermalObservation) -> float:
        return th.exit_temp_c(o.entry_c, o.time_s, o.power_w * o.time_s) - o.exit_c

    tr_err = [err(o) for o in train]
    ho_err = [err(o) for o, _ in held]
    # A multi-window prediction on held-out data: start from the first held-out entry and
    # carry the predicted temperature window to window (what composition along a device does).
    theta = held[0][0].entry_c if held else float("nan")
    carried = []
    for o, _ in held:
        theta = th.exit_temp_c(theta, o.time_s, o.power_w * o.time_s)
        carried.append(theta - o.exit_c)

    def rms(v: list[float]) -> float:
        return math.sqrt(sum(x * x for x in v) / len(v)) if v else float("nan")

    lines = [f"# Thermal mechanism on a real {doc['device']} (read-only, {doc['date']})", "",
             f"Driver {doc['driver']}, enforced power limit {doc['power_limit_w']:.0f} W "
             "(the card's own; nothing was set). Measured by `python "
             "experiments/thermal_entry_real.py --measure`; this report by `--fit`.",
             f"Schedule: {', '.join(f'{k} {d:.0f} s' for k, d in doc['schedule'])}; "
             f"windows of ≥ {window_s} s between energy-counter ticks; NVML temperature is "
             "whole °C.", "",
             "## First-order RC model: fitted on phases 0–"
             f"{doc['fit_phases'] - 1}, judged on the rest", "",
             f"Fitted: Θ_amb = {th.ambient_c:.1f} °C, R_th = {th.r_th_c_per_w:.4f} °C/W, "
             f"τ = {th.tau_s:.1f} s ({len(train)} windows).", "",
             "| set | windows | RMS exit-temperature error, °C | max abs, °C |",
             "|---|---|---|---|",
             f"| fit (one window ahead) | {len(train)} | {rms(tr_err):.2f} | "
             f"{max(map(abs, tr_err)):.2f} |"]
    if held:
        lines += [f"| held out (one window ahead) | {len(held)} | {rms(ho_err):.2f} | "
                  f"{max(map(abs, ho_err)):.2f} |",
                  f"| held out (carried from the first entry, {len(held)} windows) | "
                  f"{len(held)} | {rms(carried):.2f} | {max(map(abs, carried)):.2f} |"]
    gem = [w for w in ws if w["kind"] == "gemm" and w["done"] > 0]
    lines += ["", "## Entry effect on the GEMM (bf16 8192³)", ""]
    if len(gem) >= 3 and len({w["entry_c"] for w in gem}) >= 2:
        temps = [float(w["entry_c"]) for w in gem]
        t_ms = [w["time_s"] / w["done"] * 1e3 for w in gem]
        e_j = [w["power_w"] * w["time_s"] / w["done"] for w in gem]
        st, set_, it = _line(temps, t_ms)
        se, see, ie = _line(temps, e_j)
        lo, hi = min(temps), max(temps)
        dt_pct = st * (hi - lo) / (it + st * lo) * 100
        de_pct = se * (hi - lo) / (ie + se * lo) * 100
        lines += [f"{len(gem)} GEMM windows, entry {lo:.0f}–{hi:.0f} °C, SM clock "
                  f"{min(w['sm_mhz'] for w in gem)}–{max(w['sm_mhz'] for w in gem)} MHz, "
                  f"power {min(w['power_w'] for w in gem):.0f}–"
                  f"{max(w['power_w'] for w in gem):.0f} W.", "",
                  "| per product | slope per °C | ± (1 σ) | change over the range |",
                  "|---|---|---|---|",
                  f"| time, ms | {st:+.5f} | {set_:.5f} | {dt_pct:+.2f} % |",
                  f"| energy (board), J | {se:+.5f} | {see:.5f} | {de_pct:+.2f} % |", "",
                  "| phase | entry °C | exit °C | power W | SM MHz | ms per product | "
                  "J per product |", "|---|---|---|---|---|---|---|"]
        for w, t, e in zip(gem, t_ms, e_j):
            lines.append(f"| {w['phase']} | {w['entry_c']} | {w['exit_c']} | "
                         f"{w['power_w']:.0f} | {w['sm_mhz']} | {t:.3f} | {e:.3f} |")
    else:
        lines.append("Too few GEMM windows at distinct temperatures to fit an entry effect.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measure", action="store_true", help="run the schedule on the GPU")
    ap.add_argument("--index", type=int, default=0, help="GPU index (default: 0)")
    ap.add_argument("--out", type=Path, default=Path("thermal_real.json"),
                    help="ticks JSON to write with --measure (default: thermal_real.json)")
    ap.add_argument("--fit", type=Path, help="ticks JSON to fit and judge")
    ap.add_argument("--window-s", type=float, default=1.0,
                    help="shortest window between counter ticks, s (default: 1.0)")
    ap.add_argument("--report", type=Path, help="Markdown report to write (default: print)")
    args = ap.parse_args()
    if args.measure:
        measure(args.out, args.index)
    if args.fit:
        text = fit(args.fit, args.window_s)
        if args.report:
            args.report.write_text(text)
        else:
            print(text)


if __name__ == "__main__":
    main()
