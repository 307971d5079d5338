"""Pipeline schedule builders (solvers.pipeline): 1F1B, GPipe and Megatron-LM's interleaved
1F1B. Per-device orders against hand-written references, data-flow dependencies, acyclicity,
solvability and a hand-computed makespan."""

from __future__ import annotations

import itertools

import pytest

from solvers import solve
from solvers.pipeline import (
    SCHEDULES,
    gpipe,
    gpipe_order,
    interleaved_1f1b,
    interleaved_order,
    interleaved_table,
    one_f_one_b,
    pipeline,
    pipeline_layout,
    stage_order,
    task_name,
)

F, B = "forward", "backward"


def _opts(t: float):
    """Two options per task: fast/hungry at 1980 MHz, slow/frugal at 1500 MHz."""
    return [dict(time_s=t, energy_j=10 * t, sm_clock_mhz=1980),
            dict(time_s=1.3 * t, energy_j=7 * t, sm_clock_mhz=1500)]


def _uniform(fwd: float, bwd: float):
    return lambda *k: [dict(time_s=fwd if k[-1] == F else bwd, energy_j=1.0)]


# -- per-device orders ---------------------------------------------------------------------

def test_gpipe_order_all_forwards_then_all_backwards():
    assert gpipe_order(1, 3, 3) == [(F, 0), (F, 1), (F, 2), (B, 0), (B, 1), (B, 2)]
    assert gpipe_order(0, 3, 3) == gpipe_order(2, 3, 3)


def test_1f1b_order_reference():
    assert stage_order(0, 2, 3) == [(F, 0), (F, 1), (B, 0), (F, 2), (B, 1), (B, 2)]
    assert stage_order(1, 2, 3) == [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2)]


def test_interleaved_table_matches_megatron_example():
    # Megatron-LM's own example in schedules.py: PP2, N3, M5, VP2
    table = interleaved_table(5, 2, 3)
    assert [m for m, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def test_interleaved_order_reference_s2_m4_v2():
    # hand-derived from Megatron-LM's forward_backward_pipelining_with_interleaving:
    # warm-up 2(S-r-1) + (v-1)N forwards, then 1F1B, then the remaining backwards
    r0 = [(F, 0, 0), (F, 0, 1), (F, 1, 0), (F, 1, 1),
          (F, 0, 2), (B, 1, 0), (F, 0, 3), (B, 1, 1), (F, 1, 2), (B, 0, 0), (F, 1, 3), (B, 0, 1),
          (B, 1, 2), (B, 1, 3), (B, 0, 2), (B, 0, 3)]
    r1 = [(F, 0, 0), (F, 0, 1),
          (F, 1, 0), (B, 1, 0), (F, 1, 1), (B, 1, 1), (F, 0, 2), (B, 0, 0), (F, 0, 3), (B, 0, 1),
          (F, 1, 2), (B, 1, 2), (F, 1, 3), (B, 1, 3),
          (B, 0, 2), (B, 0, 3)]
    assert interleaved_order(0, 2, 4, 2) == r0
    assert interleaved_order(1, 2, 4, 2) == r1


def test_interleaved_order_all_warmup_when_few_microbatches():
    # S=2, M=2, v=2: rank 0's warm-up (2 + 2) covers all 4 forwards
    assert interleaved_order(0, 2, 2, 2) == [(F, 0, 0), (F, 0, 1), (F, 1, 0), (F, 1, 1),
                                             (B, 1, 0), (B, 1, 1), (B, 0, 0), (B, 0, 1)]


def test_interleaved_order_s3_m3_v2():
    # S=3, M=3, N=3, v=2: rank 2 warms up with (v-1)N = 3 forwards
    assert interleaved_order(2, 3, 3, 2) == [
        (F, 0, 0), (F, 0, 1), (F, 0, 2),
        (F, 1, 0), (B, 1, 0), (F, 1, 1), (B, 1, 1), (F, 1, 2), (B, 1, 2),
        (B, 0, 0), (B, 0, 1), (B, 0, 2)]


@pytest.mark.parametrize("bad", [dict(n_chunks=1), dict(group_size=1), dict(group_size=5)])
def test_interleaved_rejects_what_megatron_rejects(bad):
    kw = dict(n_chunks=2, group_size=None) | bad
    with pytest.raises(ValueError):
        interleaved_order(0, 2, 4, kw["n_chunks"], kw["group_size"])


def test_interleaved_rejects_small_last_group():
    with pytest.raises(ValueError, match="mod group size"):
        interleaved_order(0, 3, 7, 2, 3)        # 7 mod 3 = 1 < 3 stages


# -- structure -----------------------------------------------------------------------------

SHAPES = [("1f1b", S, M, 1, None) for S, M in itertools.product((1, 2, 3, 4), (1, 2, 5))]
SHAPES += [("gpipe", S, M, 1, None) for S, M in itertools.product((1, 2, 3), (1, 3, 4))]
SHAPES += [("interleaved-1f1b", S, M, v, N)
           for S, M, v, N in [(2, 2, 2, None), (2, 4, 2, None), (2, 4, 3, None), (3, 6, 2, None),
                              (4, 8, 2, None), (2, 5, 2, 3), (3, 7, 3, 4), (1, 3, 2, None)]]


def _problem(kind, S, M, v, N):
    return pipeline(kind, S, M, _uniform(1.0, 2.0), n_chunks=v, group_size=N, idle_power_w=0.0)


@pytest.mark.parametrize("kind,S,M,v,N", SHAPES)
def test_every_task_once_acyclic_and_data_flow(kind, S, M, v, N):
    order, edges = pipeline_layout(kind, S, M, v, N)
    chunk = kind == "interleaved-1f1b"
    names = [nm for s in order for nm, *_ in order[s]]
    want = {task_name(s, i, m, c if chunk else None)
            for s in range(S) for c in range(v) for i in (F, B) for m in range(M)}
    assert sorted(names) == sorted(want)
    p = _problem(kind, S, M, v, N)        # Problem validates: a cycle would raise
    assert len(p.index.order) == p.n_tasks == S * M * v * 2
    pos = {s: {nm: k for k, (nm, *_) in enumerate(order[s])} for s in order}
    # virtual stage j = c·S + r (1 chunk: j = s)
    vs = [(c, r) for c in range(v) for r in range(S)]
    for j in range(len(vs) - 1):
        (c0, r0), (c1, r1) = vs[j], vs[j + 1]
        for m in range(M):
            f0, f1 = task_name(r0, F, m, c0 if chunk else None), task_name(r1, F, m, c1 if chunk else None)
            b0, b1 = task_name(r0, B, m, c0 if chunk else None), task_name(r1, B, m, c1 if chunk else None)
            assert (f0, f1) in edges and (b1, b0) in edges
    # the last virtual stage's backward follows its forward on its own device
    cl, rl = vs[-1]
    for m in range(M):
        f, b = (task_name(rl, i, m, cl if chunk else None) for i in (F, B))
        assert pos[rl][f] < pos[rl][b]
    # on every device a chunk's backward of m comes after its forward of m (activations kept)
    for s in order:
        for c in range(v):
            for m in range(M):
                f, b = (task_name(s, i, m, c if chunk else None) for i in (F, B))
                assert pos[s][f] < pos[s][b]


def test_one_f_one_b_unchanged_by_the_generic_builder():
    p = one_f_one_b(3, 4, lambda s, i: _opts(1.0 + s))
    assert [t.name for t in p.tasks[:4]] == ["s0/forward/0", "s0/forward/1", "s0/forward/2", "s0/backward/0"]
    assert p.tasks[0].options[0].key == "s0/forward#0"
    assert p.edges[:2] == (("s0/forward/0", "s1/forward/0"), ("s1/backward/0", "s0/backward/0"))


def test_interleaved_names_and_keys():
    p = interleaved_1f1b(2, 4, 2, lambda s, c, i: _opts(1.0))
    assert p.tasks[0].name == "s0v0/forward/0"
    assert {t.device for t in p.tasks} == {"stage0", "stage1"}
    keys = {o.key for t in p.tasks if t.name.startswith("s1v1/backward/") for o in t.options}
    assert keys == {"s1v1/backward#0", "s1v1/backward#1"}


def test_interleaved_options_by_mapping_and_missing_key():
    opts = {(s, c, i): _opts(1.0) for s in range(2) for c in range(2) for i in (F, B)}
    assert interleaved_1f1b(2, 2, 2, opts).n_tasks == 16
    del opts[(1, 1, B)]
    with pytest.raises(ValueError, match="stage 1 chunk 1 backward"):
        interleaved_1f1b(2, 2, 2, opts)


def test_unknown_schedule():
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        pipeline("zb-h1", 2, 2, _uniform(1, 2))
    assert "gpipe" in SCHEDULES


# -- makespans and solving -----------------------------------------------------------------

def test_fastest_makespans_hand_computed():
    # F = 1, B = 2: 1F1B and GPipe take (M + S − 1)(F + B) = 9 for S = M = 2
    assert one_f_one_b(2, 2, _uniform(1.0, 2.0)).fastest_makespan_s() == pytest.approx(9.0)
    assert gpipe(2, 2, _uniform(1.0, 2.0)).fastest_makespan_s() == pytest.approx(9.0)
    # the same model in v = 2 chunks (f = 0.5, b = 1): M(F + B) + (S − 1)(F + B)/v = 6 + 1.5
    half = interleaved_1f1b(2, 2, 2, _uniform(0.5, 1.0))
    assert half.fastest_makespan_s() == pytest.approx(7.5)
    # GPipe, S = 3, M = 2, F = 1, B = 2: (M + S − 1)(F + B) = 12
    assert gpipe(3, 2, _uniform(1.0, 2.0)).fastest_makespan_s() == pytest.approx(12.0)


@pytest.mark.parametrize("kind,kw", [("gpipe", {}), ("interleaved-1f1b", {"n_chunks": 2}),
                                     ("1f1b", {})])
def test_solvers_solve_the_schedules(kind, kw):
    def opts(*k):
        return _opts(2.0 if k[-1] == B else 1.0)
    p = pipeline(kind, 2, 4, opts, idle_power_w=5.0, **kw)
    fast = solve(p, "1.0x")
    slack = solve(p, "1.3x")
    assert fast.makespan_s <= p.fastest_makespan_s() * (1 + 1e-9)
    assert slack.makespan_s <= 1.3 * p.fastest_makespan_s() * (1 + 1e-9)
    assert slack.energy_j <= fast.energy_j + 1e-9
    assert slack.gap <= 0.05


def test_steady_state_flag_reaches_the_problem():
    p = gpipe(2, 2, lambda s, i: _opts(1.0), steady_state=True)
    assert p.steady_state
    assert not gpipe(2, 2, lambda s, i: _opts(1.0)).steady_state
