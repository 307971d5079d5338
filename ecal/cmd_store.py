"""``ecal store import|export|list``: the SQLite results store (:mod:`measure.store`) from the
command line.

``ecal store import STORE FILE [FILE ...]`` adds the points of signature files (``ecal
characterize -o``, ``ecal import``, workbooks, ``ecal characterize --json`` documents, store
exports) and results logs (``--results`` JSON lines), told apart by their content. STORE (a
``.sqlite``, ``.db`` or ``.sqlite3`` file) is created when missing.

* **Nothing twice.** A point's key is its element, κ, θ, ω, GPU model, UUID, driver, protocol
  and host. A key already stored holding the same signature is "already present" and left as
  it is (re-importing a file changes nothing); one holding a different measurement is kept
  and reported, unless ``--replace`` takes the file's. The command says "N added, M already
  present" per file and in all.
* **Key fields.** Each point's GPU model, UUID, driver, protocol and host are what its file
  records (a results log's header; a signature's metadata; a store export's ``store``
  block). ``--gpu-model``, ``--uuid``, ``--driver``, ``--protocol`` (a JSON object of protocol
  settings) and ``--host`` fill in a field the file does not record; one that contradicts what
  the file records is an error (a GPU model by :func:`~measure.store.model_matches`), so
  simulated and real measurements, or two cards, are never merged by a flag. A point whose
  GPU model is recorded nowhere needs ``--gpu-model``.
* **All or nothing.** Every file is read and every key resolved before the store is opened,
  and all points go in one transaction: a missing or malformed file, a wrong schema, a missing
  GPU model, Ctrl-C or a kill leaves the store as it was (exit 2, or 130 when interrupted). A
  results log whose last line was cut short by a killed sweep is read without that line (a
  warning says so), as a resumed sweep would.

``ecal store export STORE -o OUT`` writes the store's points, filtered by ``--element``,
``--gpu-model``, ``--uuid`` and ``--host``, as a signature file (``--format signatures``, the default
unless OUT ends in ``.jsonl``) or as a results log (``--format results-log``: one element on
one card under one protocol). The file is written to a temp file and renamed into place, so an
existing OUT is replaced whole or not at all. A signature-file export carries every key field
and campaign unit (its ``store`` block), so importing it into an empty store gives the same
:meth:`~measure.store.ResultsStore.contents`; a results log has no place for campaigns (its
points come back with their results-file point keys as units).

``ecal store list STORE`` prints, per GPU model and element, the points, the campaigns and
campaign units that stored them, the hosts and the UUIDs; then each campaign's units.

A point with a number that is not finite (``energy_j`` = s·T + d overflowing included) is
refused at import, naming the file and the point (nothing of that import is added). A stored
row that cannot be decoded (written before that check, or damaged) is skipped by ``export``
and ``ecal frontier STORE`` with an ``ecal: warning:`` line naming it; the other rows are
read. A damaged store or a full disk is one line naming the store (exit 2).

Exit status 0 on success, 2 on bad input (one line on stderr; no file written, the store
unchanged), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: What ``ecal store import --help`` says about duplicates, key fields and failures.
IMPORT_RULES = """Add the points of signature files and results logs to STORE (created when missing).

nothing twice: a point is keyed by element, kappa, theta, omega, GPU model, UUID, driver,
  protocol and host. A key already stored with the same signature is "already present" and
  left as it is, so importing a file again changes nothing; a key holding a different
  measurement keeps the stored one (reported) unless --replace takes the file's.
key fields: GPU model, UUID, driver, protocol and host are what the file records (a results
  log's header, a signature's metadata, a store export's "store" block). The flags fill in a
  field the file does not record; a flag that contradicts the file is an error. A point whose
  GPU model is recorded nowhere needs --gpu-model.
all or nothing: every file is read and checked before the store is opened, and all points go
  in one transaction: a bad file, a missing GPU model, Ctrl-C or a kill leaves the store as it
  was (exit 2, 130 when interrupted). A results log's last line cut short by a killed sweep is
  left out (with a warning), as a resumed sweep would."""

#: Key fields the import flags fill in, by flag.
FILL_FIELDS = ("gpu_model", "uuid", "driver", "protocol", "host")
FORMATS = ("signatures", "results-log")


def add_store_parser(sub: Any, formatter_class: Any = argparse.RawDescriptionHelpFormatter
                     ) -> argparse.ArgumentParser:
    """Add the ``store`` subcommand (with ``import``, ``export``, ``list``) to ``sub`` (the
    ``add_subparsers`` object of ``ecal``); its handler is :func:`cmd_store`."""
    p = sub.add_parser("store", formatter_class=formatter_class,
                       help="import into, export from and list a results store (.sqlite)",
                       epilog="examples:\n"
                              "  ecal store import runs.sqlite g.json sweep.jsonl\n"
                              "  ecal store import runs.sqlite v100.json --gpu-model V100 --host lab1\n"
                              "  ecal store export runs.sqlite -o h200.json --gpu-model H200\n"
                              "  ecal store export runs.sqlite -o g.jsonl --element gemm_bf16_8192\n"
                              "  ecal store list runs.sqlite\n"
                              "see ecal store import --help for how duplicates and key fields are treated")
    p.set_defaults(handler=cmd_store)
    ss = p.add_subparsers(dest="store_command", metavar="ACTION", required=True)

    q = ss.add_parser("import", formatter_class=formatter_class,
                      help="add signature files and results logs (nothing twice, all or nothing)",
                      description=IMPORT_RULES)
    q.add_argument("store", metavar="STORE", help="results store (.sqlite, .db, .sqlite3; created when missing)")
    q.add_argument("files", nargs="+", metavar="FILE",
                   help="signature file (JSON) or results log (JSON lines), told by content")
    q.add_argument("--gpu-model", default=None,
                   help="GPU model of points whose file records none (required for those)")
    q.add_argument("--uuid", default=None, help="GPU UUID of points whose file records none")
    q.add_argument("--driver", default=None, help="driver version of points whose file records none")
    q.add_argument("--protocol", default=None, metavar="JSON",
                   help="protocol settings (a JSON object) of points whose file records none")
    q.add_argument("--host", default=None, help="host of points whose file records none")
    q.add_argument("--replace", action="store_true",
                   help="a key that holds another measurement takes the file's (default: kept)")
    q.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")

    q = ss.add_parser("export", formatter_class=formatter_class,
                      help="write a store's points as a signature file or a results log",
                      epilog="the file is written whole or not at all (temp file + rename)")
    q.add_argument("store", metavar="STORE", help="results store (.sqlite, .db, .sqlite3)")
    q.add_argument("-o", "--output", required=True, help="file to write (JSON; .jsonl: a results log)")
    q.add_argument("--element", default=None, help="only this element")
    q.add_argument("--gpu-model", default=None, help="only this GPU model ('H200' matches 'NVIDIA H200')")
    q.add_argument("--uuid", default=None, help="only this card")
    q.add_argument("--host", default=None, help="only what this host measured")
    q.add_argument("--format", choices=FORMATS, default=None,
                   help="signatures (default) or results-log (default for a .jsonl -o; one element "
                        "on one card)")
    q.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")

    q = ss.add_parser("list", formatter_class=formatter_class,
                      help="points per GPU model and element; campaigns and their units")
    q.add_argument("store", metavar="STORE", help="results store (.sqlite, .db, .sqlite3)")
    q.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    return p


def cmd_store(args: argparse.Namespace) -> int:
    """Run ``ecal store ACTION`` (see the module docstring). SQLite errors (a locked or
    damaged store, a full disk) are :class:`~measure.store.StoreError` naming the store,
    raised by :class:`~measure.store.ResultsStore` itself (so ``ecal frontier`` and ``ecal
    campaign`` report them the same way): one line, exit 2."""
    run = {"import": store_import, "export": store_export, "list": store_list}[args.store_command]
    return run(args)


def _check_store_path(path: str) -> None:
    from measure.store import STORE_SUFFIXES, is_store_path

    from .common import UsageError

    if not is_store_path(path):
        raise UsageError(f"{path}: a store's name ends in {', '.join(STORE_SUFFIXES)} (so that "
                         "ecal frontier and workload files read it as a store)")


def _existing_store(path: str) -> Any:
    from measure.store import ResultsStore

    _check_store_path(path)
    if not Path(path).is_file():
        raise FileNotFoundError(2, "no such file", path)
    return ResultsStore(path, create=False)


# -- import ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileOutcome:
    """What an import did with one file's points."""

    file: str
    kind: str
    points: int
    added: int
    present: int
    kept: int
    replaced: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)

    def text(self) -> str:
        """``FILE (kind): N added, M already present[, ...]``."""
        line = f"{self.file} ({self.kind}): {self.added} added, {self.present} already present"
        if self.kept:
            line += (f", {self.kept} differ from the stored point (kept the stored one; "
                     "--replace takes the file's)")
        if self.replaced:
            line += f", {self.replaced} replaced"
        return line


def _given_fields(args: argparse.Namespace) -> dict[str, str]:
    """The key fields given by flags (``--protocol`` as the store's canonical JSON)."""
    from measure.store import protocol_key

    from .common import UsageError

    given = {f: getattr(args, f) for f in FILL_FIELDS if getattr(args, f) is not None}
    for f, v in given.items():
        if not str(v).strip() or v == "unknown":
            raise UsageError(f"--{f.replace('_', '-')} must name something, got {v!r}")
    if "protocol" in given:
        try:
            settings = json.loads(given["protocol"])
        except ValueError as exc:
            raise UsageError(f"--protocol must be a JSON object of protocol settings ({exc})") from None
        if not isinstance(settings, dict):
            raise UsageError(f"--protocol must be a JSON object of protocol settings, got "
                             f"{given['protocol']!r}")
        given["protocol"] = protocol_key(settings)
    return given


def resolve_fields(point: Any, file: str, given: Mapping[str, str]) -> dict[str, str]:
    """The key fields a :class:`~measure.store_io.FilePoint` is stored under: what its file
    records, a field it leaves ``"unknown"`` filled from ``given`` (the flags). A flag that
    contradicts what the file records, or a GPU model recorded nowhere, is a
    :class:`~ecal.common.UsageError` naming the file and the point."""
    from measure.store import model_matches

    from .common import UsageError

    rec = point.recorded_key()
    out = {}
    for f in FILL_FIELDS:
        have, want, flag = getattr(rec, f), given.get(f), "--" + f.replace("_", "-")
        if have == "unknown":
            have = want if want is not None else have
        elif want is not None and not (model_matches(have, want) if f == "gpu_model" else have == want):
            raise UsageError(f"{file}: {point.where}: the file records {f} {have!r}, not {want!r} "
                             f"as {flag} says ({flag} only fills in what a file does not record)")
        out[f] = have
    if out["gpu_model"] == "unknown":
        raise UsageError(f"{file}: {point.where}: no GPU model recorded; say which GPU measured "
                         "it with --gpu-model (nothing was imported)")
    return out


def store_import(args: argparse.Namespace) -> int:
    """``ecal store import``: read every file, resolve every key, then add all in one
    transaction; print per file and in all what was added and what was already present."""
    from measure.store import ResultsStore
    from measure.store_io import read_points

    _check_store_path(args.store)
    given = _given_fields(args)
    staged = []
    for f in args.files:
        read = read_points(f)
        staged.append((read, [resolve_fields(pt, f, given) for pt in read.points]))
    for read, _ in staged:
        for w in read.warnings:
            print(f"ecal store import: warning: {read.file}: {w}", file=sys.stderr)
    outcomes = []
    with ResultsStore(args.store) as st:
        with st.transaction():
            for read, keys in staged:
                n = {"added": 0, "present": 0, "kept": 0, "replaced": 0}
                for pt, fields in zip(read.points, keys):
                    n[st.merge(pt.signature, campaign=pt.campaign, unit=pt.unit,
                               replace=args.replace, **fields)] += 1
                outcomes.append(FileOutcome(read.file, read.kind, len(read.points), **n))
        total = st.count()
    added, present = sum(o.added for o in outcomes), sum(o.present for o in outcomes)
    if args.json:
        from .output import dump_json

        dump_json({"store": args.store, "files": [o.to_dict() for o in outcomes], "added": added,
                   "present": present, "kept": sum(o.kept for o in outcomes),
                   "replaced": sum(o.replaced for o in outcomes), "points_in_store": total})
        return 0
    for o in outcomes:
        print(o.text())
    print(f"{args.store}: {added} added, {present} already present; {total} point(s) in the store")
    return 0


# -- export ---------------------------------------------------------------------------------------

def _selection_text(args: argparse.Namespace) -> str:
    parts = [f"of element {args.element!r}" if args.element else "",
             f"of GPU model {args.gpu_model!r}" if args.gpu_model else "",
             f"on card {args.uuid!r}" if args.uuid else "",
             f"from host {args.host!r}" if args.host else ""]
    return " ".join(p for p in parts if p)


def _results_log_target(args: argparse.Namespace, rows: list) -> str:
    """The one element a results-log export writes (checked: one card, one protocol)."""
    from .common import UsageError

    elements = sorted({r.key.element for r in rows})
    if len(elements) > 1:
        raise UsageError(f"{args.store}: a results log holds one element; pick one with --element "
                         f"(has: {_few(tuple(elements), 5)})")
    ids = sorted({(r.key.uuid, r.key.driver, r.key.protocol, r.key.host, r.key.gpu_model)
                  for r in rows})
    if len(ids) > 1:
        uuids, hosts = sorted({i[0] for i in ids}), sorted({i[3] for i in ids})
        n_proto = len({i[2] for i in ids})
        raise UsageError(f"{args.store}: {elements[0]!r} was measured {len(ids)} ways (UUIDs: "
                         f"{', '.join(uuids)}; hosts: {', '.join(hosts)}; {n_proto} protocol(s)); "
                         "a results log holds one card, host and protocol: pick with --uuid and "
                         "--host, or export --format signatures")
    return elements[0]


def _write_results_log(store: Any, tmp: str, element: str, args: argparse.Namespace) -> None:
    """Write the results log into ``tmp`` (the staged temp file) and remove the writer's
    rendezvous lock file it leaves beside a path (a temp file's would stay behind)."""
    from measure.results_log import results_lock
    from measure.store_io import export_results_log

    try:
        export_results_log(store, tmp, element, uuid=args.uuid, gpu_model=args.gpu_model,
                           host=args.host)
    finally:
        try:
            os.unlink(results_lock(tmp).path)
        except OSError:
            pass


def store_export(args: argparse.Namespace) -> int:
    """``ecal store export``: select, check, then write ``-o`` atomically (see module doc)."""
    from measure.store import is_store_path
    from measure.store_io import export_signature_file

    from .common import UsageError, check_outputs
    from .output import Outputs

    check_outputs(args, "-o")
    out_path = str(args.output)
    if is_store_path(out_path):
        raise UsageError(f"-o {out_path}: export writes a signature file or a results log; to "
                         "merge stores, export one and import the file into the other")
    if os.path.realpath(out_path) == os.path.realpath(args.store):
        raise UsageError(f"-o {out_path} is the store itself")
    fmt = args.format or ("results-log" if out_path.lower().endswith(".jsonl") else "signatures")
    with _existing_store(args.store) as st:
        rows = st.rows(element=args.element, gpu_model=args.gpu_model, uuid=args.uuid,
                       host=args.host)
        if not rows:
            sel = _selection_text(args)
            raise UsageError(f"{args.store}: no points" + (f" {sel}" if sel else "")
                             + " (ecal store list shows what it holds); nothing written")
        out = Outputs()
        if fmt == "results-log":
            element = _results_log_target(args, rows)
            out.custom(out_path, lambda tmp: _write_results_log(st, tmp, element, args))
        else:
            out.custom(out_path, lambda tmp: export_signature_file(
                st, tmp, element=args.element, gpu_model=args.gpu_model, uuid=args.uuid,
                host=args.host))
        written = out.commit()
    for p in written:
        print(f"wrote {p}", file=sys.stderr)
    elements = sorted({r.key.element for r in rows})
    if args.json:
        from .output import dump_json

        dump_json({"store": args.store, "output": out_path, "format": fmt, "points": len(rows),
                   "elements": elements})
    else:
        print(f"{out_path} ({fmt}): {len(rows)} point(s) of {len(elements)} element(s) from "
              f"{args.store}")
    return 0


# -- list -----------------------------------------------------------------------------------------

def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(head, *rows)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]


def _few(items: tuple[str, ...], most: int = 3) -> str:
    return ", ".join(items[:most]) + (f" (+{len(items) - most} more)" if len(items) > most else "")


def store_list(args: argparse.Namespace) -> int:
    """``ecal store list``: points per GPU model and element, then the campaigns."""
    with _existing_store(args.store) as st:
        groups, campaigns, total = st.summary(), st.campaigns(), st.count()
    if args.json:
        from .output import dump_json

        dump_json({"store": args.store, "points": total, "groups": [g.to_dict() for g in groups],
                   "campaigns": [c.to_dict() for c in campaigns]})
        return 0
    models = {g.gpu_model for g in groups}
    lines = [f"{args.store}: {total} point(s) of {len({g.element for g in groups})} element(s) on "
             f"{len(models)} GPU model(s)"]
    if groups:
        lines += _table(["GPU model", "element", "points", "campaigns", "units", "hosts", "UUIDs"],
                        [[g.gpu_model, g.element, str(g.points), str(len(g.campaigns)),
                          str(g.units), _few(g.hosts), _few(g.uuids)] for g in groups])
    for c in campaigns:
        lines.append(f"campaign {c.name}: {c.units_done} unit(s) done, {c.points} point(s)")
    print("\n".join(lines))
    return 0
