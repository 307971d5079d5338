"""``ecal schema [KIND]``: the file formats this tool reads and writes.

With no KIND, one line per format: its ``format`` tag (``ecal.KIND/N``, what a file of that
kind names itself), and what it holds. With KIND, the JSON Schema of that format's current
version (indent 2), generated from the model that declares it (:data:`frontier.formats.KINDS`);
docs/formats.md says which commands write and read each one and the older forms still read.

Exit status 0; 2 for a KIND that does not exist or has no declared model yet (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``schema`` to ``subparsers`` (an ``add_subparsers()`` object); returns its parser."""
    p = subparsers.add_parser(
        "schema", help="list the file formats, or print one's JSON Schema",
        description="With no KIND: every file format with its tag (ecal.KIND/N) and what it "
                    "holds. With KIND: that format's JSON Schema (docs/formats.md).")
    p.add_argument("kind", nargs="?", default=None, metavar="KIND",
                   help="a format, e.g. frontier, signatures, plan (omit to list them)")
    p.set_defaults(handler=run)
    return p


def _listing() -> str:
    from frontier.formats import KINDS

    width = max(len(k.tag) for k in KINDS.values())
    lines = [f"{k.tag.ljust(width)}  {k.description}"
             + ("" if k.model else "  (no schema yet)") for k in KINDS.values()]
    return "\n".join(lines + ["", "ecal schema KIND prints one format's JSON Schema."])


def run(args: argparse.Namespace) -> int:
    """List the formats (no ``args.kind``) or print ``args.kind``'s JSON Schema. An unknown
    kind, or one without a model, raises :class:`~frontier.errors.InputError`."""
    from frontier.formats import json_schema

    if args.kind is None:
        sys.stdout.write(_listing() + "\n")
        return 0
    sys.stdout.write(json.dumps(json_schema(args.kind), indent=2) + "\n")
    return 0
