"""How closely the simulated H200 reproduces the measured H200 elements (``data/h200``).

Each element is measured on the simulator with the default protocol at the default operating
point (green-context GEMMs at their SM allocation) and compared with the real windows' mean and
spread. Used by the tests and for the README's calibration table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from frontier.errors import InputError

from .protocol import Protocol, measure_point, measure_ready_power_w
from .sim import H200, PRESETS, SimSpec, SimulatedGPU


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

        from .replay import H200_MEASUREMENTS, shared_data_dir

        data = load_measurements(shared_data_dir() / H200_MEASUREMENTS)
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


# -- composites: the co-run model against the real H200 composites ----------------------------

#: The four H200 composites of ``data/h200/measurements.json`` (``compositions``): name, whether
#: the parts run in parallel (two streams started together) or in sequence (one stream), and
#: element → invocation count. Copied here so the simulator side runs without ``../shared``.
COMPOSITES: tuple[tuple[str, bool, tuple[tuple[str, int], ...]], ...] = (
    ("par_gemm8192_copy", True, (("gemm_bf16_8192", 371), ("copy_2GiB", 597))),
    ("par_gemm8192_axpy_sm4", True, (("gemm_bf16_8192", 371), ("axpy_triton_sm4", 29))),
    ("seq_gemm8192_copy", False, (("gemm_bf16_8192", 245), ("copy_2GiB", 245))),
    ("seq_gemm8192_axpy_sm4", False, (("gemm_bf16_8192", 27), ("axpy_triton_sm4", 27))),
)


def composite_work(gpu: SimulatedGPU, parallel: bool,
                   parts: tuple[tuple[str, int], ...]) -> Callable[[], None]:
    """One invocation of a composite on ``gpu``: the parts as streams started together
    (:meth:`~measure.sim.SimulatedGPU.run_parallel`, no SM partition, like two CUDA streams), or
    in sequence on one stream (each element once per round, as many rounds as the counts)."""
    kernels = [(PRESETS[name], int(n)) for name, n in parts]
    if parallel:
        streams = [(k, n, None) for k, n in kernels]
        return lambda: gpu.run_parallel(streams)
    rounds = {n for _, n in kernels}
    if len(rounds) != 1:
        raise InputError(f"a sequential composite needs equal counts per element, got {parts}")
    seq_kernels = [k for k, _ in kernels]
    n_rounds = rounds.pop()
    return lambda: gpu.run(seq_kernels, n_rounds)


def simulate_composites(seed: int = 0, protocol: Protocol | None = None,
                        spec: SimSpec = H200, only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Measure the :data:`COMPOSITES` and their elements on a simulated H200 with the
    project's protocol, each point from the null context (``seed_point``). ``spec``: the
    simulated device (default: the calibrated H200); ``only``: measure just these composites.

    Returns ``{"ready_w", "elements": name → Signature, "composites": name → {"measured":
    Signature, "predicted": Signature (⊕ or ⊗ of the elements alone), "throttle_reasons",
    "sm_clocks_seen_mhz"}}``."""
    from frontier.compose import par, seq

    proto = protocol or Protocol()
    gpu = SimulatedGPU(seed=seed, spec=spec)
    gpu.seed_point("ready")
    ready = measure_ready_power_w(gpu, proto)
    chosen = [c for c in COMPOSITES if only is None or c[0] in only]
    names = sorted({n for _, _, parts in chosen for n, _ in parts})
    elems = {}
    for n in names:
        gpu.seed_point(n)
        elems[n] = measure_point(gpu, PRESETS[n], n, proto, ready_w=ready)
    comps: dict[str, Any] = {}
    for name, parallel, parts in chosen:
        gpu.seed_point(name)
        sig = measure_point(gpu, composite_work(gpu, parallel, parts), name, proto, ready_w=ready)
        chains = [seq([elems[n]] * k, name=f"{n}x{k}") for n, k in parts]
        pred = par(chains, name=name) if parallel else seq(chains, name=name)
        comps[name] = {"measured": sig, "predicted": pred,
                       "throttle_reasons": list(sig.meta.get("throttle_reasons", [])),
                       "sm_clocks_seen_mhz": list(sig.meta.get("sm_clocks_seen_mhz", []))}
    return {"ready_w": ready, "elements": elems, "composites": comps}


def _dev_pct(measured: float, predicted: float) -> float:
    return 100.0 * (measured / predicted - 1.0)


def compare_composites_to_h200(data: Mapping[str, Any] | None = None, seed: int = 0,
                               size_factor: float = 1.5, spec: SimSpec = H200) -> list[dict[str, Any]]:
    """One row per composite: real measured T and E, the real ⊕/⊗ prediction from the real
    elements, the simulator's measured T and E, its prediction from its own elements, both
    deviations (%), and whether the simulator agrees in **direction** (same sign) and **size**
    (deviations within a factor ``size_factor`` of each other; deviations under 2 % on both
    sides count as agreeing, since that is the real windows' spread)."""
    from frontier.h200 import (
        element_signatures,
        load_measurements,
        measured_signature,
        predict_composition,
        static_power_w,
    )

    from .replay import H200_MEASUREMENTS, shared_data_dir

    if data is None:
        data = load_measurements(shared_data_dir() / H200_MEASUREMENTS)
    s = static_power_w(data)
    real_sigs = element_signatures(data)
    real = {c["name"]: c for c in data["compositions"]}
    sim = simulate_composites(seed, spec=spec)
    rows = []
    for name, _parallel, _parts in COMPOSITES:
        comp = real[name]
        r_meas = measured_signature(comp, s)
        r_pred = predict_composition(data, comp, real_sigs)
        sm = sim["composites"][name]
        row: dict[str, Any] = {
            "composite": name, "rule": "⊕" if _parallel else "⊗",
            "real_time_s": r_meas.time_s, "real_energy_j": r_meas.energy_j,
            "real_pred_time_s": r_pred.time_s, "real_pred_energy_j": r_pred.energy_j,
            "sim_time_s": sm["measured"].time_s, "sim_energy_j": sm["measured"].energy_j,
            "sim_pred_time_s": sm["predicted"].time_s, "sim_pred_energy_j": sm["predicted"].energy_j,
            "sim_throttle_reasons": sm["throttle_reasons"],
        }
        for q in ("time", "energy"):
            u = "s" if q == "time" else "j"
            rd = _dev_pct(row[f"real_{q}_{u}"], row[f"real_pred_{q}_{u}"])
            sd = _dev_pct(row[f"sim_{q}_{u}"], row[f"sim_pred_{q}_{u}"])
            row[f"real_dev_{q}_pct"], row[f"sim_dev_{q}_pct"] = rd, sd
            row[f"{q}_agrees"] = agreement(rd, sd, size_factor)
        rows.append(row)
    return rows


def agreement(real_pct: float, sim_pct: float, size_factor: float = 1.5,
              noise_pct: float = 2.0) -> dict[str, bool]:
    """``{"direction", "size"}``: same sign (or both within ``noise_pct``), and sizes within a
    factor ``size_factor`` (or both within ``noise_pct``)."""
    if abs(real_pct) < noise_pct and abs(sim_pct) < noise_pct:
        return {"direction": True, "size": True}
    same = real_pct * sim_pct > 0
    lo, hi = sorted((abs(real_pct), abs(sim_pct)))
    return {"direction": same, "size": same and lo > 0 and hi / lo <= size_factor}


def corun_table(rows: list[dict[str, Any]], size_factor: float = 1.5) -> str:
    """A markdown table of :func:`compare_composites_to_h200` rows."""
    out = [f"| composite | real T (s) / E (J) | sim T (s) / E (J) | real ⊕/⊗ pred T / E | "
           f"sim ⊕/⊗ pred T / E | real dev T / E (%) | sim dev T / E (%) | "
           f"direction T / E | size (×{size_factor:g}) T / E |",
           "|---|---|---|---|---|---|---|---|---|"]

    def yn(b: bool) -> str:
        return "yes" if b else "**no**"

    for r in rows:
        out.append(
            f"| {r['composite']} ({r['rule']}) | {r['real_time_s']:.3f} / {r['real_energy_j']:.1f} | "
            f"{r['sim_time_s']:.3f} / {r['sim_energy_j']:.1f} | "
            f"{r['real_pred_time_s']:.3f} / {r['real_pred_energy_j']:.1f} | "
            f"{r['sim_pred_time_s']:.3f} / {r['sim_pred_energy_j']:.1f} | "
            f"{r['real_dev_time_pct']:+.1f} / {r['real_dev_energy_pct']:+.1f} | "
            f"{r['sim_dev_time_pct']:+.1f} / {r['sim_dev_energy_pct']:+.1f} | "
            f"{yn(r['time_agrees']['direction'])} / {yn(r['energy_agrees']['direction'])} | "
            f"{yn(r['time_agrees']['size'])} / {yn(r['energy_agrees']['size'])} |")
    return "\n".join(out)


# -- co-runs at SM splits: the regimes the real data do not cover ------------------------------

#: Co-runs in SM partitions (green contexts) with no real counterpart in ``data/h200``: name,
#: whether the partitions are disjoint as granted (else they overlap and the simulator shrinks
#: them to fit), the (element, SMs) streams, and the seconds each stream runs alone (its
#: invocation count is set from that; None: one invocation each, as the demo's tasks run).
SPLIT_CORUNS: tuple[tuple[str, bool, tuple[tuple[str, int], ...], float | None], ...] = (
    ("gemm8192@64 ∥ copy@64", True, (("gemm_bf16_8192", 64), ("copy_2GiB", 64)), 0.3),
    ("gemm8192@96 ∥ copy@32", True, (("gemm_bf16_8192", 96), ("copy_2GiB", 32)), 0.3),
    ("gemm8192@112 ∥ copy@16", True, (("gemm_bf16_8192", 112), ("copy_2GiB", 16)), 0.3),
    ("gemm8192@120 ∥ copy@8", True, (("gemm_bf16_8192", 120), ("copy_2GiB", 8)), 0.3),
    ("gemm8192@72 ∥ copy@72", False, (("gemm_bf16_8192", 72), ("copy_2GiB", 72)), 0.3),
    ("stage_forward@120 ∥ p2p_send@8", True, (("stage_forward", 120), ("p2p_send", 8)), None),
    ("stage_forward@112 ∥ p2p_send@16", True, (("stage_forward", 112), ("p2p_send", 16)), None),
    ("stage_forward@96 ∥ p2p_send@32", True, (("stage_forward", 96), ("p2p_send", 32)), None),
)


def simulate_split_coruns(seed: int = 0, spec: SimSpec = H200, protocol: Protocol | None = None,
                          only: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Each :data:`SPLIT_CORUNS` co-run on a simulated H200 (``spec``) with the project's
    protocol, from the null context: the streams started together in their SM partitions
    (one ``run_parallel`` call), against ⊕ of the elements measured alone in the same
    partitions. Rows ``{corun, disjoint, counts, sim_time_s, sim_energy_j, sim_pred_time_s,
    sim_pred_energy_j, sim_dev_time_pct, sim_dev_energy_pct}`` (no real column: the real data
    hold no such co-run)."""
    from frontier.compose import par, seq

    proto = protocol or Protocol()
    gpu = SimulatedGPU(seed=seed, spec=spec)
    gpu.seed_point("ready")
    ready = measure_ready_power_w(gpu, proto)
    rows = []
    for name, disjoint, parts, run_s in SPLIT_CORUNS:
        if only is not None and name not in only:
            continue
        counts = [1 if run_s is None else
                  max(1, round(run_s / gpu.kernel_state(PRESETS[e], sm_count=sm).time_s))
                  for e, sm in parts]
        chains = []
        for (e, sm), n in zip(parts, counts):
            gpu.seed_point(f"{e}@{sm}")
            el = measure_point(gpu, PRESETS[e], f"{e}@{sm}", proto, ready_w=ready, sm_count=sm)
            chains.append(seq([el] * n, name=f"{e}@{sm}x{n}"))
        pred = par(chains, name=name)
        streams = [(PRESETS[e], n, sm) for (e, sm), n in zip(parts, counts)]
        gpu.seed_point(name)
        sig = measure_point(gpu, lambda s=streams: gpu.run_parallel(s), name, proto, ready_w=ready)
        rows.append({"corun": name, "disjoint": disjoint, "counts": counts,
                     "sim_time_s": sig.time_s, "sim_energy_j": sig.energy_j,
                     "sim_pred_time_s": pred.time_s, "sim_pred_energy_j": pred.energy_j,
                     "sim_dev_time_pct": _dev_pct(sig.time_s, pred.time_s),
                     "sim_dev_energy_pct": _dev_pct(sig.energy_j, pred.energy_j)})
    return rows


#: The protocol ``experiments/corun_splits_real.py`` measured the real splits with.
SPLITS_PROTOCOL = Protocol(window_s=0.6, target_rse=0.01, min_windows=3, max_windows=6)


def simulate_real_splits(splits: list[Mapping[str, Any]], seed: int = 0, spec: SimSpec = H200,
                         protocol: Protocol = SPLITS_PROTOCOL) -> list[dict[str, Any]]:
    """The real GEMM ∥ copy co-runs at SM splits (the ``splits`` rows of a corun-splits file,
    ``experiments/corun_splits_real.py``) on a simulated H200, with the real invocation counts
    and protocol: each side measured alone in its partition, ⊕ of the two chains predicted, the
    co-run measured (one ``run_parallel`` call, disjoint partitions), each point from the null
    context. Rows ``{corun, split, counts, real_dev_time_pct, real_dev_energy_pct,
    real_flagged_energy, sim_dev_time_pct, sim_dev_energy_pct, real_power_w, sim_power_w}``."""
    from frontier.compose import par, seq

    gpu = SimulatedGPU(seed=seed, spec=spec)
    gpu.seed_point("ready")
    ready = measure_ready_power_w(gpu, protocol)
    rows = []
    for r in splits:
        (a_sm, b_sm), (k1, k2) = r["split"], r["k"]
        parts = (("gemm_bf16_8192", a_sm, int(k1)), ("copy_2GiB", b_sm, int(k2)))
        chains = []
        for e, sm, n in parts:
            gpu.seed_point(f"{e}@{sm}")
            el = measure_point(gpu, PRESETS[e], f"{e}@{sm}", protocol, ready_w=ready, sm_count=sm)
            chains.append(seq([el] * n, name=f"{e}@{sm}x{n}"))
        name = f"gemm@{a_sm} ∥ copy@{b_sm}"
        pred = par(chains, name=name)
        streams = [(PRESETS[e], n, sm) for e, sm, n in parts]
        gpu.seed_point(name)
        sig = measure_point(gpu, lambda s=streams: gpu.run_parallel(s), name, protocol, ready_w=ready)
        dev, meas = r["deviation"], r["measured"]
        rows.append({"corun": name, "split": [a_sm, b_sm], "counts": [int(k1), int(k2)],
                     "real_dev_time_pct": float(dev["error_time_pct"]),
                     "real_dev_energy_pct": float(dev["error_energy_pct"]),
                     "sim_dev_time_pct": _dev_pct(sig.time_s, pred.time_s),
                     "sim_dev_energy_pct": _dev_pct(sig.energy_j, pred.energy_j),
                     "real_flagged_energy": bool(dev.get("flagged_energy", True)),
                     "real_power_w": float(meas["energy_j"]) / float(meas["time_s"]),
                     "sim_power_w": sig.energy_j / sig.time_s})
    return rows
