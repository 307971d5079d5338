"""Campaigns through Ray: a real local Ray cluster (started here, declaring 4 GPUs on this CPU
machine), each task opening a simulated GPU. One cluster for the module; a few tests."""

import json

import pytest

from measure.campaign import parse_campaign, run_campaign
from tests.test_campaign import (
    campaign_doc,
    ecal_child,
    kill_when_paused,
    store_state,
    write_campaign,
)


def _ray_or_skip():
    from measure.campaign import CampaignError, import_ray

    try:
        return import_ray()
    except CampaignError as exc:
        pytest.skip(f"ray is not installed (the 'ray' extra): {exc}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray cluster with 2 CPUs and 4 (declared) H200 GPUs; its address."""
    ray = _ray_or_skip()
    state = tmp_path_factory.mktemp("ray-state")
    with pytest.MonkeyPatch.context() as mp:
        # the raylet and its workers inherit this environment: GPU locks in a private folder
        mp.setenv("ECAL_STATE_DIR", str(state))
        ray.init(num_cpus=2, num_gpus=4, resources={"accelerator_type:H200": 1},
                 include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_ray_campaign_killed_and_resumed_equals_uninterrupted_and_local(tmp_path, cluster):
    doc = {"accelerator_type": "H200"}
    camp = write_campaign(tmp_path / "c8.json", **doc)
    args = ["campaign", str(camp), "--store", "c8.sqlite", "--ray", cluster,
            "--ray-cpus-per-task", "0.5", "--json"]
    marker = tmp_path / "paused"
    kill_when_paused(ecal_child(tmp_path, args, pause_after=6, marker=marker), marker)
    done, rows, _ = store_state(tmp_path / "c8.sqlite", "c8")
    assert len(done) == 6 and rows == 6       # the 7th unit's transaction was rolled back
    again = ecal_child(tmp_path, args)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    summary = json.loads(out)
    assert (summary["executor"], summary["units"], summary["resumed"], summary["measured"]) == \
        ("ray", 16, 6, 10)
    done, rows, content = store_state(tmp_path / "c8.sqlite", "c8")
    assert len(done) == 16 and rows == 16      # every unit committed exactly once
    for rec in done.values():                  # Ray said which GPU; the record keeps it
        mb = rec["measured_by"]
        assert mb["uuid"] == f"SIM-H200-{mb['gpu_index']}" and mb["ray_gpu_ids"] == [str(mb["gpu_index"])]
        assert mb["host"] and mb["node_id"]
    # an uninterrupted campaign through Ray (this process as the driver) stores the same
    ref = run_campaign(parse_campaign(campaign_doc(**doc)), tmp_path / "ref.sqlite",
                       ray_address=cluster, progress=False, ray_cpus_per_task=0.5)
    assert (ref.measured, ref.failed) == (16, {})
    assert store_state(tmp_path / "ref.sqlite", "c8")[2] == content
    # ... and so does the local executor on 4 simulated GPUs
    local = run_campaign(parse_campaign(campaign_doc(**doc)), tmp_path / "local.sqlite", gpus=4,
                         progress=False)
    assert local.measured == 16
    assert store_state(tmp_path / "local.sqlite", "c8")[2] == content


def test_ray_retries_a_unit_whose_gpu_failed(tmp_path, cluster):
    doc = {**campaign_doc(name="flaky"), "elements": ["copy_2GiB", "p2p_send"],
           "simulate": {"fail_once_dir": str(tmp_path / "faults")}}
    res = run_campaign(parse_campaign(doc), tmp_path / "f.sqlite", ray_address=cluster,
                       progress=False, ray_cpus_per_task=0.5)
    assert (res.measured, res.failed) == (4, {})
    assert len(list((tmp_path / "faults").iterdir())) == 4    # every unit failed once first
    doc = {**doc, "name": "no-retries", "max_retries": 0,
           "simulate": {"fail_once_dir": str(tmp_path / "faults2")}}
    res = run_campaign(parse_campaign(doc), tmp_path / "f.sqlite", ray_address=cluster,
                       progress=False, ray_cpus_per_task=0.5)
    assert res.measured == 0 and len(res.failed) == 4 and not res.work_failed
    assert all("simulated fault" in why for why in res.failed.values())
