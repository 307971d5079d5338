"""Adaptive characterization (measure.adaptive) and the bounds it rests on (frontier.bounds)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from frontier.bounds import (
    BoundsError,
    Interval,
    convex_bound,
    dominating,
    merge_close,
    monotone_bound,
    shape_bound,
)
from frontier.operating_point import OperatingPoint
from frontier.pareto import pareto_frontier
from frontier.signature import Signature
from measure.adaptive import (
    AdaptiveError,
    AdaptiveOptions,
    AdaptiveResult,
    characterize_adaptive,
    default_coarse,
)
from measure.grid import Grid
from measure.replay import ReplayDevice
from measure.sim import SimulatedGPU, preset
from measure.sweep import sweep

K = 2.0


# ---------------------------------------------------------------------------------------------
# bounds, worked by hand
# ---------------------------------------------------------------------------------------------

def test_convex_bound_hand_worked():
    # g = (x - 3)^2 sampled at 1, 2, 4, 5 (exact): g(3) = 0
    xs, g = [1.0, 2.0, 4.0, 5.0], [4.0, 1.0, 1.0, 4.0]
    b = convex_bound(xs, g, g, 3.0)
    # upper: chord (2,1)-(4,1) = 1; lower: secants (1,2) and (4,5) extended: 1 - 3 = -2
    assert b == Interval(-2.0, 1.0)
    assert b.contains(0.0)
    # at 2.5 the chord of (2,1),(4,1) is 1; the secant of (1,4),(2,1) gives 1 - 1.5 = -0.5
    assert convex_bound(xs, g, g, 2.5) == Interval(-0.5, 1.0)
    # outside the data: no chord, so unbounded above; lower from the secant of (4,1),(5,4): 7
    out = convex_bound(xs, g, g, 6.0)
    assert out.lo == pytest.approx(7.0) and out.hi == math.inf
    # at a data point: its own value
    assert convex_bound(xs, g, g, 4.0) == Interval(1.0, 1.0)


def test_convex_bound_with_intervals_is_worst_case():
    # values known to +-0.1: chord uses the highs, the secant (1 + r) lo_j - r hi_i
    xs = [0.0, 1.0, 2.0, 4.0]
    v = np.array([4.0, 2.0, 1.0, 1.0])
    b = convex_bound(xs, v - 0.1, v + 0.1, 3.0)
    assert b.hi == pytest.approx(1.1)                     # chord of (2,1.1),(4,1.1)
    assert b.lo == pytest.approx(2 * 0.9 - 2.1)           # secant (1,2)-(2,1) extended: r = 1
    # every convex function through the intervals is inside: a random family
    rng = np.random.default_rng(0)
    for _ in range(200):
        a, c = rng.uniform(0, 1), rng.uniform(-3, 3)
        ys = a * (np.asarray(xs) - c) ** 2
        assert convex_bound(xs, ys, ys, 3.0).contains(a * (3.0 - c) ** 2, 1e-12)


def test_monotone_bound_hand_worked():
    xs, v = [1.0, 2.0, 4.0], [9.0, 5.0, 2.0]
    assert monotone_bound(xs, v, v, 3.0, decreasing=True) == Interval(2.0, 5.0)
    assert monotone_bound(xs, v, v, 0.5, decreasing=True) == Interval(9.0, math.inf)
    up = [1.0, 2.0, 5.0]
    assert monotone_bound(xs, up, up, 3.0, decreasing=False) == Interval(2.0, 5.0)


def test_shape_bound_intersects_and_flags_contradiction():
    # T = 12/x (convex, decreasing), sampled at 1, 2, 3, 6
    xs = [1.0, 2.0, 3.0, 6.0]
    t = [12.0, 6.0, 4.0, 2.0]
    b = shape_bound(xs, t, t, 4.0, convex=True, monotone="decreasing")
    assert b.contains(3.0)                                  # 12/4
    assert b.lo >= 2.0 and b.hi <= 4.0
    # data that are not convex: a spike in the middle makes chord < secant
    bad = [1.0, 1.0, 5.0, 1.0, 1.0]
    e = shape_bound([1.0, 2.0, 3.0, 4.0, 5.0], bad, bad, 2.5, convex=True)
    assert e.empty
    with pytest.raises(BoundsError):
        shape_bound(xs, t, t, 4.0, monotone="sideways")  # type: ignore[arg-type]


def test_merge_and_dominating():
    x, lo, hi = merge_close([3.0, 1.0, 1.05], [5.0, 2.0, 3.0], [6.0, 2.5, 3.5], tol=0.1)
    assert list(x) == pytest.approx([1.025, 3.0])
    assert list(lo) == [2.0, 5.0] and list(hi) == [3.5, 6.0]
    pts = np.array([[1.0, 5.0], [2.0, 3.0]])
    assert dominating([2.0, 3.05], pts, [0.0, 0.1]) == 1
    assert dominating([1.5, 2.0], pts, [0.0, 0.1]) is None


@pytest.mark.parametrize("args", [
    ([1.0, 2.0], [1.0], [1.0]),                 # lengths differ
    ([2.0, 1.0], [1.0, 1.0], [1.0, 1.0]),       # not increasing
    ([1.0, 2.0], [1.0, math.nan], [1.0, 1.0]),  # NaN
    ([1.0, 2.0], [2.0, 1.0], [1.0, 1.0]),       # lo > hi
])
def test_bounds_reject_bad_input(args):
    with pytest.raises(BoundsError):
        convex_bound(*args, 1.5)


# ---------------------------------------------------------------------------------------------
# adaptive on a replayed full grid (the truth is known)
# ---------------------------------------------------------------------------------------------

CLOCKS = [float(f) for f in range(600, 1981, 60)]        # 24 clocks


def _model_grid(name: str = "k", wobble: float = 0.0) -> dict[str, list[Signature]]:
    """A replayed sweep shaped like a GPU kernel: T = a/f + b (convex, falling), E convex with
    its minimum inside the range (the U shape)."""
    sigs = []
    for i, f in enumerate(CLOCKS):
        t = 2.0e-3 * 1000.0 / f + 0.4e-3
        e = 0.8 + 0.45 * ((f - 1150.0) / 800.0) ** 2 + wobble * math.sin(i)
        sigs.append(Signature.from_runs(name, [t], [e], s_w=0.0,
                                        omega=OperatingPoint(sm_clock_mhz=f)))
    return {name: sigs}


def _full(sigs: dict[str, list[Signature]], name: str) -> dict[OperatingPoint, Signature]:
    res = sweep(ReplayDevice(sigs), {None: name}, name, grid={"sm_clock_mhz": CLOCKS},
                progress=None)
    return {s.omega: s for s in res.signatures}


def _check_against_full(res: AdaptiveResult, full: dict[OperatingPoint, Signature],
                        rel_sigma: float) -> None:
    coords = ("time_s", "energy_j")
    measured = np.array([[s.time_s, s.energy_j] for s in res.signatures])
    front = {s.omega for s in pareto_frontier(list(full.values()), "TE")}
    for sk in res.skipped:
        truth = full[sk.omega]
        tol = np.array([K * rel_sigma * truth.time_s, K * rel_sigma * truth.energy_j])
        v = np.array([truth.time_s, truth.energy_j])
        if sk.reason == "dominated":
            # a point on the full frontier may be skipped only if a measured point is within σ
            if sk.omega in front:
                assert np.any(np.all(measured <= v + tol, axis=1)), sk
        else:
            assert sk.reason == "predicted", sk
            for c, t in zip(coords, tol):
                lo, hi = sk.bounds[c]
                assert lo - t <= getattr(truth, c) <= hi + t, (sk, c)


def test_adaptive_on_replayed_grid_never_skips_a_frontier_point_beyond_sigma():
    sigs = _model_grid()
    full = _full(sigs, "k")
    res = characterize_adaptive("k", ReplayDevice(sigs),
                                AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}, coarse_grid=5))
    assert len(res.signatures) + len(res.skipped) == len(CLOCKS)
    assert 0 < len(res.signatures) < len(CLOCKS)                 # it did skip something
    assert res.skipped_by_reason().get("dominated", 0) > 0       # the slow end below E_min
    _check_against_full(res, full, 1e-3)
    # measured points equal the full sweep's, and the adaptive frontier is as good
    for kp, s in zip(res.measured_keys, res.signatures):
        assert s.energy_j == pytest.approx(full[kp[1]].energy_j, rel=1e-5)   # tick phase
    ff = pareto_frontier(list(full.values()), "TE")
    af = res.frontier()
    for p in ff:
        ok = [s for s in af if s.time_s <= p.time_s * (1 + 1e-6)]
        best = min(ok, key=lambda s: s.energy_j)
        assert full[best.omega].energy_j <= p.energy_j * (1 + 0.01)
    assert res.gpu_s > 0 and res.rounds >= 1


def test_adaptive_measures_where_data_break_convexity():
    # a wobble of +-3 % breaks convexity: the bounds contradict and those points get measured;
    # nothing is skipped wrongly
    sigs = _model_grid(wobble=0.03)
    full = _full(sigs, "k")
    res = characterize_adaptive("k", ReplayDevice(sigs),
                                AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}, coarse_grid=5))
    _check_against_full(res, full, 1e-3)
    assert len(res.signatures) > 5


def test_skipped_points_carry_reasons_and_estimates():
    sigs = _model_grid()
    res = characterize_adaptive("k", ReplayDevice(sigs),
                                AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}, coarse_grid=5))
    measured = set(res.measured_keys)
    assert {kp for kp in res.grid} == measured | {(s.kappa, s.omega) for s in res.skipped}
    for sk in res.skipped:
        assert sk.reason in ("dominated", "predicted") and sk.detail
        assert set(sk.bounds) == {"time_s", "energy_j", "s_w", "d_j"}
        if sk.reason == "dominated":
            assert sk.by and "dominated" in sk.detail and sk.estimate is None
        else:
            assert sk.estimate is not None and sk.estimate.meta["estimated"] is True
            lo, hi = sk.bounds["energy_j"]
            assert lo <= sk.estimate.energy_j <= hi
    d = res.to_dict()
    assert d["measured"] + len(d["skipped"]) == d["grid_points"]
    table = res.to_table()
    assert "dominated" in table and "measured" in table and "[SIMULATED]" in table


def test_save_writes_measured_signatures(tmp_path):
    from frontier.io import load_signatures

    res = characterize_adaptive("k", ReplayDevice(_model_grid()),
                                AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}, coarse_grid=5))
    p = res.save(tmp_path / "k.json")
    back = load_signatures(p)
    assert len(back) == len(res.signatures)
    with_est = res.save(tmp_path / "k2.json", include_estimates=True)
    assert len(load_signatures(with_est)) == len(res.signatures) + len(res.estimates)


def test_td_never_skips_across_omega_dev_as_dominated():
    sigs = _model_grid()
    res = characterize_adaptive("k", ReplayDevice(sigs),
                                AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}, coarse_grid=5, criterion="Td"))
    # one κ, no SM split: every clock is its own ω_dev group, so nothing is dominated in Td
    assert res.skipped_by_reason().get("dominated", 0) == 0
    tsd = characterize_adaptive("k", ReplayDevice(sigs),
                                AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}, coarse_grid=5, criterion="Tsd"))
    assert tsd.criterion == "Tsd" and len(tsd.signatures) + len(tsd.skipped) == len(CLOCKS)


def test_nvdvfs_replay_if_available():
    from measure.replay import load_nvdvfs, shared_data_dir

    path = shared_data_dir() / "nv-dvfs" / "v100-dvfs-real.csv"
    if not path.exists():
        pytest.skip("../shared/data/nv-dvfs is absent (a user's clone has no ../shared)")
    sigs = load_nvdvfs(path)
    for name in sorted(sigs)[:3]:
        one = {name: sigs[name]}
        grid = {"sm_clock_mhz": sorted({s.omega.sm_clock_mhz for s in sigs[name]}, reverse=True)}
        full = {s.omega: s for s in sweep(ReplayDevice(one), {None: name}, name, grid=grid,
                                           progress=None).signatures}
        res = characterize_adaptive(name, ReplayDevice(one),
                                    AdaptiveOptions(grid=grid, rse_floor=0.005))
        _check_against_full(res, full, 0.005)


# ---------------------------------------------------------------------------------------------
# the simulator: power limits, bit-identical points
# ---------------------------------------------------------------------------------------------

def test_sim_with_power_limits_matches_full_sweep_points():
    # 19 clocks: on 10, gemm's 400 W plateau ties the uncapped curve within its spread, and
    # every point is measured (a capped run dominates nothing beyond its row's spread)
    grid = {"sm_clock_mhz": [float(f) for f in range(1980, 899, -60)],
            "power_limit_w": [700.0, 400.0]}
    res = characterize_adaptive(preset("gemm_bf16_8192"), SimulatedGPU(seed=3),
                                AdaptiveOptions(grid=grid), name="gemm")
    assert res.simulated and res.meta["device"] == "simulated H200"
    full = sweep(SimulatedGPU(seed=3), {None: preset("gemm_bf16_8192")}, "gemm", grid=grid,
                 progress=None)
    by = {s.omega: s for s in full.signatures}
    for (_, op), s in zip(res.measured_keys, res.signatures):
        assert s.energy_j == by[op].energy_j and s.time_s == by[op].time_s   # seeded by key
    assert len(res.signatures) < len(by)
    assert res.gpu_s < sum(s.meta["device_time_s"] for s in full.signatures) * 2


def test_default_coarse_has_ends_and_top_clock_per_limit():
    g = Grid({"sm_clock_mhz": CLOCKS, "power_limit_w": [700.0, 500.0, 400.0, 300.0]})
    pts = default_coarse(g, 4)
    top = [p for p in pts if p.power_limit_w == 700.0]
    assert {p.sm_clock_mhz for p in top} >= {CLOCKS[0], CLOCKS[-1]} and len(top) == 4
    assert {p.power_limit_w for p in pts if p.sm_clock_mhz == CLOCKS[-1]} == {700.0, 500.0, 300.0}


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"criterion": "TT"}, "criterion"),
    ({"target_rse": 0.0}, "target_rse"),
    ({"k_sigma": math.nan}, "k_sigma"),
    ({"rel_tol": -0.1}, "rel_tol"),
    ({"max_rounds": 0}, "max_rounds"),
    ({"coarse_grid": 2}, "at least 3"),
    ({"coarse_grid": {"sm_clock_mhz": [1234.0]}}, "not in the grid"),
    ({"grid": {"sm_clock_mhz": [600.0, 660.0]}}, "at least 3"),
    ({"grid": {"power_limit_w": [700.0]}}, "sm_clock_mhz"),
    ({"rse_floor": 2.0}, "rse_floor"),
])
def test_bad_input_errors(kwargs, match):
    sigs = _model_grid()
    base = {"grid": {"sm_clock_mhz": CLOCKS}}
    base.update(kwargs)
    with pytest.raises(AdaptiveError, match=match):
        characterize_adaptive("k", ReplayDevice(sigs), AdaptiveOptions(**base))


def test_bad_grid_point_is_rejected_before_measuring():
    from measure.device import UnsupportedSettingError

    dev = ReplayDevice(_model_grid())
    with pytest.raises(UnsupportedSettingError):
        characterize_adaptive("k", dev,
                              AdaptiveOptions(grid={"sm_clock_mhz": [600.0, 660.0, 661.0]}))
    assert dev.time_s() == 0.0
    with pytest.raises(AdaptiveError, match="no work"):
        characterize_adaptive({}, dev, AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}))


# ---------------------------------------------------------------------------------------------
# the experiments' machinery, on tiny inputs
# ---------------------------------------------------------------------------------------------

def _load_experiment(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_exp_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up there
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_adaptive_experiment_checks_and_chain_on_a_replayed_model():
    ex = _load_experiment("adaptive_characterization")
    runs = []
    for name, wobble in (("a", 0.0), ("b", 0.0)):
        sigs = _model_grid(name, wobble)
        full = _full(sigs, name)
        ad = characterize_adaptive(name, ReplayDevice(sigs),
                                   AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}, coarse_grid=5))
        r = ex.ElementRun("model", name, full, 1.0, ad)
        ex.check(r, K)
        assert r.plan_gaps and max(r.plan_gaps) < 0.01 and not r.wrong_skips
        runs.append(r)
    rows = ex.chain(runs, "model chain")
    assert [c["deadline_x"] for c in rows] == list(ex.CHAIN_DEADLINES)
    assert all(c["gap"] is None or c["gap"] < 0.01 for c in rows)
    assert "model" in ex.markdown_table(ex.HEAD, ex.element_rows(runs))
    # the oracle count: settings a measured-only plan within tol needs (hand-worked)
    op = [OperatingPoint(sm_clock_mhz=f) for f in (1000.0, 1100.0, 1200.0, 1300.0, 1400.0)]
    exp = dict(zip(op, [(4.0, 0.999), (3.0, 1.0), (2.0, 1.099), (1.0, 1.10), (3.5, 1.2)]))
    assert ex.min_cover(exp, 0.003) == 2          # 1.10 covers 1.099; 1.0 covers 0.999
    assert ex.min_cover(exp, 0.0) == 4
    assert ex.min_cover(exp, 0.0, time_slack=0.5) == 3   # a slower one within 50 % counts too


def test_protocol_gpu_seconds_runs_and_compares():
    ex = _load_experiment("protocol_gpu_seconds")
    res = ex.run(seeds=2)
    s = res["summary"]
    assert s["Zeus 5 s + 5 s, to 1 %"]["gpu_s_per_point"] > s["ecal tick-aligned 0.6 s"]["gpu_s_per_point"]
    assert res["simulated"] is True and "SIMULATED" in ex.table(res)


# ---------------------------------------------------------------------------------------------
# the fastest points, capped rows, the CLI
# ---------------------------------------------------------------------------------------------

SMALL = {"sm_clock_mhz": [float(f) for f in range(1980, 1259, -60)],
         "power_limit_w": [700.0, 550.0, 400.0]}


def test_every_rows_fastest_point_is_measured_so_1x_deadline_is_feasible():
    from measure.adaptive import fastest_points

    # a coarse grid without any top clock below 700 W: the rows' fastest points still come in
    coarse = [OperatingPoint(sm_clock_mhz=f, power_limit_w=700.0) for f in (1980.0, 1620.0, 1260.0)]
    res = characterize_adaptive(preset("gemm_bf16_8192"), SimulatedGPU(seed=0),
                                AdaptiveOptions(grid=SMALL, coarse_grid=coarse), name="gemm")
    tops = fastest_points(Grid(SMALL).points())
    assert {o.power_limit_w for o in tops} == {700.0, 550.0, 400.0}
    assert all(o.sm_clock_mhz == 1980.0 for o in tops)
    measured = {s.omega for s in res.signatures}
    assert set(tops) <= measured
    assert len(res.meta["fastest_points"]) == 3
    # 1x the fastest operating point (points are seeded by key: bit-identical to a full sweep)
    full = sweep(SimulatedGPU(seed=0), {None: preset("gemm_bf16_8192")}, "gemm", grid=SMALL)
    by = {s.omega: s for s in full.signatures}
    deadline = min(by[o].time_s for o in tops)
    front = res.frontier(criterion="TE")        # measured points only
    assert any(s.time_s <= deadline for s in front)


def test_capped_row_is_judged_against_the_noise_free_plateau():
    """copy_2GiB capped at 400 W: every capped setting runs at one clock ceiling, so in
    expectation it costs what the uncapped curve costs at that clock (not 13 % less); a full
    grid's capped point that looks cheaper at a shorter time is a lucky draw of its clock's
    wander. Adaptive treats the row as one point and loses < 1.5 % on expected values."""
    grid = {"sm_clock_mhz": [float(f) for f in range(1980, 1199, -30)],
            "power_limit_w": [700.0, 400.0]}
    gpu, k = SimulatedGPU(seed=0), preset("copy_2GiB")
    exp = {}
    for op in Grid(grid).points():
        st = gpu.kernel_state(k, op)
        exp[op] = (st.time_s, st.time_s * st.power_w, st.capped)
    capped = [v for v in exp.values() if v[2]]
    assert capped and all(v[2] for o, v in exp.items()
                          if o.power_limit_w == 400.0 and o.sm_clock_mhz >= 1380.0)
    ceiling = gpu.kernel_state(k, OperatingPoint(sm_clock_mhz=1980.0, power_limit_w=400.0))
    free = gpu.kernel_state(k, OperatingPoint(sm_clock_mhz=round(ceiling.sm_clock_mhz / 15) * 15,
                                              power_limit_w=700.0))
    # the plateau sits on the uncapped curve (within the 15 MHz rounding of the clock)
    assert ceiling.time_s * ceiling.power_w == pytest.approx(free.time_s * free.power_w, rel=0.01)
    res = characterize_adaptive(k, SimulatedGPU(seed=0), AdaptiveOptions(grid=grid), name="copy")
    front = list(res.frontier(criterion="TE"))  # measured points only
    fastest = min(exp[OperatingPoint(**p)][0] for p in res.meta["fastest_points"])
    for d in np.geomspace(fastest * 1.002, max(t for t, _, _ in exp.values()), 25):
        ok = [s for s in front if s.time_s <= d]
        if not ok:
            continue
        pick = min(ok, key=lambda s: s.energy_j).omega
        best = min(e for t, e, _ in exp.values() if t <= exp[pick][0] * (1 + 1e-9))
        assert exp[pick][1] <= best * 1.015, (d, pick.label())


def _cli(args, capsys):
    from ecal import cli

    rc = cli.main(args)
    return rc, capsys.readouterr()


def test_cli_characterize_adaptive_prints_table_and_writes_output(tmp_path, capsys):
    from frontier.io import load_signatures

    out = tmp_path / "copy.json"
    grid = "sm_clock_mhz=1980:1260:-60,power_limit_w=700,400"
    rc, io = _cli(["characterize", "copy_2GiB", "--adaptive", "--grid", grid, "-o", str(out)],
                  capsys)
    assert rc == 0, io.err
    head = io.out.splitlines()[0]
    assert "copy_2GiB on simulated H200" in head and "criterion TE" in head
    assert "points measured" in head
    lines = io.out.splitlines()[1:]
    assert len(lines) == 26                        # every grid point: measured or skipped, why
    assert any(ln.strip().startswith("measured") for ln in lines)
    assert any(ln.strip().startswith(("dominated", "predicted")) for ln in lines)
    sigs = load_signatures(out)
    n_measured = sum(ln.strip().startswith("measured") for ln in lines)
    assert len(sigs) == n_measured                 # measured points only, not the estimates
    assert f"wrote {out}" in io.err


def test_cli_characterize_adaptive_criterion_and_json(tmp_path, capsys):
    import json

    rc, io = _cli(["characterize", "gemm_bf16_8192", "--adaptive", "Td", "--grid",
                   "sm_clock_mhz=1980:1500:-60", "--json"], capsys)
    assert rc == 0, io.err
    doc = json.loads(io.out)
    assert doc["format"] == "energy-calculus/adaptive-characterization"
    assert doc["criterion"] == "Td" and doc["grid_points"] == 9
    assert doc["measured"] + sum(doc["skipped_by_reason"].values()) == 9


@pytest.mark.parametrize("extra, match", [
    (["--grid", "sm_clock_mhz=1980,1500"], "at least 3"),
    (["--grid", "sm_clock_mhz=1980,1500", "--results", "r.jsonl"], "at least 3"),
])
def test_cli_characterize_adaptive_bad_input_exit_2_no_file(tmp_path, capsys, monkeypatch,
                                                            extra, match):
    monkeypatch.chdir(tmp_path)
    rc, io = _cli(["characterize", "copy_2GiB", "--adaptive", "-o", "o.json"] + extra, capsys)
    assert rc == 2 and match in io.err
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "r.jsonl").exists()


def test_cli_characterize_adaptive_rejects_unknown_criterion(capsys):
    with pytest.raises(SystemExit) as e:
        _cli(["characterize", "copy_2GiB", "--adaptive", "TT"], capsys)
    assert e.value.code == 2


def _sig(f, p, t, e, capped=False, seen=None):
    meta = {"sm_clocks_seen_mhz": [seen or f],
            "throttle_reasons": ["SwPowerCap"] if capped else []}
    return Signature("k", s_w=0.0, time_s=t, d_j=e, var_time_s2=(1e-4 * t) ** 2,
                     var_energy_j2=(1e-3 * e) ** 2,
                     omega=OperatingPoint(sm_clock_mhz=f, power_limit_w=p), meta=meta)


def test_a_lucky_capped_run_does_not_dominate_better_settings():
    """One capped run can look a few % faster and cheaper than its setting is on average (the
    capped clock wanders): as a dominator it counts as its row's plateau at its pessimistic
    end, and not at all before the row's spread is known."""
    from measure.adaptive import _Planner

    clocks = [float(f) for f in range(1980, 1199, -60)]
    pts = [(None, OperatingPoint(sm_clock_mhz=f, power_limit_w=p))
           for p in (700.0, 400.0) for f in clocks]
    pl = _Planner(pts, "TE", 2.0, 0.01, 0.01, 0.005)

    def curve(f):     # uncapped: T falls, E rises with the clock
        return 1e-3 * (1.0 + 300.0 / f), 0.30 + 0.3 * (f / 1980.0) ** 2

    for f in (1980.0, 1620.0, 1200.0):
        pl.add(None, OperatingPoint(sm_clock_mhz=f, power_limit_w=700.0), _sig(f, 700.0, *curve(f)))
    # 400 W caps the clock near 1320 MHz; this one run came out 2 % faster and 3 % cheaper
    t0, e0 = curve(1320.0)
    pl.add(None, OperatingPoint(sm_clock_mhz=1980.0, power_limit_w=400.0),
           _sig(1980.0, 400.0, t0 * 0.98, e0 * 0.97, capped=True, seen=1320.0))
    target = OperatingPoint(sm_clock_mhz=1320.0, power_limit_w=700.0)
    verdict, _, sk = pl.decide(None, target)
    assert not (sk is not None and sk.reason == "dominated" and "400W" in (sk.by or "")), sk
    lucky = pl.meas[(None, OperatingPoint(sm_clock_mhz=1980.0, power_limit_w=400.0))]
    assert pl._dominator(lucky, ("time_s", "energy_j")) is None       # spread not known yet
    # two more runs of the plateau (on average it is the curve at 1320 MHz)
    for f, r in ((1860.0, 1.02), (1740.0, 1.01)):
        pl.add(None, OperatingPoint(sm_clock_mhz=f, power_limit_w=400.0),
               _sig(f, 400.0, t0 * r, e0 * (r + 0.01), capped=True, seen=1320.0))
    dom = pl._dominator(lucky, ("time_s", "energy_j"))
    assert dom is not None and dom[0] > t0 and dom[1] > e0                # pessimistic end
    verdict, _, sk = pl.decide(None, target)
    assert not (sk is not None and sk.reason == "dominated" and "400W" in (sk.by or "")), sk


def test_plans_get_measured_points_only_and_estimates_on_request():
    res = characterize_adaptive(preset("gemm_bf16_8192"), SimulatedGPU(seed=0),
                                AdaptiveOptions(grid=SMALL), name="gemm")
    measured = {s.omega for s in res.signatures}
    front = list(res.frontier())
    assert front and all(s.omega in measured and not s.meta.get("estimated") for s in front)
    assert set(res.keyed()) == set(res.keyed(include_estimates=False))
    if res.estimates:
        both = list(res.frontier(include_estimates=True))
        assert {s.omega for s in both} <= measured | {s.omega for s in res.estimates}


@pytest.mark.parametrize("plan_tol", [0.003, 0.01])
def test_every_skipped_point_is_covered_by_a_measured_one_within_plan_tol(plan_tol):
    """Plans use measured points only, so a point may go unmeasured only where a measured
    point at least as fast (within k·σ of time) costs at most plan_tol more energy."""
    from measure.adaptive import MIN_RSE_TIME

    sigs = _model_grid()
    full = _full(sigs, "k")
    res = characterize_adaptive("k", ReplayDevice(sigs),
                                AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}, coarse_grid=5, plan_tol=plan_tol))
    m = np.array([[s.time_s, s.energy_j] for s in res.signatures])
    for sk in res.skipped:
        t, e = full[sk.omega].time_s, full[sk.omega].energy_j
        ok = (m[:, 0] <= t * (1 + 2 * K * MIN_RSE_TIME)) & (m[:, 1] <= e * (1 + plan_tol + 1e-3))
        assert ok.any(), sk
    tight = characterize_adaptive("k", ReplayDevice(sigs),
                                  AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}, coarse_grid=5, plan_tol=0.003))
    loose = characterize_adaptive("k", ReplayDevice(sigs),
                                  AdaptiveOptions(grid={"sm_clock_mhz": CLOCKS}, coarse_grid=5, plan_tol=0.05))
    assert len(tight.signatures) >= len(loose.signatures)


def test_an_unreached_power_limit_is_the_same_setting_as_the_one_measured():
    res = characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(seed=0),
                                AdaptiveOptions(grid=SMALL), name="copy")
    same = [s for s in res.skipped if s.detail.startswith("the same setting")]
    assert same
    measured = {s.omega for s in res.signatures}
    for s in same:
        assert s.reason == "dominated" and s.by
        assert s.omega.with_(power_limit_w=None) in {o.with_(power_limit_w=None) for o in measured}
    # not for Td: there the power limit is part of the ω_dev a ⊕ branch shares
    td = characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(seed=0),
                               AdaptiveOptions(grid=SMALL, criterion="Td", max_rounds=3),
                               name="copy")
    assert not [s for s in td.skipped if s.detail.startswith("the same setting")]


# ---------------------------------------------------------------------------------------------
# journal: resumable adaptive characterization
# ---------------------------------------------------------------------------------------------

JGRID = {"sm_clock_mhz": [float(f) for f in range(1980, 1259, -60)], "power_limit_w": [700.0, 400.0]}


def _points_in(path) -> list[str]:
    import json

    recs = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    return [r["key"] for r in recs if r["kind"] == "point"]


def _same_result(a: AdaptiveResult, b: AdaptiveResult) -> None:
    assert a.measured_keys == b.measured_keys
    assert [s.to_dict() for s in a.skipped] == [s.to_dict() for s in b.skipped]
    for x, y in zip(a.signatures, b.signatures):
        assert (x.time_s, x.energy_j, x.s_w, x.d_j, x.var_time_s2, x.var_energy_j2) == (
            y.time_s, y.energy_j, y.s_w, y.d_j, y.var_time_s2, y.var_energy_j2)
    assert a.rounds == b.rounds and len(a.violations) == len(b.violations)


def test_journal_resume_reads_points_back_and_takes_the_same_decisions(tmp_path):
    ref = characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(), AdaptiveOptions(grid=JGRID))
    j = tmp_path / "copy.jsonl"
    full = characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(), AdaptiveOptions(grid=JGRID),
                                 journal=j)
    _same_result(ref, full)                       # journaling changes nothing
    keys = _points_in(j)
    assert len(keys) == len(set(keys)) == len(full.signatures) == full.meta["measured_points"]
    # a kill after 5 points (and in the middle of the 6th line): keep the header + 5 points
    lines = j.read_text().splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if '"kind": "point"' in ln)
    j.write_text("".join(lines[:first + 5]) + lines[first + 5][:40])
    res = characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(), AdaptiveOptions(grid=JGRID),
                                journal=j)
    _same_result(ref, res)
    assert res.meta["resumed_points"] == 5
    assert res.meta["measured_points"] == len(ref.signatures) - 5
    keys = _points_in(j)
    assert len(keys) == len(set(keys)) == len(ref.signatures)   # nothing measured twice
    again = characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(), AdaptiveOptions(grid=JGRID),
                                  journal=j)
    assert again.meta["measured_points"] == 0 and again.gpu_s == 0.0
    _same_result(ref, again)


@pytest.mark.parametrize("change, field", [
    ({"name": "other"}, "element"),
    ({"grid": {**JGRID, "power_limit_w": [700.0, 550.0]}}, "grid"),
    ({"target_rse": 0.02}, "protocol.target_rse"),
    ({"criterion": "Tsd"}, "adaptive.criterion"),
    ({"k_sigma": 3.0}, "adaptive.k_sigma"),
])
def test_journal_of_another_run_is_refused(tmp_path, change, field):
    from measure.results_log import ResultsMismatchError

    j = tmp_path / "j.jsonl"
    characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(),
                          AdaptiveOptions(grid=JGRID, max_rounds=1), journal=j, name="copy_2GiB")
    before = j.read_bytes()
    kw = {"grid": JGRID, "max_rounds": 1, **change}
    name = kw.pop("name", "copy_2GiB")
    with pytest.raises(ResultsMismatchError, match=field.replace(".", r"\.")) as e:
        characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(), AdaptiveOptions(**kw),
                              journal=j, name=name)
    assert e.value.field == field and "use another results file" in str(e.value)
    assert j.read_bytes() == before               # left as it was


def test_journal_refuses_a_full_sweeps_results_file_and_another_seed(tmp_path):
    from measure.results_log import ResultsMismatchError

    r = tmp_path / "full.jsonl"
    sweep(SimulatedGPU(), {None: preset("copy_2GiB")}, "copy_2GiB", grid=JGRID,
          results_path=str(r), progress=None)
    with pytest.raises(ResultsMismatchError, match="full sweep"):
        characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(), AdaptiveOptions(grid=JGRID),
                              journal=r, name="copy_2GiB")
    j = tmp_path / "j.jsonl"
    characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(),
                          AdaptiveOptions(grid=JGRID, max_rounds=1), journal=j)
    with pytest.raises(ResultsMismatchError, match="seed"):
        characterize_adaptive(preset("copy_2GiB"), SimulatedGPU(seed=3),
                              AdaptiveOptions(grid=JGRID, max_rounds=1), journal=j)


_CHILD = """
import importlib, sys, time

sw = importlib.import_module("measure.sweep")   # the module (``measure.sweep`` is a function)

real, count_file, pause_at = sw.measure_point, sys.argv[1], int(sys.argv[2])
done = [0]


def counted(*a, **k):
    # the parent SIGKILLs this process while it is measuring point number pause_at
    if done[0] + 1 == pause_at:
        time.sleep(600)
    sig = real(*a, **k)
    done[0] += 1
    with open(count_file, "a") as fh:      # one line per completed measurement
        fh.write("1\\n")
    return sig


sw.measure_point = counted
from ecal import cli

sys.exit(cli.main(sys.argv[3:]))
"""


def _ecal_child(tmp_path, tag: str, argv: list[str], pause_at: int = 0):
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "MPLBACKEND": "Agg"}
    count = tmp_path / f"{tag}.count"
    out = open(tmp_path / f"{tag}.out", "w")
    err = open(tmp_path / f"{tag}.err", "w")
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(count), str(pause_at), *argv],
                         env=env, cwd=str(tmp_path), stdout=out, stderr=err)
    return p, count, (out, err)


def _count(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_cli_adaptive_results_survive_sigkill_and_resume(tmp_path):
    """The real CLI in a child process on the simulator, SIGKILLed while it measures a point
    (after 6 are in the journal), then rerun on the same journal: the result equals an
    uninterrupted run's and no point is measured twice."""
    import json
    import signal
    import time

    grid = "sm_clock_mhz=1980:1260:-60,power_limit_w=700,400"

    def argv(j, o):
        return ["characterize", "copy_2GiB", "--adaptive", "--device", "sim", "--grid", grid,
                "--results", j, "-o", o]

    p, ref_count, fhs = _ecal_child(tmp_path, "ref", argv("ref.jsonl", "ref.json"))
    assert p.wait(timeout=120) == 0, (tmp_path / "ref.err").read_text()
    n_ref = _count(ref_count)
    assert n_ref == len(_points_in(tmp_path / "ref.jsonl")) > 7

    p, killed_count, fhs2 = _ecal_child(tmp_path, "killed", argv("run.jsonl", "run.json"),
                                        pause_at=7)
    deadline = time.monotonic() + 120
    journal = tmp_path / "run.jsonl"
    while len(_points_in(journal) if journal.exists() else []) < 6:
        assert p.poll() is None, (tmp_path / "killed.err").read_text()
        assert time.monotonic() < deadline, "no points journaled"
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    assert p.wait(timeout=60) == -signal.SIGKILL
    assert not (tmp_path / "run.json").exists()
    assert _count(killed_count) == 6 and len(_points_in(journal)) == 6

    p, resumed_count, fhs3 = _ecal_child(tmp_path, "resumed", argv("run.jsonl", "run.json"))
    assert p.wait(timeout=120) == 0, (tmp_path / "resumed.err").read_text()
    for fh in fhs + fhs2 + fhs3:
        fh.close()
    # no point measured twice: 6 before the kill + the rest after it = an uninterrupted run
    assert _count(killed_count) + _count(resumed_count) == n_ref
    keys = _points_in(journal)
    assert len(keys) == len(set(keys)) == n_ref
    assert sorted(keys) == sorted(_points_in(tmp_path / "ref.jsonl"))
    assert "resumed" in (tmp_path / "resumed.err").read_text()
    # the same result: the signatures written, and every point's verdict in the table
    ref = json.loads((tmp_path / "ref.json").read_text())
    got = json.loads((tmp_path / "run.json").read_text())
    assert got["signatures"] == ref["signatures"]
    table = [(tmp_path / f"{t}.out").read_text().splitlines()[1:] for t in ("ref", "resumed")]
    assert table[0] == table[1] and len(table[0]) == 26


def test_cli_plan_tol_needs_adaptive_and_is_checked(capsys):
    """--plan-tol without --adaptive, or negative, is a one-line exit 2 before any measurement."""
    from ecal.cli import main

    assert main(["characterize", "copy_2GiB", "--grid", "sm_clock_mhz=1980:1800:-60", "--plan-tol", "0.01"]) == 2
    assert "--plan-tol" in capsys.readouterr().err
    assert main(["characterize", "copy_2GiB", "--adaptive", "--grid", "sm_clock_mhz=1980:1800:-60",
                 "--plan-tol", "-1"]) == 2
    assert "plan_tol" in capsys.readouterr().err
