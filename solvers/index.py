"""The integer view of a :class:`~solvers.model.Problem` every solver works on: topological
order, predecessor lists, per-task option arrays, device sequences and the switch matrices
between consecutive same-device tasks, with the vectorised evaluation of an assignment
(makespan, schedule, switch costs, objective). Built once per problem
(:attr:`Problem.index <solvers.model.Problem.index>`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from frontier.dag import find_cycle
from frontier.errors import EnergyCalculusError

from .errors import ProblemError

#: An option index per task: a list or an integer array.
Choice = Sequence[int] | np.ndarray

if TYPE_CHECKING:
    from .model import Problem


class ProblemIndex:
    """Integer view of a :class:`Problem`: topological order, predecessor lists, per-task arrays,
    device sequences and transition matrices between consecutive same-device tasks."""

    def __init__(self, p: Problem):
        self.names = [t.name for t in p.tasks]
        self.pos = {k: i for i, k in enumerate(self.names)}
        n = len(self.names)
        self.n = n
        self.device = [t.device for t in p.tasks]
        devs = list(dict.fromkeys(self.device))
        self.devices = devs + sorted(set(p.idle_power_w) - set(devs))
        self.power = {d: float(p.idle_power_w.get(d, 0.0)) for d in self.devices}
        self.p_total = sum(self.power.values())
        # Per task its option times, ω_devs, energies and effective energies (what a task adds
        # beyond the device's idle power over its duration). Tasks with the same option tuple
        # on one device (a pipeline's microbatches: Problem shares it) share the arrays, which
        # are read-only: 131,072 tasks x 60 options held 2 KB a task in copies.
        shared: dict[tuple[int, str], tuple] = {}
        per_task = []
        for t in p.tasks:
            got = shared.get((id(t.options), t.device))
            if got is None:
                tm = np.array([o.time_s for o in t.options])
                en = np.array([o.energy_j for o in t.options])
                co = en - self.power[t.device] * tm
                for a in (tm, en, co):
                    a.setflags(write=False)
                got = shared[(id(t.options), t.device)] = (tm, [o.omega.dev for o in t.options], en, co)
            per_task.append(got)
        self.time = [g[0] for g in per_task]
        self._omegas = [g[1] for g in per_task]
        self.energy = [g[2] for g in per_task]
        self.cost = [g[3] for g in per_task]
        self.k = [len(t.options) for t in p.tasks]
        dev_seq: dict[str, list[int]] = {d: [] for d in devs}
        for i, d in enumerate(self.device):
            dev_seq[d].append(i)
        self.dev_seq = dev_seq
        edge_set: dict[tuple[int, int], None] = {}
        for a, b in p.edges:
            edge_set[(self.pos[a], self.pos[b])] = None
        self.dev_prev = [-1] * n
        self.dev_next = [-1] * n
        for seq in dev_seq.values():
            for a, b in zip(seq, seq[1:]):
                self.dev_prev[b] = a
                self.dev_next[a] = b
                edge_set.pop((a, b), None)
        self.edges = list(edge_set)          # cross (non device-order) edges
        self.preds: list[list[int]] = [[] for _ in range(n)]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for a, b in self.edges:
            self.preds[b].append(a)
            self.succs[a].append(b)
        self.order = self._topo(p.name)
        # Switch matrices for each consecutive same-device pair (a, b): tau[b], extra[b]
        # (extra = max(ε, P·τ) − P·τ, what the switch costs beyond idle power).
        self.tau: list[np.ndarray | None] = [None] * n
        self.extra: list[np.ndarray | None] = [None] * n
        # Steady state: the wrap pair (last -> first) of each device with two tasks or more;
        # wrap_tau[first], wrap_extra[first] price it as tau/extra do a consecutive pair
        # (None where it never costs anything). Kept apart from tau/extra, whose pairs are
        # always (dev_prev[b], b): the wrap is not a precedence edge (it would be a cycle).
        self.steady_state = bool(p.steady_state)
        self.wrap_prev = [-1] * n
        self.wrap_tau: list[np.ndarray | None] = [None] * n
        self.wrap_extra: list[np.ndarray | None] = [None] * n
        if self.steady_state:
            for seq in dev_seq.values():
                if len(seq) >= 2:
                    self.wrap_prev[seq[0]] = seq[-1]
        self.has_transitions = False
        cache: dict[tuple[str, Any, Any], tuple[float, float]] = {}
        for d, seq in dev_seq.items():
            rule = p.rule(d)
            if rule is None:
                continue
            pw = self.power[d]
            mats: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
            pairs = list(zip(seq, seq[1:]))
            if self.wrap_prev[seq[0]] >= 0:
                pairs.append((seq[-1], seq[0]))
            for a, b in pairs:
                wrap = a == seq[-1] and b == seq[0]
                oa = [o.omega.dev for o in p.tasks[a].options]
                ob = [o.omega.dev for o in p.tasks[b].options]
                mkey = (tuple(oa), tuple(ob))
                if mkey not in mats:         # 1F1B: every pair on a device shares its ω lists
                    mats[mkey] = self._switch_mats(d, rule, pw, oa, ob, cache)
                tau, ext = mats[mkey]
                if tau.any() or ext.any():
                    self.has_transitions = True
                    if wrap:
                        self.wrap_tau[b], self.wrap_extra[b] = tau, ext
                    else:
                        self.tau[b], self.extra[b] = tau, ext

    @staticmethod
    def _switch_mats(d: str, rule: Any, pw: float, oa: list, ob: list,
                     cache: dict) -> tuple[np.ndarray, np.ndarray]:
        """(τ, extra) matrices of switching from options with ω_dev ``oa`` to ``ob`` on ``d``."""
        tau = np.zeros((len(oa), len(ob)))
        ext = np.zeros((len(oa), len(ob)))
        for i, wa in enumerate(oa):
            for j, wb in enumerate(ob):
                if wa == wb:
                    continue
                key = (d, wa, wb)
                c = cache.get(key)
                if c is None:
                    try:
                        c = tuple(float(x) for x in rule.cost(wa, wb))
                    except EnergyCalculusError as exc:      # names the pair already
                        raise ProblemError(f"device {d!r}: {exc}") from None
                    except (TypeError, ValueError) as exc:
                        raise ProblemError(f"device {d!r}: transition {wa.label()} -> "
                                           f"{wb.label()}: {exc}") from None
                    if len(c) != 2 or not all(math.isfinite(x) and x >= 0 for x in c):
                        raise ProblemError(f"device {d!r}: transition {wa.label()} -> "
                                           f"{wb.label()} cost {c!r} must be (time_s >= 0, energy_j >= 0)")
                    cache[key] = c
                tau[i, j] = c[0]
                ext[i, j] = max(c[1], pw * c[0]) - pw * c[0]
        return tau, ext

    def _topo(self, name: str) -> list[int]:
        n = self.n
        succ = [list(s) for s in self.succs]
        for a in range(n):
            if self.dev_next[a] >= 0:
                succ[a].append(self.dev_next[a])
        indeg = [0] * n
        for a in range(n):
            for b in succ[a]:
                indeg[b] += 1
        stack = [i for i in range(n) if indeg[i] == 0][::-1]
        order = []
        while stack:
            v = stack.pop()
            order.append(v)
            for w in succ[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    stack.append(w)
        if len(order) < n:
            cyc = find_cycle(range(n), succ)
            path = " -> ".join(self.names[i] for i in cyc + cyc[:1])
            raise ProblemError(f"{name}: dependencies (with same-device order) form a cycle: {path}")
        return order

    # -- evaluation -------------------------------------------------------------------------
    def fastest_choice(self) -> np.ndarray:
        """Index of each task's fastest option (cheapest among ties)."""
        return np.array([int(np.lexsort((c, t))[0]) for t, c in zip(self.time, self.cost)])

    @cached_property
    def _flat(self):
        """Option times flattened with per-task offsets, and the switch matrices grouped by
        identity (1F1B shares one matrix per device), for vectorised lookups."""
        off = np.zeros(self.n + 1, dtype=int)
        np.cumsum(self.k, out=off[1:])
        tflat = np.concatenate(self.time) if self.n else np.zeros(0)
        groups: dict[int, tuple[np.ndarray, list[int]]] = {}
        for b in range(self.n):
            m = self.tau[b]
            if m is not None:
                groups.setdefault(id(m), (m, []))[1].append(b)
        prev = np.array(self.dev_prev, dtype=int)
        tau_groups = [(m, np.array(bs), prev[np.array(bs)]) for m, bs in groups.values()]
        # the wrap pairs of a steady state (never the same task as a consecutive pair's b)
        tau_groups += [(self.wrap_tau[b], np.array([b]), np.array([self.wrap_prev[b]]))
                       for b in range(self.n) if self.wrap_tau[b] is not None]
        return off[:-1], tflat, tau_groups

    @cached_property
    def time_flat(self) -> tuple[np.ndarray, np.ndarray]:
        """(offset of each task's first option, all option times flattened)."""
        off, tflat, _ = self._flat
        return off, tflat

    @cached_property
    def cost_flat(self) -> np.ndarray:
        """Effective energies of all options, flattened like :attr:`time_flat`'s times."""
        return np.concatenate(self.cost) if self.n else np.zeros(0)

    @cached_property
    def option_owner(self) -> np.ndarray:
        """Task index of each flattened option."""
        return np.repeat(np.arange(self.n), self.k)

    @cached_property
    def switch_free_devices(self) -> frozenset[str]:
        """Devices where no switch costs anything (the steady-state wrap included)."""
        return frozenset(d for d, seq in self.dev_seq.items()
                         if all(self.tau[u] is None and self.wrap_tau[u] is None for u in seq))

    @cached_property
    def switch_free_tasks(self) -> np.ndarray:
        """Tasks on :attr:`switch_free_devices` (sorted)."""
        return np.array(sorted(v for d in self.switch_free_devices for v in self.dev_seq[d]), dtype=int)

    @cached_property
    def stairs(self) -> list[tuple[list[float], list[int], list[float]]]:
        """Per task, its option times ascending, and for each prefix the cheapest option
        (effective energy) among those no slower: the cheapest option within a time limit is
        one ``bisect`` away."""
        st = []
        done: dict[tuple[int, int], tuple] = {}        # tasks that share their arrays share this
        for v in range(self.n):
            key = (id(self.time[v]), id(self.cost[v]))
            got = done.get(key)
            if got is None:
                o = np.argsort(self.time[v], kind="stable")
                c = self.cost[v][o]
                best = np.minimum.accumulate(c)
                new_min = np.r_[True, c[1:] < best[:-1]]          # ties: the faster option
                arg = o[np.maximum.accumulate(np.where(new_min, np.arange(len(o)), 0))]
                got = done[key] = (self.time[v][o].tolist(), arg.tolist(), best.tolist())
            st.append(got)
        return st

    def durations(self, choice: Choice) -> np.ndarray:
        """Duration of each task under ``choice``."""
        off, tflat, _ = self._flat
        return tflat[off + np.asarray(choice, dtype=int)]

    def switch_tau(self, choice: Choice) -> np.ndarray:
        """Switch latency before each task (0 when none); in a steady state a device's first
        task carries the wrap switch from its last task."""
        out = np.zeros(self.n)
        ch = np.asarray(choice, dtype=int)
        for m, bs, prev in self._flat[2]:
            out[bs] = m[ch[prev], ch[bs]]
        return out

    def schedule(self, choice: Choice) -> tuple[np.ndarray, np.ndarray, float]:
        """Earliest start and end of each task and the makespan (ASAP list schedule)."""
        start, end = self.earliest(self.durations(choice), self.switch_tau(choice))
        return np.array(start), np.array(end), max(end) if self.n else 0.0

    def critical_chain(self, start: Sequence[float] | np.ndarray, end: Sequence[float] | np.ndarray,
                       tau: Sequence[float] | np.ndarray,
                       last: int | None = None) -> list[int]:
        """Tasks on one critical chain of a schedule, from ``last`` (default: the task that ends
        last) back to a task that starts at 0 (or after its steady-state wrap switch), walking
        through tight edges (same-device order, with its switch latency, first; then
        dependencies). Tight means within 1e-12 relative to the makespan."""
        if self.n == 0:
            return []
        tol = 1e-12 * max(float(max(end)), 1.0)
        v = int(np.argmax(end)) if last is None else int(last)
        out = []
        while v >= 0:
            out.append(v)
            nxt, ready = -1, -math.inf
            if start[v] > 0:
                # Of the tight predecessors, the one that really binds (latest ready time; two
                # ends a rounding error apart are not a tie); on an exact tie the device order,
                # as frontier.dag_schedule breaks it, so σ_T follows the same chain.
                u = self.dev_prev[v]
                if u >= 0 and abs(end[u] + tau[v] - start[v]) <= tol:
                    nxt, ready = u, end[u] + tau[v]
                for u in self.preds[v]:
                    if abs(end[u] - start[v]) <= tol and end[u] > ready:
                        nxt, ready = u, end[u]
            v = nxt
        return out

    def earliest(self, dur_s: Sequence[float], tau_s: Sequence[float] | None = None) -> tuple[list, list]:
        """ASAP start and end of each task (Python lists) for given durations and switch
        latencies before each task (none when ``tau_s`` is None); durations may be fractional.
        A latency before a device's first task (the steady-state wrap) delays it from 0."""
        # Python floats and lists: scalar numpy indexing would dominate this loop.
        dur = np.asarray(dur_s, dtype=float).tolist()
        tau = [0.0] * self.n if tau_s is None else np.asarray(tau_s, dtype=float).tolist()
        start = [0.0] * self.n
        end = [0.0] * self.n
        preds, dev_prev = self.preds, self.dev_prev
        for v in self.order:
            s = 0.0
            for u in preds[v]:
                if end[u] > s:
                    s = end[u]
            u = dev_prev[v]
            if u >= 0:
                if end[u] + tau[v] > s:
                    s = end[u] + tau[v]
            elif tau[v] > s:
                s = tau[v]
            start[v] = s
            end[v] = s + dur[v]
        return start, end

    @cached_property
    def _levels(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per DAG level (device order included): its tasks and their predecessors, padded
        with the index ``n`` (a column that stays 0)."""
        level = [0] * self.n
        preds = [list(self.preds[v]) + ([self.dev_prev[v]] if self.dev_prev[v] >= 0 else [])
                 for v in range(self.n)]
        for v in self.order:
            level[v] = 1 + max((level[u] for u in preds[v]), default=-1)
        width = max((len(x) for x in preds), default=0) or 1
        pad = np.full((self.n, width), self.n)
        for v, ps in enumerate(preds):
            pad[v, :len(ps)] = ps
        lv = []
        for L in range(max(level) + 1):
            idx = np.array([v for v in range(self.n) if level[v] == L])
            lv.append((idx, pad[idx]))
        return lv

    def batch_makespan(self, dur: np.ndarray) -> np.ndarray:
        """Makespans of many plans at once (rows of task durations; no switch latencies),
        processing the DAG level by level with numpy."""
        end = np.zeros((dur.shape[0], self.n + 1))
        for idx, pp in self._levels:
            end[:, idx] = end[:, pp].max(axis=2) + dur[:, idx]
        return end[:, :self.n].max(axis=1)

    def makespan(self, choice: Choice) -> float:
        """Makespan of ``choice``."""
        return self.schedule(choice)[2]

    def latest(self, choice: Choice, horizon_s: float) -> np.ndarray:
        """Latest finish of each task so that everything ends by ``horizon_s``."""
        return np.array(self.latest_finish(self.durations(choice), horizon_s, self.switch_tau(choice)))

    def latest_finish(self, dur_s: Sequence[float], horizon_s: float,
                      tau_s: Sequence[float] | None = None) -> list:
        """ALAP finish of each task (a Python list) by ``horizon_s`` for given durations and
        switch latencies (none when ``tau_s`` is None); durations may be fractional."""
        dur = np.asarray(dur_s, dtype=float).tolist()
        tau = [0.0] * self.n if tau_s is None else np.asarray(tau_s, dtype=float).tolist()
        lf = [float(horizon_s)] * self.n
        succs, dev_next = self.succs, self.dev_next
        for v in reversed(self.order):
            f = lf[v]
            for w in succs[v]:
                x = lf[w] - dur[w]
                if x < f:
                    f = x
            w = dev_next[v]
            if w >= 0:
                x = lf[w] - dur[w] - tau[w]
                if x < f:
                    f = x
            lf[v] = f
        return lf

    def switch_extra(self, choice: Choice) -> tuple[float, int]:
        """Σ extra switch energy beyond idle power, and the number of switches that cost
        something (time or energy); the steady-state wraps included."""
        tot, n_sw = 0.0, 0
        for b in range(self.n):
            for m, ext, a in ((self.tau[b], self.extra[b], self.dev_prev[b]),
                              (self.wrap_tau[b], self.wrap_extra[b], self.wrap_prev[b])):
                if m is not None:
                    i, j = choice[a], choice[b]
                    if m[i, j] > 0 or ext[i, j] > 0:
                        n_sw += 1
                        tot += ext[i, j]
        return tot, n_sw

    def switch_counts(self, choice: Choice) -> dict[str, int]:
        """Per device, how many times ω_dev changes in one iteration under ``choice``: between
        consecutive tasks, plus (in a steady state) from the last task back to the first.
        Counts changes of the operating point, priced or free."""
        out = {d: 0 for d in self.dev_seq}
        omega = self._omegas
        for d, seq in self.dev_seq.items():
            pairs = list(zip(seq, seq[1:]))
            if self.wrap_prev[seq[0]] >= 0:
                pairs.append((seq[-1], seq[0]))
            out[d] = sum(1 for a, b in pairs if omega[a][int(choice[a])] != omega[b][int(choice[b])])
        return out

    def device_energies_j(self, choice: Choice, makespan_s: float | None = None
                          ) -> dict[str, float]:
        """Per device, its share of :meth:`objective` (J): idle power over the makespan, its
        tasks' energy beyond idle power, and its switches' extra energy (a steady state's
        wrap included). The values sum to ``objective(choice, makespan_s)``."""
        m = self.makespan(choice) if makespan_s is None else makespan_s
        out = {d: self.power[d] * m for d in self.devices}
        for b in range(self.n):
            d = self.device[b]
            out[d] += float(self.cost[b][choice[b]])
            for tau, ext, a in ((self.tau[b], self.extra[b], self.dev_prev[b]),
                                (self.wrap_tau[b], self.wrap_extra[b], self.wrap_prev[b])):
                if tau is not None:
                    out[d] += float(ext[choice[a], choice[b]])
        return out

    def objective(self, choice: Choice, makespan_s: float | None = None) -> float:
        """Total energy of ``choice`` (J) with the device horizon at its makespan."""
        m = self.makespan(choice) if makespan_s is None else makespan_s
        c = sum(float(self.cost[i][choice[i]]) for i in range(self.n))
        return self.p_total * m + c + self.switch_extra(choice)[0]


def constant_switch(p: Problem, u: int, w: int):
    """``(time_s, extra_j, options of u by ω, options of w by ω)`` when every switch between
    consecutive tasks ``u`` → ``w`` costs the same time and extra energy (and staying on one ω
    costs nothing), else None (no switch cost on the pair, or costs that depend on the pair
    of operating points). ``u`` → ``w`` is a consecutive pair (``dev_prev[w] == u``) or, in a
    steady state, a device's wrap pair (``wrap_prev[w] == u``: last task → first)."""
    ix = p.index
    if ix.dev_prev[w] == u:
        tau, ext = ix.tau[w], ix.extra[w]
    elif ix.wrap_prev[w] == u:
        tau, ext = ix.wrap_tau[w], ix.wrap_extra[w]
    else:
        return None
    if tau is None:
        return None
    om_u = [o.omega.dev for o in p.tasks[u].options]
    om_w = [o.omega.dev for o in p.tasks[w].options]
    ids: dict = {}
    iu = np.array([ids.setdefault(om, len(ids)) for om in om_u])
    iw = np.array([ids.setdefault(om, len(ids)) for om in om_w])
    # ProblemIndex leaves same-ω entries at 0 and sets tau only when some entry is not 0, so the
    # pairs with different ω are not empty and all that is left to check is that they agree
    same = iu[:, None] == iw[None, :]
    diff_t, diff_e = tau[~same], ext[~same]
    if np.ptp(diff_t) > 0 or np.ptp(diff_e) > 0:
        return None
    groups_u: dict = {}
    groups_w: dict = {}
    for a, om in enumerate(om_u):
        groups_u.setdefault(om, []).append(a)
    for b, om in enumerate(om_w):
        groups_w.setdefault(om, []).append(b)
    return float(diff_t[0]), float(diff_e[0]), groups_u, groups_w
