"""``ecal restore [--device nvml:N] [--json]``: put back GPU settings a killed run left changed.

Every NVML setting ecal changes is journalled first (:mod:`measure.journal`, one file per GPU
UUID under ``$ECAL_STATE_DIR`` or ``~/.cache/energy-calculus``). This command restores from
those journals: the power limit found before the change (read back by NVML, so exact), and
clock locks by reset (NVML cannot read a lock back, so a lock another tool had set is reset,
not re-applied). It takes each GPU's lock, so a GPU still in use by a live ecal process is
refused with that process's PID. Opening a GPU for changes (``ecal characterize --device
nvml:N``) does the same recovery first; this command is for when that open refused, or to
clean up without measuring.

Wire it as ``commands.cmd_restore = recovery.cmd_restore``. Exit 0 when everything found was
restored, or there was nothing to do; a failure raises :class:`~measure.device.DeviceError`
(the CLI prints it in one line and exits 2) after printing what was restored.
"""

from __future__ import annotations

import argparse
import json
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
    None; print what was put back (``--json``: a JSON document). ``nvml``: an injected
    pynvml-like module (tests)."""
    from measure import journal as jr
    from measure.locks import lock_dir
    from measure.nvml import NVMLDevice, RestoreFailedError

    nv = _load_nvml(nvml)
    wanted = None if getattr(args, "device", None) is None else _index_of(args.device)
    journals = jr.list_journals()
    restored: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    if journals:
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise DeviceError(f"NVML is not usable here ({exc}); "
                              f"{len(journals)} journal(s) wait in {lock_dir()}") from None
        try:
            by_uuid = _uuid_indices(nv)
            for path in journals:
                _restore_one(path, by_uuid, wanted, nv, NVMLDevice, RestoreFailedError,
                             restored, skipped, failed)
        finally:
            nv.nvmlShutdown()
    doc = {"restored": restored, "skipped": skipped, "failed": failed, "journal_dir": str(lock_dir())}
    if getattr(args, "json", False):
        print(json.dumps(doc, indent=2))
    else:
        for line in _lines(doc, wanted):
            print(line)
    if failed:
        first = failed[0]
        raise DeviceError(f"{len(failed)} GPU(s) not restored; {first['uuid']}: "
                          f"{first['error']}")
    return 0


def _restore_one(path: Any, by_uuid: dict[str, int], wanted: int | None, nv: Any, device_cls: Any,
                 restore_failed: type, restored: list, skipped: list, failed: list) -> None:
    from measure import journal as jr

    try:
        rec = jr.read_journal(path)
        uuid, host = rec.uuid, rec.host
    except jr.CorruptJournalError:
        uuid, host = path.name.removesuffix(".journal.json"), ""
    index = by_uuid.get(uuid)
    if wanted is not None and index != wanted:
        return
    if index is None:
        entry = {"uuid": uuid, "journal": str(path)}
        if host and host != socket.gethostname():
            skipped.append({**entry, "reason": f"written on host {host}; this GPU is not here"})
        else:
            failed.append({**entry, "error": "no GPU with this UUID on this host (journal kept)"})
        return
    try:
        # Opening for changes takes the GPU's lock and restores from the journal (measure.nvml).
        dev = device_cls(index=index, nvml=nv, announce=False)
    except restore_failed as exc:
        failed.append({"uuid": uuid, "device": f"nvml:{index}",
                       "error": str(exc.cause or exc) + " (journal kept)"})
        return
    except DeviceError as exc:   # LockedError: a live process holds it
        failed.append({"uuid": uuid, "device": f"nvml:{index}", "error": str(exc)})
        return
    try:
        if dev.recovered is not None:
            restored.append(dev.recovered.to_dict())
    finally:
        dev.close()


def _lines(doc: dict[str, Any], wanted: int | None) -> list[str]:
    lines = []
    for r in doc["restored"]:
        who = "an unreadable journal" if r["journal_corrupt"] else f"process {r['left_by_pid']}"
        lines.append(f"restored {r['uuid']} ({r['device']}): {', '.join(r['restored'])} "
                     f"(left changed by {who})")
    for s in doc["skipped"]:
        lines.append(f"skipped {s['uuid']}: {s['reason']}")
    for f in doc["failed"]:
        lines.append(f"NOT restored {f['uuid']}{' (' + f['device'] + ')' if 'device' in f else ''}: "
                     f"{f['error']}")
    if not lines:
        what = f"nvml:{wanted}" if wanted is not None else "any GPU"
        lines.append(f"nothing to restore: no settings left changed on {what} "
                     f"(journals live in {doc['journal_dir']})")
    return lines


if __name__ == "__main__":  # pragma: no cover - `python -m ecal.recovery [nvml:N]`
    ns = argparse.Namespace(device=sys.argv[1] if len(sys.argv) > 1 else None, json=False)
    sys.exit(cmd_restore(ns))
