"""The planner's file formats declared once (solvers.format_models): problems, plans and
curves validate through their model; a fault is one line naming the file and field path;
what the current writers write validates, and older forms still read."""

import copy
import json
import math

import pytest

from frontier.errors import FormatError
from frontier.formats import content, validate
from solvers import ConstantTransition, ParetoCurve, Plan, Problem, ProblemError, pareto, solve
from solvers.format_models import ParetoFile, PlanFile, ProblemFile
from solvers.io import load_problem, problem_from_dict, problem_to_dict
from solvers.model import ProblemTooLargeError

MODELS = {"problem": ProblemFile, "plan": PlanFile, "pareto": ParetoFile}


def small() -> Problem:
    a = [(1.0, 10.0), (2.0, 6.0)]
    return Problem.build({"a": ("g0", a), "b": ("g1", a), "c": ("g0", a)},
                         [("a", "b"), ("b", "c")], {"g0": 1.0, "g1": 1.0},
                         {"g0": ConstantTransition(0.1, 2.0)})


@pytest.fixture(scope="module")
def docs() -> dict:
    """A document of each kind, as the current writers write it (through JSON)."""
    p = small()
    plan = solve(p, "1.5x")
    curve = pareto(p.with_(transitions=None), n_points=4, method="fast")   # with dense points
    assert curve.dense
    return {k: json.loads(json.dumps(v)) for k, v in
            (("problem", problem_to_dict(p)), ("plan", plan.to_dict()), ("pareto", curve.to_dict()))}


def read(kind: str, doc, file: str = "f.json"):
    return {"problem": problem_from_dict, "plan": Plan.from_dict,
            "pareto": ParetoCurve.from_dict}[kind](doc, file)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_what_the_writer_writes_validates_and_reads_back(kind, docs):
    _, body = content("f.json", docs[kind], kind)
    validate(MODELS[kind], body, "f.json")
    back = read(kind, docs[kind])
    if kind == "problem":
        again = problem_to_dict(back)
        assert again == {**docs[kind], "name": again["name"]}
    else:
        assert back.to_dict() == docs[kind]


# (kind, where in the document, what to do there, the path the error must name)
def _set(path, value):
    def edit(doc):
        *head, last = path
        for k in head:
            doc = doc[k]
        doc[last] = value
    return edit


def _del(path):
    def edit(doc):
        *head, last = path
        for k in head:
            doc = doc[k]
        del doc[last]
    return edit


FAULTS = {
    # unknown fields
    "problem-unknown-top": ("problem", _set(["colour"], "red"), "colour", "unknown field"),
    "problem-unknown-option": ("problem", _set(["tasks", 1, "options", 0, "enrgy_j"], 1.0),
                               "tasks[1].options[0].enrgy_j", "unknown field"),
    "plan-unknown": ("plan", _set(["tasks", 0, "colour"], 1), "tasks[0].colour", "unknown field"),
    "pareto-unknown": ("pareto", _set(["dense_points"], []), "dense_points", "unknown field"),
    # wrong types
    "problem-type-steady": ("problem", _set(["steady_state"], "yes"), "steady_state", "bool"),
    "problem-type-idle": ("problem", _set(["devices", "g0", "idle_power_w"], "75"),
                          "devices.g0.idle_power_w", "number"),
    "problem-type-edge": ("problem", _set(["edges", 0], ["a"]), "edges[0]", "2"),
    "problem-negative-term": ("problem", _set(["tasks", 0, "options", 0, "terms"],
                                              {"k": {"var_time_s2": -1.0, "var_d_j2": 0.0,
                                                     "dT_dT": 1.0, "dE_dT": 1.0, "dE_dd": 1.0}}),
                              "tasks[0].options[0].terms.k.var_time_s2", "non-negative"),
    "plan-type": ("plan", _set(["n_switches"], "two"), "n_switches", "integer"),
    "plan-type-task": ("plan", _set(["tasks", 1, "option"], 1.5), "tasks[1].option", "integer"),
    "pareto-type": ("pareto", _set(["dense"], {"a": 1}), "dense", "list"),
    # missing required fields
    "problem-missing-tasks": ("problem", _del(["tasks"]), "tasks", "missing"),
    "problem-missing-time": ("problem", _del(["tasks", 0, "options", 1, "time_s"]),
                             "tasks[0].options[1].time_s", "missing"),
    "problem-missing-energy": ("problem", _del(["tasks", 0, "options", 1, "d_j"]),
                               "tasks[0].options[1]", "needs energy_j or d_j"),
    "plan-missing": ("plan", _del(["energy_j"]), "energy_j", "missing"),
    "plan-missing-task": ("plan", _del(["tasks", 0, "label"]), "tasks[0].label", "missing"),
    "pareto-missing": ("pareto", _del(["method"]), "method", "missing"),
    # NaN (a dict built in Python: a JSON file's NaN is refused by read_json first)
    "problem-nan": ("problem", _set(["tasks", 2, "options", 1, "time_s"], math.nan),
                    "tasks[2].options[1].time_s", "finite"),
    "plan-nan": ("plan", _set(["makespan_s"], math.nan), "makespan_s", "finite"),
    "pareto-nan": ("pareto", _set(["wall_s"], math.nan), "wall_s", "finite"),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_a_malformed_document_is_one_line_naming_file_and_field(name, docs):
    kind, edit, path, words = FAULTS[name]
    doc = copy.deepcopy(docs[kind])
    edit(doc)
    with pytest.raises(FormatError) as ei:
        read(kind, doc, "bad.json")
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"bad.json: {path}: "), msg
    assert words in msg, msg


def test_a_bad_plan_inside_a_curve_names_the_curve_and_the_plan(docs):
    doc = copy.deepcopy(docs["pareto"])
    del doc["plans"][1]["gap"]
    with pytest.raises(FormatError, match=r"^c.json:plans\[1\]: gap: missing$"):
        ParetoCurve.from_dict(doc, "c.json")


def test_problem_files_on_disk_name_the_file(tmp_path, docs):
    doc = copy.deepcopy(docs["problem"])
    doc["tasks"][0]["options"][0]["time_s"] = [1]
    f = tmp_path / "p.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=rf"^{f}: tasks\[0\]\.options\[0\]\.time_s: must be a "
                                          r"non-negative number"):
        load_problem(f)


def test_older_forms_still_read(docs):
    # problem: the older identity, no name, options as [time_s, energy_j] pairs, a constant rule
    old = {"schema_version": "ecal.problem/1",
           "devices": {"g0": {"transitions": {"constant": {"time_s": 0.1}}}},
           "tasks": [{"name": "a", "device": "g0", "options": [[1.0, 10.0], [2, 6]]}]}
    p = problem_from_dict(old, "dir/old.json")
    assert p.name == "old.json" and p.index.power["g0"] == 0.0
    assert [(o.time_s, o.energy_j) for o in p.tasks[0].options] == [(1.0, 10.0), (2.0, 6.0)]
    assert p.rule("g0").cost("x", "y") == (0.1, 0.0)
    # plan: older identity, no time_capped or p_meets_deadline; inf written as null
    plan = copy.deepcopy(docs["plan"])
    del plan["format"], plan["time_capped"], plan["p_meets_deadline"]
    plan["schema_version"] = "ecal.plan/1"
    plan["gap"], plan["lower_bound_j"] = None, None
    back = Plan.from_dict(plan)
    assert back.time_capped is False and back.gap == math.inf and back.lower_bound_j == -math.inf
    # plan files ecal run executes carry their workload and whether they are simulated
    Plan.from_dict({**docs["plan"], "simulated": "SIMULATED H200", "workload": {"problem": "p.json"}})
    # curve: dense points without choices (older files)
    curve = copy.deepcopy(docs["pareto"])
    for x in curve["dense"]:
        x.pop("choice", None)
    assert ParetoCurve.from_dict({**curve, "confidence": {"confidence": 0.9}}).dense_choices is None


def test_domain_checks_keep_their_wording(docs):
    doc = copy.deepcopy(docs["problem"])
    doc["edges"].append(["a", "zz"])
    with pytest.raises(FormatError, match="unknown task 'zz'"):
        problem_from_dict(doc, "p.json")
    doc = copy.deepcopy(docs["problem"])
    doc["tasks"][0]["options"][0]["d_j"] = -50.0
    with pytest.raises(FormatError, match="is negative"):
        problem_from_dict(doc, "p.json")
    doc = copy.deepcopy(docs["problem"])
    doc["tasks"][0]["options"][0]["omega"] = {"warp_drive": 9}
    with pytest.raises(FormatError, match=r"^p.json: tasks\[0\]\.options\[0\]: omega: "):
        problem_from_dict(doc, "p.json")
    doc = copy.deepcopy(docs["pareto"])
    doc["dense"][0]["choice"] = [0]
    with pytest.raises(FormatError, match=r"dense\[\]\.choice"):
        ParetoCurve.from_dict(doc, "c.json")


def test_the_task_limit_comes_before_validation():
    doc = {"format": "ecal.problem/1", "tasks": [None] * 11}
    with pytest.raises(ProblemTooLargeError):
        problem_from_dict(doc, "big.json", max_tasks=10)


def test_a_mapping_option_in_python_is_read_by_the_same_declaration():
    with pytest.raises(ProblemError, match=r"task 'a' option 0: enrgy_j: unknown field"):
        Problem.build({"a": ("g0", [{"time_s": 1.0, "enrgy_j": 2.0}])})
    with pytest.raises(ProblemError, match=r"task 'a' option 1: time_s: must be a non-negative"):
        Problem.build({"a": ("g0", [{"time_s": 1.0, "d_j": 2.0}, {"time_s": -1.0, "d_j": 2.0}])})
    p = Problem.build({"a": ("g0", [{"time_s": 1.0, "energy_j": 5.0, "s_w": 2.0, "sd_time_s": 0.1}])})
    o = p.tasks[0].options[0]
    assert (o.d_j, o.var_time_s2) == (3.0, pytest.approx(0.01))
