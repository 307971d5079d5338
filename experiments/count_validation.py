"""Count the hand-written file validation in the library (issue 28's "lines of hand-written
validation, before and after").

A function counts as hand-written validation when its own body (nested functions counted
separately) raises one of the file-fault errors: ``FormatError`` (a file's field is wrong) or
``ProblemError`` (a planning problem's field is wrong). Reported: such functions, their lines
(``def`` to last line, docstring included) and their raise sites, per package and in total;
plus the lines of the typed models that replaced them (classes deriving from ``Strict``).

Usage::

    python experiments/count_validation.py [ROOT ...]      # default: this checkout

Give an older checkout (``git archive COMMIT | tar -x -C /tmp/before``) to compare.
"""
from __future__ import annotations

import argparse
import ast
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("frontier", "solvers", "measure", "execution", "ecal")
FILE_FAULTS = {"FormatError", "ProblemError"}


@dataclass(frozen=True)
class Count:
    """Validation functions, their lines and raise sites; model classes and their lines."""

    functions: int = 0
    lines: int = 0
    raises: int = 0
    models: int = 0
    model_lines: int = 0

    def __add__(self, o: Count) -> Count:
        return Count(self.functions + o.functions, self.lines + o.lines, self.raises + o.raises,
                     self.models + o.models, self.model_lines + o.model_lines)


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc
    if isinstance(exc, ast.Call):
        exc = exc.func
    if isinstance(exc, ast.Attribute):
        return exc.attr
    return exc.id if isinstance(exc, ast.Name) else None


def _own_raises(fn: ast.AST) -> int:
    """File-fault raise sites in ``fn``'s body, not in functions nested inside it."""
    n, stack = 0, list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Raise) and _raised_name(node) in FILE_FAULTS:
            n += 1
        stack.extend(ast.iter_child_nodes(node))
    return n


def count_file(path: Path) -> Count:
    """The :class:`Count` of one source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    c = Count()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            r = _own_raises(node)
            if r:
                c += Count(1, (node.end_lineno or node.lineno) - node.lineno + 1, r)
        elif isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", None)) == "Strict" or
                (isinstance(b, ast.Name) and b.id.endswith(("File", "Model")))
                for b in node.bases):
            c += Count(models=1, model_lines=(node.end_lineno or node.lineno) - node.lineno + 1)
    return c


def count_tree(root: Path) -> dict[str, Count]:
    """Per package under ``root``: the summed :class:`Count` of its ``.py`` files."""
    out: dict[str, Count] = Counter()  # type: ignore[assignment]
    for pkg in PACKAGES:
        total = Count()
        for f in sorted((root / pkg).rglob("*.py")):
            total += count_file(f)
        out[pkg] = total
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="*", default=[str(Path(__file__).resolve().parents[1])])
    args = ap.parse_args(argv)
    print("| checkout | package | validation functions | lines | raise sites | models | model lines |")
    print("|---|---|---|---|---|---|---|")
    for root in args.roots:
        per = count_tree(Path(root))
        total = Count()
        for pkg, c in per.items():
            total += c
            print(f"| {root} | {pkg} | {c.functions} | {c.lines} | {c.raises} | {c.models} | "
                  f"{c.model_lines} |")
        print(f"| {root} | **all** | {total.functions} | {total.lines} | {total.raises} | "
              f"{total.models} | {total.model_lines} |")


if __name__ == "__main__":
    main()
