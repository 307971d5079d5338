"""Ready power drift (issue 30): re-measured during long sweeps, carried as σ_s (``var_s_w2``)
in signatures and propagated like σ_T and σ_d through ⊗, ⊕, ⊕multi, repeat and dag; a drift
beyond tolerance is flagged."""

from __future__ import annotations

import json
import logging
import math
import statistics

import pytest

from frontier.compose import par, par_multi, repeat, seq
from frontier.dag import dag
from frontier.errors import InputError, InvalidSignatureError
from frontier.pareto import signature_from_dict, signature_to_dict
from frontier.signature import Signature
from measure.characterize import characterize, save_characterizations
from measure.protocol import Protocol
from measure.ready_drift import ReadyDrift, ReadyRecheck
from measure.sim import SimulatedGPU, preset
from measure.sweep import ReadyPowerCache, sweep

FAST = Protocol(window_s=0.3, min_windows=2, max_windows=3, warmup_s=0.05, ready_windows=1)
SM_GRID = "sm_count=132,120,104,88,72,56,40"


class DriftingGPU(SimulatedGPU):
    """The simulated H200 whose ready power climbs ``w_per_s`` watts per second of virtual
    time (as the real H200's did: 119.6 W, then 127.6 W an hour later)."""

    def __init__(self, w_per_s: float, **kw):
        self.w_per_s = 0.0  # the base class reads ready power while it initializes
        super().__init__(**kw)
        self.w_per_s = w_per_s

    def _ready_w(self) -> float:
        drift_w = self.w_per_s * self.time_s() if self.w_per_s else 0.0
        return super()._ready_w() + drift_w


# -- σ_s through the algebra: hand-worked values -------------------------------------------------

def _leaf(name, t, var_s=25.0, dev="gpu0"):
    return Signature(name, s_w=100.0, time_s=t, d_j=10.0, var_s_w2=var_s, devices={dev})


def test_a_leaf_keeps_its_energy_error_and_carries_sigma_s():
    a = _leaf("a", 2.0)
    plain = Signature("a", s_w=100.0, time_s=2.0, d_j=10.0)
    assert a.var_energy_j2 == plain.var_energy_j2 == 0.0 and a.sd_s_w == 5.0
    (st,) = a.static_terms.values()
    assert (st.var_s_w2, st.dE_ds, st.dd_ds) == (25.0, 0.0, -2.0)
    assert a.key != plain.key and not plain.static_terms       # a known σ_s is part of identity
    with pytest.raises(InvalidSignatureError, match="var_s_w2"):
        Signature("x", s_w=1.0, time_s=1.0, d_j=1.0, var_s_w2=-1.0)


def test_seq_keeps_energy_error_and_averages_sigma_s():
    c = seq(_leaf("a", 2.0), _leaf("b", 1.0))
    assert c.var_energy_j2 == 0.0                       # E = E_a + E_b: no s in it
    assert c.var_s_w2 == pytest.approx(25.0 * (4 + 1) / 9)   # s = (2 s_a + s_b) / 3


def test_par_counts_static_power_once_so_sigma_s_reaches_energy():
    # E = s_a·T + d_a + d_b = E_a + E_b − s_b·T_b: ∂E/∂s_b = −T_b = −1 s, ∂E/∂s_a = 0
    c = par(_leaf("a", 2.0), _leaf("b", 1.0))
    assert c.var_energy_j2 == pytest.approx(1.0 * 25.0)
    assert c.var_s_w2 == pytest.approx(25.0)            # s = s_a


def test_par_multi_idle_device_pays_its_uncertain_static_power():
    # E = (s_a + s_b)·2 + d_a + d_b: ∂E/∂s_a = 2 − 2 = 0, ∂E/∂s_b = 2 − 1 = 1 s (b idles 1 s)
    c = par_multi(_leaf("a", 2.0, dev="gpu0"), _leaf("b", 1.0, dev="gpu1"))
    assert c.var_energy_j2 == pytest.approx(25.0)
    assert c.var_s_w2 == pytest.approx(50.0)


def test_one_shared_measurement_counts_k_squared_and_repeat_agrees():
    a = _leaf("a", 1.0)
    twice = par(a, seq(a, a))           # the same leaf: its σ_s error is shared
    # s = s_a (dominant: seq(a, a)); E = s·2 + 3 d → ∂E/∂s = 2 − 3 = −1 s
    assert twice.var_energy_j2 == pytest.approx(25.0)
    r, s3 = repeat(a, 3), seq(a, a, a)
    assert r.static_terms == s3.static_terms and r.var_s_w2 == s3.var_s_w2 == pytest.approx(25.0)


def test_dag_carries_the_tasks_sigma_s():
    a, b = _leaf("a", 1.0), _leaf("b", 2.0)
    c = dag({"a": a, "b": b}, [("a", "b")])
    assert c.var_s_w2 == pytest.approx(seq(a, b).var_s_w2)
    assert set(c.static_terms) == {a.key, b.key}


def test_sigma_s_survives_the_json_codec():
    c = par(_leaf("a", 2.0), _leaf("b", 1.0))
    d = json.loads(json.dumps(signature_to_dict(c)))
    assert d["sd_s_w"] == pytest.approx(5.0) and set(d["static_terms"]) == set(c.static_terms)
    back = signature_from_dict(d)
    assert back.var_s_w2 == c.var_s_w2 and back.static_terms == c.static_terms
    assert par(back, _leaf("z", 0.5)).var_energy_j2 == par(c, _leaf("z", 0.5)).var_energy_j2
    leaf = signature_from_dict({"s_w": 100, "time_s": 1, "energy_j": 110, "sd_s_w": 3})
    assert leaf.var_s_w2 == 9.0
    plain = signature_to_dict(Signature("p", s_w=1.0, time_s=1.0, d_j=1.0))
    assert "sd_s_w" not in plain and "var_s_w2" not in plain       # files without σ_s unchanged


# -- re-measured during a sweep ------------------------------------------------------------------

def test_drift_rules():
    d = ReadyDrift("default", (119.6, 127.6), 0.02)       # the real H200, an hour apart
    assert d.sigma_s_w == pytest.approx(8.0 / math.sqrt(2))
    assert d.spread == pytest.approx(8.0 / 123.6) and d.flagged
    assert not ReadyDrift("x", (120.0, 121.0), 0.02).flagged
    with pytest.raises(InputError):
        ReadyRecheck(every_s=0.0)


def test_a_drifting_device_is_rechecked_carried_as_sigma_s_and_flagged(caplog):
    dev = DriftingGPU(0.5, seed=3)
    caplog.set_level(logging.WARNING, logger="measure.sweep")
    res = sweep(dev, {None: preset("gemm_bf16_8192")}, "gemm", grid=SM_GRID, protocol=FAST,
                ready_recheck=ReadyRecheck(every_s=2.0, tolerance=0.02))
    (label, d), = res.meta["ready_drift"].items()
    readings = d["readings_w"]
    assert len(readings) >= 3 and readings == sorted(readings)      # re-measured, climbing
    assert d["sigma_s_w"] == pytest.approx(statistics.stdev(readings))
    assert d["flagged"] is True and d["spread"] > 0.02
    # each point was measured against the latest reading, and carries σ_s
    assert all(s.s_w in readings for s in res.signatures)
    assert [s.s_w for s in res.signatures] == sorted(s.s_w for s in res.signatures)
    assert len({s.s_w for s in res.signatures}) > 1
    assert all(s.var_s_w2 == pytest.approx(d["sigma_s_w"] ** 2) for s in res.signatures)
    msg = [r.getMessage() for r in caplog.records if "drifted" in r.getMessage()]
    assert len(msg) == 1 and "beyond the 2% tolerance" in msg[0] and label in msg[0]


def test_a_steady_device_gets_no_sigma_s_and_no_flag():
    res = sweep(SimulatedGPU(seed=3), {None: preset("gemm_bf16_8192")}, "gemm", grid=SM_GRID,
                protocol=FAST, ready_recheck=ReadyRecheck(every_s=2.0))
    # the simulator repeats its calibration exactly: nothing to carry or report
    assert "ready_drift" not in res.meta and all(s.var_s_w2 == 0.0 for s in res.signatures)


def test_no_recheck_and_short_sweeps_keep_one_reading():
    for rc in (ReadyRecheck(every_s=None), ReadyRecheck()):      # off, and the 600 s default
        res = sweep(DriftingGPU(0.5, seed=3), {None: preset("gemm_bf16_8192")}, "gemm",
                    grid=SM_GRID, protocol=FAST, ready_recheck=rc)
        assert "ready_drift" not in res.meta and all(s.var_s_w2 == 0 for s in res.signatures)


@pytest.mark.parametrize("age_s", [None, 3600.0])
def test_a_resumed_sweep_rechecks_a_value_read_long_ago(tmp_path, age_s):
    path = tmp_path / "r.jsonl"
    dev = DriftingGPU(0.5, seed=3)
    sweep(dev, {None: preset("gemm_bf16_8192")}, "gemm", grid="sm_count=132,120",
          protocol=FAST, results_path=str(path))
    if age_s is not None:        # the first run was an hour ago
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        for r in recs:
            if r["kind"] == "ready":
                r["time_unix_s"] -= age_s
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = sweep(dev, {None: preset("gemm_bf16_8192")}, "gemm", grid=SM_GRID, protocol=FAST,
                results_path=str(path))
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    kinds = [(r["kind"], r.get("source")) for r in recs]
    assert res.resumed == 2
    if age_s is None:            # resumed at once: the file's value is still fresh
        assert ("ready", "recheck") not in kinds and "ready_drift" not in res.meta
        return
    # re-measured before the first new point (after the two resumed ones)
    assert kinds.index(("ready", "recheck")) == kinds.index(("point", None)) + 2
    (d,) = res.meta["ready_drift"].values()
    assert len(d["readings_w"]) == 2 and d["readings_w"][1] > d["readings_w"][0]
    assert all(s.var_s_w2 > 0 for s in res.signatures)


def test_a_campaign_rechecks_a_stale_shared_calibration_and_writes_the_drift(tmp_path):
    dev, cache = DriftingGPU(0.5, seed=3), ReadyPowerCache()
    rc = ReadyRecheck(every_s=5.0)
    works = [("gemm", preset("gemm_bf16_8192")), ("copy", preset("copy_2GiB"))]
    results = [characterize(w, device=dev, grid=SM_GRID, protocol=FAST, name=n, ready_cache=cache,
                            ready_recheck=rc) for n, w in works]
    assert cache.calibrations == 1
    # the second element starts from the first one's latest reading, not the campaign's first
    first_copy = results[1].signatures[0].s_w
    assert first_copy >= results[0].meta["ready_drift"]["default"]["readings_w"][-1]
    save_characterizations(tmp_path / "sigs.json", results)
    meta = json.loads((tmp_path / "sigs.json").read_text())["meta"]
    assert set(meta["ready_drift"]) == {"gemm@default", "copy@default"}
