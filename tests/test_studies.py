"""Smoke tests of the four studies in ``experiments/``: each main function runs on small settings
in a few seconds and writes its table and figure. The real-data studies skip, saying why, when
``../shared/data`` (or ``$ECAL_SHARED_DATA``) lacks their files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import _common  # noqa: E402
import study_attention_tp  # noqa: E402
import study_cross_hardware  # noqa: E402
import study_kernel_clocks  # noqa: E402
import study_power_limits  # noqa: E402

NVDVFS = [rel for rel, _ in study_kernel_clocks.CARDS.values()]
ZEUS_V100 = study_power_limits.TRACE.format(gpu="v100")


def need(*relative: str) -> None:
    """Skip unless every file is under the shared data folder."""
    missing = [r for r in relative if _common.shared_file(r) is None]
    if missing:
        pytest.skip(f"shared data absent: {', '.join(missing)} not under {_common.shared_data_dir()} "
                    f"(set ECAL_SHARED_DATA to the data folder to run this study)")


def written(out: Path, stem: str) -> dict:
    for ext in ("md", "json", "png"):
        assert (out / f"{stem}.{ext}").stat().st_size > 0
    assert not list(out.glob(".*.tmp")), "a temp file was left behind"
    return json.loads((out / f"{stem}.json").read_text())


def test_kernel_clocks_small(tmp_path):
    need(*NVDVFS)
    chain = study_kernel_clocks.CHAIN[:5]
    out = study_kernel_clocks.run_study(cards=("v100",), chain=chain, sweep_ms=(0.0, 10.0),
                                        out_dir=tmp_path, quiet=True)
    card = out["cards"]["v100"]
    base = card["all_max"]["energy_j"]
    free, costly = card["plans"]["0ms"], card["plans"]["10ms"]
    for p in (free, costly):
        assert p["makespan_s"] <= card["deadline_s"] * (1 + 1e-9)
        assert p["energy_j"] <= base + 1e-9
        assert p["status"] == "optimal"
    assert free["energy_j"] <= costly["energy_j"] + 1e-9      # switching never helps
    assert costly["n_switches"] <= free["n_switches"]
    assert written(tmp_path, "study_kernel_clocks")["chain"] == list(chain)


def test_power_limits_small(tmp_path):
    need(ZEUS_V100)
    out = study_power_limits.run_study(gpus=("v100",), factors=(1.05,), out_dir=tmp_path, quiet=True)
    configs = out["gpus"]["v100"]["configs"]
    assert len(configs) > 10
    for cfg in configs.values():
        ch = cfg["choices"][0]
        assert ch["time_s"] <= ch["deadline_s"] * (1 + 1e-12)
        max_cap = max(cfg["points"], key=lambda p: p["power_limit_w"])
        if max_cap["time_s"] <= ch["deadline_s"]:            # the max cap was an option
            assert ch["saved"] >= -1e-12
    written(tmp_path, "study_power_limits")


def test_attention_tp_small(tmp_path):
    out = study_attention_tp.run_study(batches=(1,), clocks=(1980.0, 1710.0, 1440.0),
                                       out_dir=tmp_path, quiet=True)
    assert out["simulated"] is True
    res = out["batches"]["1"]
    picked = res["picked"]
    assert picked["makespan_s"] <= res["deadline_s"] * (1 + 1e-12)
    # E = static over the makespan + every dynamic part (both GPUs), as composed.
    parts = picked["static_j"] + picked["d_prefix_j"] + picked["d_compute_j"] + picked["d_allreduce_j"]
    assert parts == pytest.approx(picked["energy_j"], rel=1e-9)
    fastest = min(res["points"], key=lambda p: p["makespan_s"])
    assert picked["energy_j"] <= fastest["energy_j"] + 1e-12
    written(tmp_path, "study_attention_tp")


def test_cross_hardware_small(tmp_path):
    need(*NVDVFS)
    chain = study_kernel_clocks.CHAIN[5:]
    out = study_cross_hardware.run_study(chain=chain, out_dir=tmp_path, quiet=True)
    assert set(out["cards"]) == {"v100", "rtx8000"}
    for card in out["cards"].values():
        plan = card["plans"]["0ms"]
        assert plan["energy_j"] <= card["all_max"]["energy_j"] + 1e-9
        assert set(card["clock_sensitivity"]) == set(chain)
    written(tmp_path, "study_cross_hardware")


def test_real_data_studies_say_when_data_is_absent(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ECAL_SHARED_DATA", str(tmp_path / "nowhere"))
    assert study_kernel_clocks.run_study(out_dir=None, quiet=True) is None
    assert study_power_limits.run_study(out_dir=None, quiet=True) is None
    assert study_cross_hardware.run_study(out_dir=None, quiet=True) is None
    assert "not found" in capsys.readouterr().out


def test_atomic_text_write_replaces(tmp_path):
    p = tmp_path / "t.md"
    _common.write_text_atomic(p, "a")
    _common.write_text_atomic(p, "b")
    assert p.read_text() == "b" and not list(tmp_path.glob(".*.tmp"))


def test_steady_state_rounding_on_the_bundled_pipeline():
    # the bundled 4x8 Perseus profile; no shared data needed
    import steady_state_rounding

    prof = Path(__file__).resolve().parents[1] / "ecal" / "examples" / "pipeline_4x8.csv"
    r = steady_state_rounding.rounding_loss(4, 8, 1e-3, "1.2x", prof)
    assert r["cycles"] == sum(8 - min(4 - s - 1, 8) for s in range(4))
    assert r["lp_bound_j"] > 0 and np.isfinite(r["loss_j"])
    assert r["loss_pct"] == pytest.approx(100 * r["loss_j"] / r["lp_bound_j"], abs=1e-2)


def test_switch_gap_milp_is_exact_and_its_neighbourhood_never_worse():
    # The MILP the gap study trusts equals brute force; restricted to one option per task it
    # prices that plan; the neighbourhood search never reports a plan worse than ours.
    from scipy.optimize import Bounds, LinearConstraint, milp
    from switch_gap_study import decode, exact_model, neighbourhood_case
    from test_lns import pipeline

    from solvers import ConstantTransition
    from solvers.brute import brute_force

    p = pipeline(ConstantTransition(0.1, 2.0), stages=2, mb=2)
    ix = p.index
    D = p.deadline_s("1.15x")
    best_ch, best_e = brute_force(p, D)

    def run(allowed):
        c, A, lo, hi, ub, integ, xo = exact_model(p, D, allowed)
        r = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integ,
                 bounds=Bounds(np.zeros_like(ub), ub))
        al = allowed or [np.arange(k) for k in ix.k]
        return r.fun, decode(r.x, xo, [np.asarray(a) for a in al])

    fun, ch = run(None)
    assert fun == pytest.approx(best_e) and ix.objective(ch) == pytest.approx(best_e)
    assert ix.makespan(ch) <= D * (1 + 1e-9)
    fun, ch = run([np.array([c]) for c in best_ch])
    assert list(ch) == list(best_ch) and fun == pytest.approx(best_e)
    r = neighbourhood_case(p, 10.0, "1.15x", 1)
    assert r["best_vs_fast_pct"] <= 1e-9 and r["gap_with_best_pct"] >= -1e-9


def test_steady_state_holds_on_the_bundled_pipeline():
    # hold plans keep the base outside the held cycles, fit their period, meet the deadline
    import steady_state_holds as sh
    from bench_solvers import P2P_W, idle_priced_switch

    from solvers import load_perseus_profile
    from solvers.fast import solve_fast

    prof = Path(__file__).resolve().parents[1] / "ecal" / "examples" / "pipeline_4x8.csv"
    p = load_perseus_profile(prof, P2P_W, 8, transitions=idle_priced_switch(1e-3))
    D = p.deadline_s("1.2x")
    base = solve_fast(p, D, search_work=2000.0).choice
    h = sh.Holds(p, 4, 8, base, D)
    assert h.levels and [lv[0] for lv in h.levels] == sorted(lv[0] for lv in h.levels)
    for period, clocks in h.levels:
        assert all(t[w] <= period * (1 + 1e-12) for t, w in zip(h.hold_s, clocks))
    slow, fast = h.levels[-1][1], h.levels[0][1]
    assert np.array_equal(h.plan(slow, fast, 3, 8, 0), base)        # every cycle skipped
    ch = h.plan(slow, fast, 2, 1, 1)
    for s, cyc in enumerate(h.cycles):
        for j, pair in enumerate(cyc):
            want = base[list(pair)] if j < 1 or j >= len(cyc) - 1 else [slow[s] if j < 2 else fast[s]] * 2
            assert list(ch[list(pair)]) == list(want)
    for e, c in h.best(1, 1):
        if c is not None:
            assert h.feasible(c) and e == pytest.approx(p.index.objective(c))


def test_bench_switch_lp_splits_the_excess_over_the_bound():
    # at the switch LP's duals: plan − bound = clock regret + priced slack, both ≥ 0, for the
    # fast plan and the brute-force optimum alike
    from bench_switch_lp import clock_regret_j
    from test_lns import pipeline

    from solvers import ConstantTransition
    from solvers.brute import brute_force
    from solvers.fast import solve_fast
    from solvers.hull_lp import HullLP
    from solvers.lagrangian import lagrangian_bound
    from solvers.switch_lp import switch_lp_duals

    p = pipeline(ConstantTransition(0.1, 2.0), stages=2, mb=2)
    D = p.deadline_s("1.1x")
    lp = HullLP(p)
    mu = switch_lp_duals(p, lp.rows, D)
    bound = lagrangian_bound(p, lp, mu, D)[0]
    for ch in (solve_fast(p, D).choice, brute_force(p, D)[0]):
        e = p.index.objective(ch)
        regret = clock_regret_j(p, lp, mu, D, ch)
        assert regret >= -1e-9
        assert e - bound - regret >= -1e-6 * e                    # priced slack


def test_search_spread_runs_each_setting_and_leaves_the_defaults(tmp_path):
    import bench_solvers
    import search_spread

    tool = bench_solvers.shared_dir() / "tools" / "make_perseus_profile.py"
    if not tool.exists():
        pytest.skip(f"the profile generator {tool} is absent (a clone without ../shared)")

    from solvers.options import SolveOptions

    rows = search_spread.main(["--cases", "2x3", "--deadlines", "1.2x", "--seeds", "0,1",
                               "--searches", "16/64,8/32x0.5", "--out", str(tmp_path / "spread")])
    assert search_spread.SHIPPED == SolveOptions()                  # options are values: nothing to restore
    assert [(r[2], r[3], r[4]) for r in rows] == [("16/64", 1.0, 0), ("16/64", 1.0, 1),
                                                  ("8/32", 0.5, 0), ("8/32", 0.5, 1)]
    assert len({r[6] for r in rows}) == 1                           # one bound per deadline
    assert all(r[7] >= -1e-9 for r in rows)                         # no plan below the bound
    assert "| 2x3 | 1.2x | 8/32 | 0.5 | 1 |" in (tmp_path / "spread.md").read_text()


def test_search_spread_portfolio_rows_take_the_cheaper_member_per_seed():
    import search_spread

    (c0, w0), (c1, w1) = search_spread.portfolio_searches()[:2]
    a, b = f"{c0[0]}/{c0[1]}", f"{c1[0]}/{c1[1]}"
    rows = [["8x32", "1.2x", a, w0, 0, 100.0, 99.0, 1.0, 1.0],
            ["8x32", "1.2x", b, w1, 0, 99.5, 99.0, 0.5025, 1.0],
            ["8x32", "1.2x", a, w0, 1, 99.2, 99.0, 0.2016, 1.0],     # seed 1 lacks the member
            ["8x32", "1.2x", b, w1 + 1, 0, 90.0, 99.0, -10.0, 1.0]]  # other work: not a member
    out = search_spread.portfolio_rows(rows)
    assert out == [["8x32", "1.2x", 0, f"{a} x{w0:g} + {b} x{w1:g}", 99.5, 0.5025, f"{b} x{w1:g}"]]
