"""A plain PyTorch 1F1B pipeline-stage loop that runs a plan with ``PlanApplier.from_schedule``.

One process per pipeline stage (``--rank``), as torchrun starts them. Each iteration runs the
stage's forwards and backwards in 1F1B order; each instruction is wrapped in
``applier.element(task_name(stage, instruction, microbatch))``, so the GPU runs it at the
clocks the plan chose. Switches are handed to a helper thread (the loop never waits for
NVML), the stream is synchronized before each switch, and the GPU is restored on exit, on an
exception and on Ctrl-C.

Run it here, without a GPU or torch, on the simulated H200::

    python docs/examples/pytorch_1f1b_loop.py --device sim

On a GPU (needs torch and root for clock locks), with the schedule ``ecal plan --schedule``
wrote for your pipeline::

    python docs/examples/pytorch_1f1b_loop.py --schedule schedule.json --rank 0 --device nvml:0

Without ``--schedule`` the example writes a small 2-stage × 4-microbatch schedule of the same
format (``ecal.schedule/1``) into ``--out`` (default: a temporary folder) first. The stage's "model" is a small MLP; the
inputs stand in for the activations a real stage receives from its neighbour (the
send/recv is not part of the example: it does not change where the hooks go).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):   # run as a script from a checkout: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from frontier.errors import EnergyCalculusError  # noqa: E402
from measure.apply import PlanApplier, task_name  # noqa: E402


def stage_order(stage: int, n_stages: int, n_microbatches: int) -> list[tuple[str, int]]:
    """1F1B: warm-up forwards, then one forward / one backward, then the remaining backwards."""
    warm = min(n_stages - stage - 1, n_microbatches)
    order = [("forward", m) for m in range(warm)]
    for i in range(n_microbatches - warm):
        order += [("forward", warm + i), ("backward", i)]
    return order + [("backward", m) for m in range(n_microbatches - warm, n_microbatches)]


def example_schedule(n_stages: int = 2, n_microbatches: int = 4) -> dict:
    """A schedule like ``ecal plan --schedule`` writes: forwards slower, backwards at speed."""
    devices = {}
    for s in range(n_stages):
        entries = []
        for inst, mb in stage_order(s, n_stages, n_microbatches):
            clock = 1980.0 if inst == "backward" else (1410.0 if s == 0 else 1605.0)
            entries.append({"task": task_name(s, inst, mb), "start_s": 0.0, "end_s": 0.0,
                            "sm_clock_mhz": clock})
        devices[f"stage{s}"] = entries
    info = {}
    for dev, entries in devices.items():
        c = [e["sm_clock_mhz"] for e in entries]
        info[dev] = {"ready_power_w": 123.0,
                     "switches_per_iteration": sum(a != b for a, b in zip(c, c[1:] + c[:1]))}
    return {"format": "ecal.schedule/1", "deadline_s": None, "makespan_s": None,
            "steady_state": True, "ranks": list(devices), "device_info": info, "devices": devices}


def torch_stage(hidden: int = 4096, batch: int = 8):
    """Forward and backward of one microbatch through a small MLP on the current GPU."""
    import torch

    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU(),
                                torch.nn.Linear(hidden, hidden)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    pending = {}

    def forward(mb: int) -> None:
        x = torch.randn(batch, hidden, device=dev)   # stands in for the received activation
        pending[mb] = model(x)

    def backward(mb: int) -> None:
        y = pending.pop(mb)
        y.backward(torch.ones_like(y))               # stands in for the received gradient

    def step() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    return forward, backward, step


def sim_stage(gpu):
    """The same shape on the simulated H200: a forward is GEMMs, a backward twice as many."""
    from measure.sim import preset

    gemm = preset("gemm_bf16_8192")
    return (lambda mb: gpu.run(gemm, 20)), (lambda mb: gpu.run(gemm, 40)), (lambda: None)


def main(argv: list[str] | None = None) -> int:
    """Run ``--iterations`` iterations of one stage under the schedule; print what was done."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default=None, help="ecal.schedule/1 file (default: an example)")
    ap.add_argument("--rank", type=int, default=0, help="pipeline rank (stage) of this process")
    ap.add_argument("--device", default="sim", help="sim, or nvml:INDEX for a real GPU")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--out", default=None,
                    help="folder for the example schedule (default: a temporary folder)")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except EnergyCalculusError as exc:      # a bad schedule or rank: one line, as ecal does
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ecal-example-"))
    path = Path(args.schedule) if args.schedule else out / "schedule.json"
    if not args.schedule:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(example_schedule(), indent=1))

    if args.device.startswith("sim"):
        from measure.sim import SimulatedGPU

        gpu = SimulatedGPU(seed=0)
        applier = PlanApplier.from_schedule(path, rank=args.rank, device=gpu)
        forward, backward, step = sim_stage(gpu)
    else:
        try:
            forward, backward, step = torch_stage()
        except ImportError:
            print("this example needs torch on a GPU; use --device sim without one", file=sys.stderr)
            return 2
        applier = PlanApplier.from_schedule(path, rank=args.rank, device=args.device)

    sched = applier.schedule
    n_microbatches = len(sched.tasks) // 2
    n_stages = max(len(json.loads(path.read_text()).get("devices", {})), args.rank + 1)
    with applier:
        for _ in range(args.iterations):
            for instruction, mb in stage_order(args.rank, n_stages, n_microbatches):
                with applier.element(task_name(args.rank, instruction, mb)):
                    (forward if instruction == "forward" else backward)(mb)
            step()      # the optimizer step runs at the clock of the last task
    print(f"rank {args.rank} ({sched.device}): {args.iterations} iterations, "
          f"{applier.switches_made} switches, switches per iteration "
          f"{applier.switches_per_iteration} (planned {sched.switches_per_iteration} in steady "
          f"state), {applier.setter_calls} setter calls; energy {applier.total_energy_j:.1f} J "
          f"in {applier.total_time_s:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
