"""``ecal restore [--device nvml:N] [--json]``: put back GPU settings a killed run left changed.

Every NVML setting ecal changes is journalled first (:mod:`measure.journal`, one file per GPU
UUID under ``$ECAL_STATE_DIR`` or ``~/.cache/energy-calculus``). This command restores from
those journals: the power limit found before the change (read back by NVML, so exact), and
clock locks by reset (NVML cannot read a lock back, so a lock another tool had set is reset,
not re-applied). It takes each GPU's lock, so a GPU still in use by a live ecal process is
refused with that process's PID. Opening a GPU for changes (``ecal characterize --device
nvml:N``) does the same recovery first; this command is for when that open refused, or to
clean up without measuring.

Every journalled setting is tried, also after another one failed: each one put back leaves
the journal, the ones that failed stay in it, and the output says per setting which is which.
Stale temp files of journal writers killed mid-write are removed (under the GPU's lock).

The card comes before the disk: a journal that cannot be updated after the restore (a full or
read-only state folder) does not stop the restore; the output says so and the journal is left
as it was (run the command again once the folder can be written: restoring twice is
harmless). An unreadable journal (bad JSON, deep nesting, wrong types) resets every setting to
the driver default, and a power limit outside the GPU's own range is replaced by the default
limit, each said in one line. A journal someone else could have written (a symlink, another
owner, group/other-writable, another writer uid) is **refused**: listed, never applied. The
state folder itself must be the caller's own (:func:`measure.locks.lock_dir`).

Wire it as ``commands.cmd_restore = recovery.cmd_restore``. Exit 0 when everything found was
restored, or there was nothing to do; a failure (a setting not restored, a GPU in use, a
journal refused or left un-updated, or a ``--device nvml:N`` that NVML does not have) raises
:class:`~measure.device.DeviceError` (the CLI prints it in one line and exits 2) after
printing what was restored.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

from measure.device import DeviceError


def _index_of(spec: str) -> int:
    kind, _, arg = spec.strip().lower().partition(":")
    if kind != "nvml":
        raise DeviceError(f"--device {spec!r}: ecal restore works on real GPUs; expected nvml:INDEX")
    try:
        return int(arg or "0")
    except ValueError:
        raise DeviceError(f"--device {spec!r}: expected nvml:INDEX with an integer index") from None


def _uuid_indices(nv: Any) -> dict[str, int]:
    """NVML UUID → index for every GPU on this host."""
    out = {}
    for i in range(int(nv.nvmlDeviceGetCount())):
        u = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))
        out[u.decode() if isinstance(u, bytes) else str(u)] = i
    return out


def _load_nvml(nvml: Any) -> Any:
    if nvml is not None:
        return nvml
    from measure.nvml import _load_pynvml

    return _load_pynvml()


def cmd_restore(args: argparse.Namespace, nvml: Any = None) -> int:
    """Restore the GPU ``args.device`` (``nvml:N``), or every GPU with a journal when it is
    None; print, per setting, what was put back and what was not (``--json``: a JSON
    document). Every journalled setting is tried, also after one fails. ``nvml``: an injected
    pynvml-like module (tests)."""
    from measure import journal as jr
    from measure.locks import lock_dir

    wanted = None if getattr(args, "device", None) is None else _index_of(args.device)
    journals = jr.list_journals()
    temps = sorted(lock_dir().glob("*.journal.json.*tmp"))
    doc: dict[str, Any] = {"restored": [], "skipped": [], "failed": [], "refused": [],
                           "temp_files_removed": [], "journal_dir": str(lock_dir())}
    if journals or temps or wanted is not None:
        nv = _load_nvml(nvml)
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            waiting = f"{len(journals)} journal(s) wait in {lock_dir()}" if journals else \
                f"cannot look for nvml:{wanted}"
            raise DeviceError(f"NVML is not usable here ({exc}); {waiting}") from None
        try:
            by_uuid = _uuid_indices(nv)
            _check_wanted(wanted, by_uuid)
            for path in journals:
                _restore_one(path, by_uuid, wanted, nv, doc)
            _clean_temps(temps, journals, by_uuid, wanted, nv, doc)
        finally:
            nv.nvmlShutdown()
        doc["temp_files_removed"] = [str(t) for t in temps if not os.path.lexists(t)]
    if getattr(args, "json", False):
        print(json.dumps(doc, indent=2))
    else:
        for line in _lines(doc, wanted):
            print(line)
    if doc["failed"]:
        first = doc["failed"][0]
        raise DeviceError(f"{len(doc['failed'])} GPU(s) not fully restored; {first['uuid']}: "
                          f"{first['error']}")
    if doc["refused"]:
        first = doc["refused"][0]
        raise DeviceError(f"{len(doc['refused'])} journal(s) refused, not applied; "
                          f"{first['error']}")
    stale = [r for r in doc["restored"] if r.get("journal_error")]
    if stale:
        raise DeviceError(f"{stale[0]['uuid']} ({stale[0]['device']}) is restored, but "
                          f"{stale[0]['journal_error']}: run `ecal restore` again once "
                          f"{doc['journal_dir']} can be written")
    return 0


def _check_wanted(wanted: int | None, by_uuid: dict[str, int]) -> None:
    """A ``--device nvml:N`` that NVML does not have is an error, not "nothing to restore"."""
    if wanted is None or wanted in by_uuid.values():
        return
    n = len(by_uuid)
    seen = f"nvml:0..nvml:{n - 1}" if n > 1 else ("nvml:0" if n == 1 else "none")
    raise DeviceError(f"--device nvml:{wanted}: no such GPU; NVML sees {n} GPU(s) ({seen})")


def _restore_one(path: Any, by_uuid: dict[str, int], wanted: int | None, nv: Any,
                 doc: dict[str, Any]) -> None:
    from measure import journal as jr
    from measure.nvml import NVMLDevice, RestoreFailedError

    refused = None
    try:
        rec = jr.read_journal(path)
        uuid, host = rec.uuid, rec.host
    except jr.CorruptJournalError:
        uuid, host = path.name.removesuffix(".journal.json"), ""
    except jr.UntrustedJournalError as exc:
        uuid, host, refused = path.name.removesuffix(".journal.json"), "", exc
    if refused is not None:
        # never applied; named by file (its uuid is the planter's word)
        index = {jr.safe_name(u): i for u, i in by_uuid.items()}.get(uuid)
        if wanted is None or index == wanted:
            doc["refused"].append({"uuid": uuid, "journal": str(path), "error": str(refused)})
        return
    index = by_uuid.get(uuid)
    if wanted is not None and index != wanted:
        return
    if index is None:
        entry = {"uuid": uuid, "journal": str(path)}
        if host and host != socket.gethostname():
            doc["skipped"].append({**entry, "reason": f"written on host {host}; this GPU is not here"})
        else:
            doc["failed"].append({**entry, "error": "no GPU with this UUID on this host "
                                                    "(journal kept)"})
        return
    try:
        # Opening for changes takes the GPU's lock and restores from the journal (measure.nvml).
        dev = NVMLDevice(index=index, nvml=nv, announce=False)
    except RestoreFailedError as exc:
        doc["failed"].append(_partial(uuid, index, exc))
        return
    except DeviceError as exc:   # LockedError: a live process holds it
        doc["failed"].append({"uuid": uuid, "device": f"nvml:{index}", "error": str(exc),
                              "restored": [], "not_restored": []})
        return
    try:
        if dev.recovered is not None:
            doc["restored"].append(dev.recovered.to_dict())
    finally:
        dev.close()


def _partial(uuid: str, index: int, exc: Any) -> dict[str, Any]:
    """The ``failed`` entry of a GPU whose recovery put back some settings and not others."""
    rec = exc.recovery
    if rec is None:
        return {"uuid": uuid, "device": f"nvml:{index}", "restored": [], "not_restored": [],
                "error": str(exc.cause or exc) + " (journal kept)"}
    d = rec.to_dict()
    first = d["not_restored"][0]
    d["error"] = f"{first['restore']}: {first['error']} (journal kept)"
    return d


def _clean_temps(temps: list[Any], journals: list[Any], by_uuid: dict[str, int],
                 wanted: int | None, nv: Any, doc: dict[str, Any]) -> None:
    """Remove stale journal temp files of GPUs here that have no journal (a writer killed
    while writing a first entry): open each such GPU (taking its lock) and close it. A GPU
    in use is left alone: its temp file may be its live writer's."""
    from measure import journal as jr
    from measure.locks import LockedError
    from measure.nvml import NVMLDevice

    with_journal = {p.name for p in journals}
    names = {t.name.split(".journal.json.", 1)[0] for t in temps}
    for uuid, index in sorted(by_uuid.items(), key=lambda kv: kv[1]):
        safe = jr.safe_name(uuid)
        if safe not in names or f"{safe}.journal.json" in with_journal:
            continue
        if wanted is not None and index != wanted:
            continue
        try:
            dev = NVMLDevice(index=index, nvml=nv, announce=False)
        except LockedError:
            continue
        try:
            if dev.recovered is not None:      # a journal appeared meanwhile
                doc["restored"].append(dev.recovered.to_dict())
        finally:
            dev.close()


def _lines(doc: dict[str, Any], wanted: int | None) -> list[str]:
    lines = []
    for r in doc["restored"]:
        who = "an unreadable journal" if r["journal_corrupt"] else f"process {r['left_by_pid']}"
        extra = "".join(f"; {x}" for x in [*r.get("notes", ()), r.get("journal_error")] if x)
        lines.append(f"restored {r['uuid']} ({r['device']}): {', '.join(r['restored'])} "
                     f"(left changed by {who}){extra}")
    for s in doc["skipped"]:
        lines.append(f"skipped {s['uuid']}: {s['reason']}")
    for r in doc["refused"]:
        lines.append(f"refused {r['uuid']}: {r['error']}")
    for f in doc["failed"]:
        where = f" ({f['device']})" if "device" in f else ""
        if f.get("restored"):
            lines.append(f"restored {f['uuid']}{where}: {', '.join(f['restored'])}")
        if f.get("not_restored"):
            for n in f["not_restored"]:
                lines.append(f"NOT restored {f['uuid']}{where}: {n['restore']}: {n['error']} "
                             "(journal kept)")
        else:
            lines.append(f"NOT restored {f['uuid']}{where}: {f['error']}")
    if not lines:
        what = f"nvml:{wanted}" if wanted is not None else "any GPU"
        lines.append(f"nothing to restore: no settings left changed on {what} "
                     f"(journals live in {doc['journal_dir']})")
    return lines


if __name__ == "__main__":  # pragma: no cover - `python -m ecal.recovery [nvml:N]`
    ns = argparse.Namespace(device=sys.argv[1] if len(sys.argv) > 1 else None, json=False)
    sys.exit(cmd_restore(ns))
