"""The demo pipeline end to end on a small configuration (the full one runs in `ecal demo`)."""

from __future__ import annotations

import json

import pytest

from ecal.demo import DemoConfig, report, run_demo, write_demo

SMALL = DemoConfig(n_stages=2, n_microbatches=3, stage_sizes=(1.0, 1.2), clocks_mhz=(1980, 1440),
                   power_limits_w=(700,), comm_sms=(8, 16))


@pytest.fixture(scope="module")
def result():
    return run_demo(SMALL)


def test_plan_meets_deadline_and_beats_baselines(result):
    p = result.plan
    assert p.makespan_s <= p.deadline_s * (1 + 1e-9)
    assert p.energy_j <= result.all_max.energy_j + 1e-9
    if result.best_single is not None:
        assert p.energy_j <= result.best_single.energy_j + 1e-6
    assert 0.0 <= p.gap < 0.05
    assert p.sd_energy_j > 0


def test_options_are_compute_par_send(result):
    # every option of every task is compute (132 - k SMs) ⊕ send (k SMs) on one device
    for t in result.problem.tasks:
        for o in t.options:
            assert o.omega.sm_count in SMALL.comm_sms
            assert "comm" in o.label


def test_writes_every_output_and_labels_simulated(result, tmp_path):
    files = {p.name for p in write_demo(result, tmp_path / "demo")}
    assert files == {"plan.json", "schedule.json", "pareto.json", "signatures.json", "report.txt",
                     "frontiers.png", "timeline.png", "pareto.png"}
    text = (tmp_path / "demo" / "report.txt").read_text()
    assert "SIMULATED" in text and "proven gap" in text
    sched = json.loads((tmp_path / "demo" / "schedule.json").read_text())
    assert sched["simulated"] is True
    assert set(sched["devices"]) == {"stage0", "stage1"}
    first = sched["devices"]["stage0"][0]
    assert {"task", "start_s", "sm_clock_mhz", "power_limit_w", "sm_count"} <= set(first)
    assert "SIMULATED" in json.loads((tmp_path / "demo" / "plan.json").read_text())["simulated"]


def test_report_is_consistent(result):
    text = report(result)
    assert f"{result.plan.energy_j:.2f}" in text
    assert f"{result.all_max.energy_j:.2f}" in text
