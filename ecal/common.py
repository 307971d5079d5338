"""Helpers every ``ecal`` command handler shares: the usage error, the output-path checks
made before any work, and :func:`finish` (commit the staged files, then print).

Here, not in :mod:`ecal.commands`, so that ``commands`` and the ``cmd_*`` modules each import
this and never each other.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from frontier.errors import InputError

from .output import Outputs, check_distinct, check_image_path, check_output_path, json_text

__all__ = ["UsageError", "finish", "check_outputs", "check_finite_floats", "element_of", "add_context_arguments"]


class UsageError(InputError):
    """A bad command-line value (reported as a one-line error, exit code 2)."""


def finish(args: argparse.Namespace, out: Outputs, doc: Callable[[], Any],
            text: Callable[[], str]) -> int:
    """Write the staged files (all or none), say where they went (stderr), then print the
    result (``doc()`` as JSON with ``--json``, else ``text()``).

    Files come first, so a reader that goes away early (``| head -1``) never costs a file."""
    shown = json_text(doc()) if args.json else text()
    for p in out.commit():
        print(f"wrote {p}", file=sys.stderr)
    print(shown)
    sys.stdout.flush()    # a broken pipe surfaces here, after the files are safe
    return 0


def check_outputs(args: argparse.Namespace, *options: str, inputs: tuple[str, ...] = ()) -> None:
    """Check the output paths given for ``options`` (e.g. ``"--plot"``) before any work; none
    may name one of the ``inputs`` (``ecal frontier s.json -o s.json`` would replace the
    measured points with the frontier's)."""
    given = {}
    for opt in options:
        dest = "output" if opt == "-o" else opt.lstrip("-").replace("-", "_")
        path = getattr(args, dest, None)
        if path is not None:
            (check_image_path if opt == "--plot" else check_output_path)(path, opt)
            given[opt] = path
            for src in inputs:
                if src is not None and os.path.realpath(path) == os.path.realpath(src):
                    raise UsageError(f"{opt} {path} is the input file: it would be replaced; "
                                     "write to another file")
    check_distinct(given)


def check_finite_floats(args: argparse.Namespace) -> None:
    """Every float option must be a finite number: ``--transition-time-s nan`` is an error,
    not a value every comparison silently ignores."""
    for dest, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"--{dest.replace('_', '-')} must be a finite number, got {value}")


def element_of(key: str) -> str:
    """Element name of a signature-file key: ``gemm@1980MHz/700W`` → ``gemm``.

    Characterization writes one signature per operating point under ``element@ω`` keys; every
    point of one element shares the part before ``@``.
    """
    return key.split("@", 1)[0]


def add_context_arguments(p: argparse.ArgumentParser) -> None:
    """``--contexts FILE`` and ``--context-entry`` (``ecal plan``, ``ecal tune``)."""
    p.add_argument("--contexts", default=None, metavar="FILE",
                   help="compose every plan with its thermal entry context: an ecal.contexts/1 file "
                        "(ecal contexts WORKLOAD -o FILE) with the workload's elements at two or more "
                        "entry temperatures; the deadline is kept in context, and the plan records "
                        "each task's entry temperature (or null)")
    p.add_argument("--context-entry", default="periodic", metavar="ENTRY",
                   help="with --contexts: the first task's entry on each device: periodic (steps back "
                        "to back, as ecal run runs them; default), cold, or a temperature in °C")
