"""``ecal check --pairs`` on co-runs measured elsewhere (issue 30): an interaction table or a
signature file of co-runs, held against the elements measured alone (``--signatures``)."""

from __future__ import annotations

import json

import pytest

import measure
from ecal import cli
from frontier.insensitivity import runtime_test
from frontier.interaction import InteractionEntry, InteractionTable, PairKey, Provenance
from frontier.interaction_io import save_interaction_table
from frontier.io import save_signatures
from frontier.operating_point import OperatingPoint
from frontier.pareto import signature_to_dict
from frontier.signature import Signature
from measure.joint import JointPair, characterize_pairs
from measure.sim import PRESETS, SimulatedGPU

OMEGA = OperatingPoint(power_limit_w=500.0)
VT, VE = 1e-6, 0.25


def _sig(name, t, d, sm, **kw):
    return Signature(name, s_w=100.0, time_s=t, d_j=d, var_time_s2=VT, var_energy_j2=VE,
                     n=8, omega=OMEGA.with_(sm_count=sm), **kw)


def _alone():
    return {"a@64SM": _sig("a", 1.0, 50.0, 64), "b@64SM": _sig("b", 0.5, 20.0, 64),
            "c@64SM": _sig("c", 0.5, 20.0, 64)}


def _coruns():
    """a ∥ b exactly as ⊕ predicts (T 1.0 s, E = 100·1.0 + 50 + 20 = 170 J); a ∥ c 30 % slower."""
    ok = Signature("a||b@64+64SM", s_w=100.0, time_s=1.0, d_j=70.0, var_time_s2=VT,
                   var_energy_j2=VE, n=8, omega=OMEGA, meta={"sm_total": 132})
    slow = ok.with_(name="a||c@64+64SM", time_s=1.3)
    prov = Provenance("NVIDIA H200 (nvml:0)", False, recorded_utc="2026-12-05T12:00:00Z")
    return [InteractionEntry(PairKey.of("a", 64, "b", 64, OMEGA), ok, prov),
            InteractionEntry(PairKey.of("a", 64, "c", 64, OMEGA), slow, prov)]


@pytest.fixture
def files(tmp_path):
    table = tmp_path / "corun.interactions.json"
    save_interaction_table(table, InteractionTable(tuple(_coruns()), "measured on an H200"))
    alone = tmp_path / "alone.json"
    save_signatures(alone, _alone(), {"meta": {"simulated": False}})
    return table, alone


def _check(capsys, *argv):
    rc = cli.main(["check", "--pairs", *map(str, argv), "--json"])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if out.out else None), out.err


def test_an_interaction_table_is_checked_against_the_alone_signatures(files, capsys):
    table, alone = files
    rc, doc, _ = _check(capsys, table, "--signatures", alone)
    assert rc == 1 and doc["measured"] is True and doc["simulated"] is False
    assert doc["files"] == [str(table), str(alone)]
    assert doc["may_use_reduction"] == ["a@64SM -> b@64SM"]
    assert doc["characterize_jointly"] == ["a@64SM -> c@64SM"]
    ok, slow = doc["pairs"]
    assert ok["entry"] is None and slow["runtime"]["verdict"] == "SENSITIVE on T and E"
    # exactly the runtime test on the same signatures (⊕ at the null context, Eq. 13 allowance)
    al, (e_ok, _) = _alone(), _coruns()
    want = runtime_test(al["a@64SM"], al["b@64SM"], e_ok.signature, sm_total=132,
                        name=e_ok.key.label()).to_dict()
    assert json.loads(json.dumps(want)) == ok["runtime"]
    rc, _, _ = _check(capsys, table, "--signatures", alone, "--alpha", "0.05")
    assert rc == 1
    # the text report names both and says measured, not simulated
    assert cli.main(["check", "--pairs", str(table), "--signatures", str(alone)]) == 1
    out = capsys.readouterr().out
    assert "measured co-runs" in out and "SIMULATED" not in out and "CHARACTERIZE JOINTLY" in out


def test_a_signature_file_with_joint_signatures_needs_no_table(tmp_path, capsys):
    sigs = dict(_alone())
    for e in _coruns():
        m = [{"element": x.element, "sm_count": x.sm_count} for x in e.key.members]
        sigs[e.signature.name] = e.signature.with_(meta={**e.signature.meta, "joint": {"members": m}})
    path = tmp_path / "all.json"
    save_signatures(path, sigs)
    rc, doc, _ = _check(capsys, path)
    assert rc == 1 and doc["may_use_reduction"] == ["a@64SM -> b@64SM"]
    assert doc["characterize_jointly"] == ["a@64SM -> c@64SM"]


def test_a_member_measured_nowhere_alone_is_named(files, tmp_path, capsys):
    table, _ = files
    part = tmp_path / "part.json"
    save_signatures(part, {k: v for k, v in _alone().items() if k != "c@64SM"})
    rc, _, err = _check(capsys, table, "--signatures", part)
    assert rc == 2 and err.strip().count("\n") == 0
    assert "'c'" in err and "64 SMs" in err and "--signatures" in err


def test_signatures_with_a_pair_workload_is_refused(capsys):
    rc, _, err = _check(capsys, "ecal/examples/h200_pairs.json", "--signatures", "x.json")
    assert rc == 2 and "--signatures goes with measured co-runs" in err


def test_the_whole_route_on_the_simulator(tmp_path, capsys):
    """Alone at the split (ecal characterize -o), jointly (characterize_pairs), then checked:
    the verdict is the runtime test of those very measurements."""
    dev = SimulatedGPU(seed=5)
    proto = measure.Protocol(window_s=0.2, min_windows=3, max_windows=8, warmup_s=0.05)
    fwd, send = PRESETS["stage_forward"], PRESETS["p2p_send"]
    res = [measure.characterize(w, device=dev, grid=f"sm_count={sm}", protocol=proto, name=n,
                                progress=None)
           for n, w, sm in (("stage_forward", fwd, 112), ("p2p_send", send, 16))]
    measure.save_characterizations(tmp_path / "alone.json", res)
    table = characterize_pairs(dev, [JointPair("stage_forward", fwd, "p2p_send", send, ((112, 16),))],
                               protocol=proto, progress=None)
    save_interaction_table(tmp_path / "t.json", table)
    rc, doc, _ = _check(capsys, tmp_path / "t.json", "--signatures", tmp_path / "alone.json")
    (entry,) = table.entries
    want = runtime_test(res[0].signatures[0], res[1].signatures[0], entry.signature,
                        sm_total=132, name=entry.key.label())
    assert doc["simulated"] is True and len(doc["pairs"]) == 1
    assert doc["pairs"][0]["runtime"] == json.loads(json.dumps(want.to_dict()))
    assert rc == (0 if want.insensitive else 1)
    # the co-run is in the store form too: its signature round-trips into a signature file
    assert signature_to_dict(entry.signature)["meta"]["joint"]["members"][0]["sm_count"] in (112, 16)
