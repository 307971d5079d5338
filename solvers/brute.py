"""Brute force over all assignments: the test oracle for tiny instances."""

from __future__ import annotations

import itertools
import math

from frontier.errors import InputError

from .feasibility import meets_deadline
from .model import Problem


def brute_force(p: Problem, deadline_s: float, max_assignments: int = 200_000) -> tuple[list[int] | None, float]:
    """Best (choice, energy) over every assignment meeting ``deadline_s`` (None, inf if none)."""
    ix = p.index
    total = math.prod(ix.k)
    if total > max_assignments:
        raise InputError(f"brute force: {total} assignments exceed {max_assignments}")
    best, best_e = None, math.inf
    for ch in itertools.product(*(range(k) for k in ix.k)):
        mk = ix.makespan(ch)
        if not meets_deadline(mk, deadline_s):
            continue
        e = ix.objective(ch, mk)
        if e < best_e - 1e-12:
            best, best_e = list(ch), e
    return best, best_e
