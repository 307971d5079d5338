"""Every output is an input (issue 28): the whole user route through the CLI, each command's
output fed to the next command as written, with no hand edits.

characterize → frontier -o → frontier/compose/check → workload → transitions → plan →
pareto --plan-at → run → export zeus-pfo → campaign → store list/export → frontier.

The only files written by hand are the ones a user authors: the workload (which elements, the
step's shape) and the campaign (what to measure). Everything else is a command's output, and
every JSON output names its format (``"format": "ecal.KIND/N"``) and validates against the
model that declares that format.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = "sm_clock_mhz=1980:1380:-300"
FAST = ["--window-s", "0.2", "--warmup-s", "0.05", "--max-windows", "4"]


def ecal(cwd: Path, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    """Run ``ecal ARGS`` in ``cwd`` as a user would (a fresh process); assert its exit code."""
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    env["ECAL_STATE_DIR"] = str(cwd / ".state")
    r = subprocess.run([sys.executable, "-m", "ecal", *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode in ok, f"ecal {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def fmt(path: Path) -> str:
    """The ``format`` a JSON file names (every file the tool writes names one)."""
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("format"), str), f"{path}: no format key"
    return doc["format"]


def check_declared(folder: Path, foreign: frozenset[str] = frozenset()) -> int:
    """Every JSON file under ``folder`` (but the ``foreign`` ones: another tool's format) names
    a format ``ecal schema`` lists and validates against that kind's declared model (the one
    declaration of its shape); returns how many."""
    from frontier.formats import KINDS, content, model_class, validate

    by_tag = {k.tag: k.name for k in KINDS.values()}
    found = sorted(f for f in folder.rglob("*.json")
                   if ".state" not in f.parts and f.name not in foreign)
    for f in found:
        tag = fmt(f)
        assert tag in by_tag, f"{f}: {tag}"
        _, body = content(str(f), json.loads(f.read_text()), by_tag[tag])
        validate(model_class(by_tag[tag]), body, str(f))
    return len(found)


def test_the_whole_route_feeds_itself(tmp_path: Path) -> None:
    w = tmp_path
    # 1. characterize two elements (a preset renamed with --name keeps its work)
    ecal(w, "characterize", "stage_forward", "--name", "fwd", "--grid", GRID, *FAST,
         "-o", "fwd.json")
    ecal(w, "characterize", "stage_backward", "--name", "bwd", "--grid", GRID, *FAST,
         "-o", "bwd.json")
    assert fmt(w / "fwd.json") == "ecal.signatures/1"

    # 2. frontier -o writes a signature file that every signature reader takes
    ecal(w, "frontier", "fwd.json", "-o", "fwd_frontier.json")
    assert fmt(w / "fwd_frontier.json") == "ecal.signatures/1"
    ecal(w, "frontier", "fwd_frontier.json")
    # compose takes characterization output as it is, compositions given on the command line
    keys = list(json.loads((w / "fwd.json").read_text())["signatures"])
    two = "two=" + json.dumps({"seq": keys[:2]})
    assert "two:" in ecal(w, "compose", "fwd.json", "--expr", two).stdout
    front_keys = list(json.loads((w / "fwd_frontier.json").read_text())["signatures"])
    ecal(w, "compose", "fwd_frontier.json", "--expr", "f=" + json.dumps({"seq": front_keys}))
    # check needs measured composites, which a characterization has not: one clear line
    r = ecal(w, "check", "fwd.json", ok=(2,))
    assert "no composition has a 'measured' value" in r.stderr

    # 3. the workload a user writes names the characterization outputs as they are
    (w / "workload.json").write_text(json.dumps({
        "format": "ecal.workload/1", "name": "chain",
        "elements": {"fwd": "fwd_frontier.json", "bwd": "bwd.json"},
        "shape": {"kind": "1f1b", "stages": 2, "microbatches": 4,
                  "forward": "fwd", "backward": "bwd"},
        "idle_power_w": 75.0, "transitions": {"file": "transitions.json"}}))
    ecal(w, "transitions", "workload.json", "--device", "sim", "-o", "transitions.json")
    assert fmt(w / "transitions.json").startswith("ecal.transitions/")

    # 4. plan, curve, a plan from the curve; each names its format
    ecal(w, "plan", "workload.json", "--deadline", "1.05x", "-o", "plan.json",
         "--schedule", "schedule.json")
    assert fmt(w / "plan.json") == "ecal.plan/1"
    assert fmt(w / "schedule.json") == "ecal.schedule/1"
    ecal(w, "pareto", "workload.json", "--points", "4", "-o", "curve.json")
    assert fmt(w / "curve.json") == "ecal.pareto/1"
    ecal(w, "pareto", "workload.json", "--curve", "curve.json", "--plan-at", "1.07x",
         "-o", "plan_at.json")
    assert fmt(w / "plan_at.json") == "ecal.plan/1"

    # 5. run the plan as written: it names its workload (exit 1 is an honest "missed")
    ecal(w, "run", "plan_at.json", "--device", "sim", "-o", "run.json", ok=(0, 1))
    assert fmt(w / "run.json") == "ecal.run/1"
    assert json.loads((w / "run.json").read_text())["plan"]["format"] == "ecal.execution/1"

    # 6. export to Zeus from the plan and from the schedule
    ecal(w, "export", "zeus-pfo", "plan.json", "-o", "pfo.json")
    ecal(w, "export", "zeus-pfo", "schedule.json", "-o", "pfo_sched.json")

    # 7. a campaign into a store, the store listed and read back as a frontier
    (w / "campaign.json").write_text(json.dumps({
        "format": "ecal.campaign/1", "name": "chain", "device": "sim", "seed": 0,
        "grid": "sm_clock_mhz=1980,1380", "store": "chain.sqlite",
        "protocol": {"window_s": 0.2, "warmup_s": 0.05, "max_windows": 4},
        "elements": ["gemm_bf16_4096"]}))
    ecal(w, "campaign", "campaign.json", "--gpus", "1", "--quiet")
    listed = ecal(w, "store", "list", "chain.sqlite").stdout
    assert "gemm_bf16_4096" in listed
    ecal(w, "store", "export", "chain.sqlite", "-o", "exported.json")
    ecal(w, "frontier", "exported.json")
    assert fmt(w / "exported.json") == "ecal.store-export/1"
    # a filter that matches nothing lists what the store has, and that name works
    r = ecal(w, "frontier", "chain.sqlite", "--gpu-model", "H200", ok=(2,))
    assert "'simulated H200'" in r.stderr
    ecal(w, "frontier", "chain.sqlite", "--gpu-model", "simulated H200", "-o", "store_front.json")
    assert fmt(w / "store_front.json") == "ecal.signatures/1"
    ecal(w, "store", "import", "chain2.sqlite", "store_front.json")

    # 8. every file of ours the route wrote (and the two a user authored) is its model's shape
    assert check_declared(w, foreign=frozenset({"pfo.json", "pfo_sched.json"})) == 13


def test_every_json_the_route_writes_names_its_format(tmp_path: Path) -> None:
    """Each JSON file ``ecal demo`` writes names its format and validates against its model."""
    ecal(tmp_path, "demo", "-o", "demo", ok=(0, 1))
    assert check_declared(tmp_path) > 0
