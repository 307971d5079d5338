"""Validate the calculus on a real GPU without changing any device setting (< 4 minutes).

Characterizes (read-only NVML device; the only knobs are implementation κ and SM allocation
through CUDA green contexts):

* a bf16 GEMM (8192³), a 2 GiB copy, SDPA attention backends (κ = flash, efficient, cudnn,
  math) and the GEMM at several SM allocations;

then predicts with the algebra and measures:

* sequential composites (GEMM ⊗ copy, GEMM ⊗ flash attention) on one stream;
* same-device parallel composites: GEMM ∥ copy on two streams, and GEMM ∥ copy split by green
  contexts (96 + 32 SMs);
* the closed loop (:func:`closed_loop`): a step (GEMM ∥ copy on green contexts, then flash
  attention) predicted from elements alone and measured; the pair measured alone to localize;
  a flagged pair characterized jointly (an interaction table); the step predicted again with it
  and held against a second measurement;

and prints predicted vs measured with the Eq. 23 flags (``frontier.deviation``), writing JSON to
``experiments/results/gpu_validate.json``.

The device-level checks come first and are those of ``ecal selftest`` (:mod:`measure.selftest`:
counter period, counter read cost, ready power, each with its verdict, under ``"selftest"`` in
the JSON); the ready power they measure is the one every point here subtracts. Run ``ecal
selftest --device nvml:N`` on its own for the rest (deep idle before a CUDA context, SM-split
scaling, disjoint partitions). Green-context co-runs take their partitions from one split of
the device (:func:`measure.sm_alloc.split_sms`); where only overlapping contexts exist, the JSON
says so (``"partitions"``).

Usage::

    python experiments/gpu_validate.py                 # real GPU 0 (torch + nvidia-ml-py)
    python experiments/gpu_validate.py --dry-run       # print the plan, touch nothing
    python experiments/gpu_validate.py --device sim    # everything on the simulated H200

The script never calls a clock or power-limit setter: the NVML device is opened read-only,
which refuses them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
GEMM_N = 8192
COPY_BYTES = 2 * 2**30
ATTN_SHAPE = (4, 32, 4096, 128)            # B, H, S, D (bf16, causal)
BACKENDS = ("flash", "efficient", "cudnn", "math")
GEMM_SMS = (16, 32, 64, 96, 132)
GREEN_SPLIT = (96, 32)                     # GEMM SMs + copy SMs (Hopper: multiples of 8)
PAR_BRANCH_S = 0.25                        # each parallel branch lasts about this long
BUDGET_S = 210.0                           # stop starting new steps after this (real seconds)


def plan() -> list[dict[str, Any]]:
    """The steps, in order, with a rough device-time estimate each (s)."""
    steps = [{"step": "selftest checks: counter period, read cost, ready power (read-only)",
              "estimate_s": 6}]
    steps += [{"step": f"characterize {e}", "estimate_s": 4} for e in ("gemm_bf16_8192", "copy_2GiB")]
    steps += [{"step": f"characterize attention κ={b}", "estimate_s": 5} for b in BACKENDS]
    steps += [{"step": f"characterize gemm_bf16_8192 on {n} SMs (green context)", "estimate_s": 4}
              for n in GEMM_SMS[:-1]]
    steps += [{"step": f"characterize copy_2GiB on {GREEN_SPLIT[1]} SMs (green context)", "estimate_s": 4}]
    steps += [{"step": "closed loop: step, pair alone, step again (green contexts)", "estimate_s": 12}]
    steps += [{"step": f"composite {c}", "estimate_s": 6} for c in
              ("seq gemm;copy", "seq gemm;attention_flash", "par gemm||copy (2 streams)",
               f"par gemm@{GREEN_SPLIT[0]}||copy@{GREEN_SPLIT[1]} (green contexts)")]
    return steps


# -- backends ---------------------------------------------------------------------------------

class SimBackend:
    """The same experiment on the simulated H200 (virtual time; labelled simulated)."""

    def __init__(self, seed: int = 0):
        from measure import SimulatedGPU, preset

        self.device = SimulatedGPU(seed=seed, read_only=True)
        self.gemm = preset("gemm_bf16_8192")
        self.copy = preset("copy_2GiB")
        self.attention = {b: preset(f"attention_{b}") for b in BACKENDS}
        self.sm_total = self.device.operating_set().sm_count

    def seq_work(self, *works: Any) -> Any:
        """One invocation = the works back to back on one stream."""
        return list(works)

    def par_work(self, streams: list[tuple[Any, int, int | None]]) -> Callable[[], None]:
        """One invocation = each (work, k, sm_count) stream run k times, all started together."""
        return lambda: self.device.run_parallel(streams)

    def then(self, first: Callable[[], None], work: Any) -> Callable[[], None]:
        """One invocation = ``first()`` (e.g. a co-run), then ``work`` once on the device."""
        def run() -> None:
            first()
            self.device.run(work)
        return run


class TorchBackend:
    """Real work with PyTorch on CUDA device ``index`` (imported only here)."""

    def __init__(self, index: int = 0):
        import torch  # optional dependency: only the real-GPU path needs it

        from measure import NVMLDevice

        if not torch.cuda.is_available():
            raise SystemExit("CUDA is not available: run with --device sim or --dry-run")
        self.torch = torch
        self.index = index
        torch.cuda.set_device(index)
        self.device = NVMLDevice(index=index, read_only=True,
                                 synchronize=lambda: torch.cuda.synchronize(index))
        self.sm_total = torch.cuda.get_device_properties(index).multi_processor_count
        dev = f"cuda:{index}"
        a = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
        b = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
        c = torch.empty_like(a)
        src = torch.empty(COPY_BYTES // 4, device=dev, dtype=torch.float32).uniform_()
        dst = torch.empty_like(src)
        B, H, S, D = ATTN_SHAPE
        q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        self.gemm = _named(lambda: torch.matmul(a, b, out=c), "gemm_bf16_8192")
        self.copy = _named(lambda: dst.copy_(src), "copy_2GiB")
        self.attention = {bk: self._attention(bk, q, k, v) for bk in BACKENDS}
        self.partitions: dict[str, Any] = {}

    def _attention(self, backend: str, q: Any, k: Any, v: Any) -> Callable[[], Any]:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        which = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]

        def run() -> Any:
            with sdpa_kernel(which):
                return sdpa(q, k, v, is_causal=True)
        return _named(run, f"attention_{backend}")

    def seq_work(self, *works: Any) -> Callable[[], None]:
        """One invocation = the works back to back on the current stream."""
        def run() -> None:
            for w in works:
                w()
        return run

    def then(self, first: Callable[[], None], work: Callable[[], Any]) -> Callable[[], None]:
        """One invocation = ``first()`` (e.g. a co-run), then ``work()`` on the current stream."""
        def run() -> None:
            first()
            work()
        return run

    def par_work(self, streams: list[tuple[Any, int, int | None]]) -> Callable[[], None]:
        """One invocation = each (work, k, sm_count) on its own stream, started together
        (:meth:`measure.nvml.NVMLDevice.run_parallel`: whole-device streams, or the partitions
        of one split of the device; which, and whether disjoint, recorded in
        ``self.partitions``)."""
        label = "+".join(str(sm) for _, _, sm in streams)

        def run() -> None:
            self.device.run_parallel(streams)
            split = self.device.last_split
            if split is not None:
                self.partitions[label] = split.to_dict()
        return run


def _named(fn: Callable[[], Any], name: str) -> Callable[[], Any]:
    fn.__name__ = name
    return fn


# -- the experiment -----------------------------------------------------------------------------

def _sig_row(s: Any) -> dict[str, Any]:
    return {"name": s.name, "kappa": s.kappa, "omega": s.omega.label(), "time_s": s.time_s,
            "sd_time_s": s.sd_time_s, "energy_j": s.energy_j, "sd_energy_j": s.sd_energy_j,
            "s_w": s.s_w, "windows": s.meta.get("windows"), "sm_clocks_seen_mhz": s.meta.get("sm_clocks_seen_mhz"),
            "throttle_reasons": s.meta.get("throttle_reasons")}


def run(backend: Any, budget_s: float = BUDGET_S, out: Path | None = None, quiet: bool = False) -> dict[str, Any]:
    """Characterize, predict, measure, compare. Returns (and writes) the result dict."""
    from frontier.compose import par, seq
    from frontier.deviation import deviation
    from measure import Protocol, characterize, measure_point, measure_ready_power_w, restoring

    t0 = time.monotonic()
    dev = backend.device
    proto = Protocol(window_s=0.6, target_rse=0.01, min_windows=3, max_windows=8)
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    skipped: list[str] = []
    sigs: dict[str, Any] = {}
    comparisons: list[dict[str, Any]] = []

    def over_budget(step: str) -> bool:
        if time.monotonic() - t0 > budget_s:
            skipped.append(step)
            return True
        return False

    with restoring(dev):
        checks = device_checks(dev, proto)
        for c in checks:
            log(f"selftest {c.name}: {c.verdict} ({c.detail})")
        ready = checks[-1].value if checks[-1].value else measure_ready_power_w(dev, proto)
        log(f"ready power {ready:.1f} W on {dev.name}")

        def char(name: str, work: Any, grid: Any = None) -> None:
            if over_budget(f"characterize {name} {grid or ''}"):
                return
            res = characterize(work, device=dev, grid=grid, protocol=proto, name=name, progress=None,
                               ready_power_w=ready)
            for s in res.signatures:
                key = name if s.omega.sm_count is None else f"{name}@{s.omega.sm_count}"
                key = f"{key}[{s.kappa}]" if name == "attention" else key
                sigs[key] = s
                log(f"  {key:32s} T={s.time_s * 1e3:9.4f} ms  E={s.energy_j:8.4f} J  "
                    f"(rse {100 * s.meta['rse_energy']:.2f} %)")

        char("gemm_bf16_8192", backend.gemm)
        char("copy_2GiB", backend.copy)
        char("attention", dict(backend.attention))
        char("gemm_bf16_8192", backend.gemm, {"sm_count": [n for n in GEMM_SMS if n < backend.sm_total]})
        char("copy_2GiB", backend.copy, {"sm_count": [GREEN_SPLIT[1]]})

        def composite(name: str, work: Any, predicted: Any) -> None:
            if predicted is None or over_budget(f"composite {name}"):
                return
            meas = measure_point(dev, work, name, proto, ready_w=ready)
            pred = predicted.with_(name=name) if not predicted.composed else predicted
            r = deviation(pred, meas, name=name)
            comparisons.append({"name": name, "predicted": _sig_row(pred), "measured": _sig_row(meas),
                                "deviation": r.to_dict()})
            log("  " + r.summary())

        g, c = sigs.get("gemm_bf16_8192"), sigs.get("copy_2GiB")
        fa = sigs.get("attention[flash]")
        if g and c:
            composite("seq_gemm_copy", backend.seq_work(backend.gemm, backend.copy), seq(g, c, name="seq_gemm_copy"))
        if g and fa:
            composite("seq_gemm_attention_flash", backend.seq_work(backend.gemm, backend.attention["flash"]),
                      seq(g, fa, name="seq_gemm_attention_flash"))
        if g and c:
            k1 = max(1, round(PAR_BRANCH_S / g.time_s))
            k2 = max(1, round(PAR_BRANCH_S / c.time_s))
            composite("par_gemm_copy", backend.par_work([(backend.gemm, k1, None), (backend.copy, k2, None)]),
                      par(seq([g] * k1), seq([c] * k2), name="par_gemm_copy"))
        g96, c32 = sigs.get(f"gemm_bf16_8192@{GREEN_SPLIT[0]}"), sigs.get(f"copy_2GiB@{GREEN_SPLIT[1]}")
        if g96 and c32:
            k1 = max(1, round(PAR_BRANCH_S / g96.time_s))
            k2 = max(1, round(PAR_BRANCH_S / c32.time_s))
            composite(f"par_green_gemm{GREEN_SPLIT[0]}_copy{GREEN_SPLIT[1]}",
                      backend.par_work([(backend.gemm, k1, GREEN_SPLIT[0]), (backend.copy, k2, GREEN_SPLIT[1])]),
                      par(seq([g96] * k1), seq([c32] * k2), sm_total=backend.sm_total,
                          name=f"par_green_gemm{GREEN_SPLIT[0]}_copy{GREEN_SPLIT[1]}"))
        loop = None
        if g96 and c32 and fa and not over_budget("closed loop"):
            loop = closed_loop(backend, proto, ready, g96, c32, fa, log)
    result = {
        "format": "energy-calculus/gpu-validate", **dev.describe(), "ready_power_w": ready,
        "elapsed_real_s": time.monotonic() - t0, "budget_s": budget_s, "skipped": skipped,
        "signatures": {k: _sig_row(s) for k, s in sigs.items()}, "comparisons": comparisons,
        "flagged": [c["name"] for c in comparisons if c["deviation"]["flagged"]],
        "closed_loop": loop,
        "selftest": [c.to_dict() for c in checks],
        "partitions": getattr(backend, "partitions", {}),
    }
    if out is not None:
        from frontier.files import write_json_atomic

        write_json_atomic(out, result)
    return result


def device_checks(dev: Any, proto: Any) -> list[Any]:
    """The read-only device checks shared with ``ecal selftest`` (ready power last)."""
    from measure.selftest import check_counter_period, check_counter_read_cost, check_ready_power

    return [check_counter_period(dev, proto), check_counter_read_cost(dev, proto),
            check_ready_power(dev, proto)]


def closed_loop(backend: Any, proto: Any, ready_w: float, gemm: Any, copy: Any, attention: Any,
                log: Callable[..., None]) -> dict[str, Any]:
    """Hold a small step against execution, localize what broke, characterize it jointly, predict
    again (issue 19), on the device's own settings (read-only: SM splits only).

    The step is (GEMM on 96 SMs ∥ copy on 32 SMs, green contexts) then flash attention. Round 1
    predicts it from elements characterized alone (⊕ then ⊗) and measures it. The pair is then
    measured on its own: if its ⊕ prediction is flagged (Eq. 23), that pair is what broke, and its
    measurement goes into an :class:`~frontier.interaction.InteractionTable`. Round 2 predicts the
    step with the jointly measured pair (``compose_pair``; composed pairs keep their Eq. 13 bias
    bound) and holds it against a second, independent measurement of the step.
    """
    from frontier.compose import repeat, seq
    from frontier.deviation import deviation
    from frontier.interaction import (
        InteractionEntry,
        InteractionTable,
        PairKey,
        Provenance,
        compose_pair,
    )
    from measure import measure_point

    sm_total = backend.sm_total
    k1 = max(1, round(PAR_BRANCH_S / gemm.time_s))
    k2 = max(1, round(PAR_BRANCH_S / copy.time_s))
    a = repeat(gemm, k1, name=f"gemm@{GREEN_SPLIT[0]}x{k1}")
    b = repeat(copy, k2, name=f"copy@{GREEN_SPLIT[1]}x{k2}")
    pair_work = backend.par_work([(backend.gemm, k1, GREEN_SPLIT[0]), (backend.copy, k2, GREEN_SPLIT[1])])
    step_work = backend.then(pair_work, backend.attention["flash"])

    def measured(work: Any, name: str) -> Any:
        return measure_point(backend.device, work, name, proto, ready_w=ready_w)

    def row(r: Any, pred: Any, meas: Any) -> dict[str, Any]:
        return {"predicted": _sig_row(pred), "measured": _sig_row(meas), "deviation": r.to_dict()}

    table = InteractionTable()
    pred1, _ = compose_pair(a, b, table, sm_total=sm_total, name="pair")
    pred1 = seq(pred1, attention, name="step")
    step1 = measured(step_work, "step")
    r1 = deviation(pred1, step1, name="step (round 1: elements alone)")
    log("  loop round 1: " + r1.summary())
    pair = measured(pair_work, "pair")
    pair_pred = compose_pair(a, b, table, sm_total=sm_total, name="pair")[0]
    r_pair = deviation(pair_pred, pair, name="pair")
    log("  loop localize: " + r_pair.summary())
    if r_pair.flagged:
        prov = Provenance(device=str(backend.device.name), simulated=bool(backend.device.simulated),
                          protocol=proto.to_dict(), recorded_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        table = table.with_entries([InteractionEntry(PairKey.for_signatures(a, b), pair, prov)])
    pred2, rec = compose_pair(a, b, table, sm_total=sm_total, name="pair")
    pred2 = seq(pred2, attention, name="step")
    step2 = measured(step_work, "step")
    r2 = deviation(pred2, step2, name=f"step (round 2: pair {rec.source})")
    log("  loop round 2: " + r2.summary())
    return {"step": f"gemm@{GREEN_SPLIT[0]} || copy@{GREEN_SPLIT[1]}, then attention_flash",
            "round1": row(r1, pred1, step1), "pair": row(r_pair, pair_pred, pair),
            "pair_source": rec.source, "round2": row(r2, pred2, step2),
            "flagged_round1": r1.flagged, "flagged_round2": r2.flagged}


def print_table(result: dict[str, Any]) -> None:
    """Predicted vs measured, with Eq. 23 flags."""
    sim = " (SIMULATED)" if result.get("simulated") else ""
    print(f"device: {result['device']}{sim}; ready power {result['ready_power_w']:.1f} W; "
          f"{result['elapsed_real_s']:.1f} s")
    head = f"{'composite':34s} {'T pred (ms)':>16s} {'T meas (ms)':>16s} {'E pred (J)':>16s} {'E meas (J)':>16s} {'z_T':>7s} {'z_E':>7s}  Eq.23"
    print(head)
    for c in result["comparisons"]:
        p, m, d = c["predicted"], c["measured"], c["deviation"]
        print(f"{c['name']:34s} {p['time_s'] * 1e3:9.3f}±{p['sd_time_s'] * 1e3:<6.3f} "
              f"{m['time_s'] * 1e3:9.3f}±{m['sd_time_s'] * 1e3:<6.3f} {p['energy_j']:9.3f}±{p['sd_energy_j']:<6.3f} "
              f"{m['energy_j']:9.3f}±{m['sd_energy_j']:<6.3f} {_z(d['z_time']):>7s} {_z(d['z_energy']):>7s}  "
              f"{'FLAGGED' if d['flagged'] else 'ok'}")
    loop = result.get("closed_loop")
    if loop:
        print(f"closed loop on {loop['step']}: round 1 (elements alone) "
              f"{'FLAGGED' if loop['flagged_round1'] else 'ok'}, pair {loop['pair_source']}, "
              f"round 2 {'FLAGGED' if loop['flagged_round2'] else 'ok'}")
        for k in ("round1", "round2"):
            p, m, d = loop[k]["predicted"], loop[k]["measured"], loop[k]["deviation"]
            print(f"  {k}: T {p['time_s'] * 1e3:.3f} -> {m['time_s'] * 1e3:.3f} ms, "
                  f"E {p['energy_j']:.3f} -> {m['energy_j']:.3f} J, z_T {_z(d['z_time'])}, "
                  f"z_E {_z(d['z_energy'])}")
    if result["skipped"]:
        print("skipped (time budget):", ", ".join(result["skipped"]))


def _z(v: Any) -> str:
    return "inf" if v is None else f"{v:+.2f}"


def main(argv: list[str] | None = None) -> int:
    """Command line: real GPU by default; ``--dry-run``; ``--device sim``."""
    ap = argparse.ArgumentParser(description="Validate the calculus on a GPU without changing its settings.")
    ap.add_argument("--device", default="nvml:0", help="nvml:INDEX (real, read-only) or sim")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit; touch no device")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="start no new step after this many seconds")
    ap.add_argument("--seed", type=int, default=0, help="simulator seed (--device sim)")
    ap.add_argument("-o", "--output", default=None, help="JSON to write (default experiments/results/...)")
    args = ap.parse_args(argv)
    if args.dry_run:
        steps = plan()
        for s in steps:
            print(f"  ~{s['estimate_s']:>3d} s  {s['step']}")
        print(f"total ~{sum(s['estimate_s'] for s in steps)} s of device time; no device setting is changed "
              "(read-only NVML device; SM allocation via green contexts only)")
        return 0
    if args.device == "sim":
        backend: Any = SimBackend(args.seed)
        default_out = RESULTS / "gpu_validate_sim.json"
    elif args.device.startswith("nvml:"):
        backend = TorchBackend(int(args.device.split(":", 1)[1] or 0))
        default_out = RESULTS / "gpu_validate.json"
    else:
        ap.error(f"unknown --device {args.device!r}: nvml:INDEX or sim")
    out = Path(args.output) if args.output else default_out
    result = run(backend, args.budget_s, out)
    print_table(result)
    print(f"wrote {out}", file=sys.stderr)
    json.dumps(result)   # fail loudly here, not in a reader, if something is not JSON-ready
    return 0


if __name__ == "__main__":
    sys.exit(main())
