"""The training-loop hook's own cost on the training thread, per element: helper thread vs inline.

A 1F1B stage (rank 0 of 4 stages × 8 microbatches; forwards and backwards at different SM
clocks, so most elements switch) runs ``--iterations`` iterations of empty elements under
``PlanApplier.from_schedule``: what is timed is ``with applier.element(name): pass`` on the
training thread (``time.perf_counter``), minus the same loop without the hook, divided by the
elements. Devices: the simulated H200 (inline: its virtual clock is not thread-safe) and an
``NVMLDevice`` over the strict fake pynvml, whose setters take ``--setter-ms`` of real time
(a real ``nvmlDeviceSetGpuLockedClocks`` takes milliseconds), inline and on the helper thread.
Every setter is journalled as on a real GPU. The numbers depend on the machine: this is a
benchmark, not a test.

    python experiments/bench_applier.py                  # -> experiments/results/bench_applier.md
    python experiments/bench_applier.py --setter-ms 0 --iterations 50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from _common import RESULTS_DIR, doc_body, markdown_table, write_text_atomic  # noqa: E402

from measure import NVMLDevice, PlanApplier, SimulatedGPU  # noqa: E402
from measure.apply import task_name  # noqa: E402

N_STAGES, N_MB = 4, 8


def stage_order(stage: int) -> list[tuple[str, int]]:
    """1F1B order of one stage."""
    warm = min(N_STAGES - stage - 1, N_MB)
    out = [("forward", m) for m in range(warm)]
    for i in range(N_MB - warm):
        out += [("forward", warm + i), ("backward", i)]
    return out + [("backward", m) for m in range(N_MB - warm, N_MB)]


def write_schedule(path: Path) -> list[str]:
    """A schedule whose rank-0 forwards run at 1410 MHz and backwards at 1980 MHz."""
    devices = {}
    for s in range(N_STAGES):
        devices[f"stage{s}"] = [
            {"task": task_name(s, i, m), "start_s": 0.0, "end_s": 0.0,
             "sm_clock_mhz": 1410.0 if i == "forward" else 1980.0, "power_limit_w": 700.0}
            for i, m in stage_order(s)]
    path.write_text(json.dumps({
        "format": "ecal.schedule/1", "devices": devices, "ranks": list(devices),
        "device_info": {d: {"ready_power_w": 123.0} for d in devices}}))
    return [task_name(0, i, m) for i, m in stage_order(0)]


def fake_nvml_device(setter_ms: float):
    """An NVMLDevice over tests/fake_pynvml whose setter calls sleep ``setter_ms`` (real)."""
    from tests.fake_pynvml import FakeGPU, make_fake_pynvml

    fake = make_fake_pynvml(FakeGPU())
    if setter_ms > 0:
        for name in fake.FUNCTIONS:
            if name.startswith(("nvmlDeviceSet", "nvmlDeviceReset")):
                fn = getattr(fake, name)

                def slow(*a, _fn=fn, **k):
                    time.sleep(setter_ms / 1000.0)
                    return _fn(*a, **k)

                setattr(fake, name, slow)
    return NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)


def time_loop(tasks: list[str], iterations: int, applier: PlanApplier | None) -> float:
    """Seconds of the loop on the training thread (the hook's entry and exit not included)."""
    if applier is None:
        t0 = time.perf_counter()
        for _ in range(iterations):
            for _name in tasks:
                with _null():
                    pass
        return time.perf_counter() - t0
    with applier:
        t0 = time.perf_counter()
        for _ in range(iterations):
            for name in tasks:
                with applier.element(name):
                    pass
        dt = time.perf_counter() - t0
    return dt


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return None


def measure(mode: str, path: Path, tasks: list[str], iterations: int, setter_ms: float,
            repeats: int) -> dict:
    """Median over ``repeats`` of the per-element overhead (µs) of one mode."""
    per = []
    switches = calls = 0
    for _ in range(repeats):
        base = time_loop(tasks, iterations, None)
        if mode == "sim, inline":
            dev = SimulatedGPU(seed=0)
            ap = PlanApplier.from_schedule(path, 0, dev, synchronize=None)
        else:
            dev = fake_nvml_device(setter_ms)
            ap = PlanApplier.from_schedule(path, 0, dev, synchronize=None,
                                           asynchronous=mode.endswith("helper thread"))
        dt = time_loop(tasks, iterations, ap)
        if hasattr(dev, "close"):
            dev.close()
        per.append((dt - base) / (iterations * len(tasks)) * 1e6)
        switches, calls = ap.switches_made, ap.setter_calls
    return {"mode": mode, "us_per_element": statistics.median(per), "min_us": min(per),
            "switches": switches, "setter_calls": calls,
            "elements": iterations * len(tasks)}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write ``--out`` (Markdown)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--setter-ms", type=float, default=2.0,
                    help="real time each fake NVML setter takes (ms)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_applier.md"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("ECAL_STATE_DIR", str(Path(tmp) / "state"))  # journals, locks
        path = Path(tmp) / "schedule.json"
        tasks = write_schedule(path)
        rows = [measure(m, path, tasks, args.iterations, args.setter_ms, args.repeats)
                for m in ("sim, inline", "fake NVML, inline", "fake NVML, helper thread")]
    headers = ["device, mode", "µs per element (median)", "min", "switches", "setter calls",
               "elements"]
    table = [[r["mode"], f"{r['us_per_element']:.1f}", f"{r['min_us']:.1f}", r["switches"],
              r["setter_calls"], r["elements"]] for r in rows]
    text = (f"# {__doc__.splitlines()[0]}\n\n{doc_body(__doc__)}\n\n"
            f"Setter latency of the fake: {args.setter_ms:g} ms; {args.iterations} iterations of "
            f"{len(tasks)} elements, {args.repeats} repeats.\n\n" + markdown_table(headers, table))
    print(text)
    write_text_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
