"""Perseus profiles: the one reader (strict) and the one loader of a Perseus profile CSV.

A profile (CSV ``stage,instruction,frequency,time,energy``; seconds, joules) gives per stage
and instruction the time and energy at each SM frequency; a GPU waiting on pipeline
communication draws the P2P-blocking power (default 75 W), so each row becomes an option with
dynamic energy E - P2P * T (see :mod:`solvers.pipeline`). :func:`load_perseus_profile` builds
the 1F1B problem.
"""

from __future__ import annotations

import os
from typing import Any

from frontier.codec import number_field
from frontier.errors import FormatError
from frontier.files import check_unique_rows, csv_number, read_csv
from frontier.operating_point import OperatingPoint

from .limits import check_tasks
from .model import Option, Problem
from .options import DEFAULT_MAX_TASKS
from .pipeline import INSTRUCTIONS, one_f_one_b, pipeline_task_count

#: The columns of a Perseus profile CSV.
PERSEUS_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")


def _perseus_stage(file: str, row: Any) -> int:
    text = row["stage"].strip()
    try:
        st = int(text)
    except ValueError:
        raise FormatError(file, f"line {row.line}, column stage", f"not an integer: {text!r}") from None
    if st < 0:
        raise FormatError(file, f"line {row.line}, column stage", f"must be >= 0, got {st}")
    return st


def read_perseus_profile(path: str | os.PathLike, p2p_power_w: float = 75.0) -> dict[tuple[int, str], list[Option]]:
    """Options per (stage, instruction) from a Perseus profile CSV, read strictly: UTF-8 with or without
    a BOM, finite frequency and time > 0 and energy >= 0, one row per (stage, instruction,
    frequency). Errors are one-line :class:`FormatError` naming the file, line and column."""
    file = str(path)
    p2p = _option_value(file, "p2p_power_w", p2p_power_w)
    _, rows = read_csv(file, PERSEUS_COLUMNS)
    out: dict[tuple[int, str], list[Option]] = {}
    keyed = []
    for r in rows:
        st = _perseus_stage(file, r)
        inst = r["instruction"].strip()
        if inst not in INSTRUCTIONS:
            raise FormatError(file, f"line {r.line}, column instruction",
                              f"expected forward/backward, got {inst!r}")
        f = csv_number(file, r, "frequency")
        t = csv_number(file, r, "time")
        e = csv_number(file, r, "energy", strict=False)
        keyed.append((r, (st, inst, f), f"stage {st} {inst} at {f:g} MHz"))
        d = e - p2p * t
        if d < 0:
            if d < -1e-6 * e:
                raise FormatError(file, f"line {r.line}, column energy", f"E = {e} J is below the "
                                  f"P2P-blocking power × time = {p2p * t:.6g} J")
            d = 0.0
        out.setdefault((st, inst), []).append(
            Option(t, p2p, d, omega=OperatingPoint(sm_clock_mhz=f), key=f"s{st}/{inst}@{f:g}",
                   label=f"{f:g}MHz"))
    check_unique_rows(file, keyed, "stage, instruction and frequency")
    if not out:
        raise FormatError(file, "$", "no rows")
    stages = sorted({s for s, _ in out})
    if stages != list(range(len(stages))):
        raise FormatError(file, "stage", f"stages must be 0..S-1, got {stages}")
    for s in stages:
        for inst in INSTRUCTIONS:
            if (s, inst) not in out:
                raise FormatError(file, f"stage {s}", f"no {inst} rows")
    return out


def _option_value(file: str, what: str, v: Any) -> float:
    try:
        return number_field(file, what, v)
    except FormatError as exc:   # an option given with the file, not a field in it
        raise FormatError(file, f"option {what}", exc.problem) from None


def load_perseus_profile(path: str | os.PathLike, p2p_power_w: float = 75.0,
                         n_microbatches: int | None = None, transitions: Any = None,
                         max_tasks: int | None = DEFAULT_MAX_TASKS) -> Problem:
    """A 1F1B Problem from a Perseus profile CSV read by :func:`read_perseus_profile`.
    ``n_microbatches`` defaults to 2 x stages (the 4x8 layout of Perseus' examples).
    More than ``max_tasks`` tasks (stages × 2 × microbatches; None: no limit) raise
    :class:`~solvers.model.ProblemTooLargeError` before any task is built."""
    prof = read_perseus_profile(path, p2p_power_w)
    n_stages = 1 + max(s for s, _ in prof)
    if n_microbatches is not None and (isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int)
                                       or n_microbatches < 1):
        raise FormatError(str(path), "option n_microbatches", f"must be an integer >= 1, got {n_microbatches!r}")
    n_mb = n_microbatches or 2 * n_stages
    name = f"{os.path.basename(str(path))}:1f1b-{n_stages}x{n_mb}"
    check_tasks(pipeline_task_count(n_stages, n_mb), max_tasks, f"{path}: 1f1b {n_stages}x{n_mb}")
    return one_f_one_b(n_stages, n_mb, prof, float(p2p_power_w), transitions, name, max_tasks=max_tasks)
