"""The JSON-lines results file of a sweep: every measured point is appended as it is taken
(flush + fsync), so nothing measured is lost, and a rerun resumes from it.

Lines are JSON objects with a ``kind``: ``"header"`` (what is measured, on what, how),
``"ready"`` (ready power at one ω_dev) or ``"point"`` (one signature, in the lossless codec of
:mod:`frontier.pareto`: its name, exact variances and ``d_j``, so a resumed point equals the
measured one bit for bit). A last line cut short by a kill is dropped (the file is truncated
back to the last complete line) and that point is measured again; a malformed line anywhere
else is an error naming the file and line.

**Identity.** The header records the element, the κ labels, the grid, the protocol
(:meth:`~measure.protocol.Protocol.to_dict`), the device (``describe()``: name, UUID, driver,
and the simulator's seed) and the host. Resuming checks, with :meth:`ResultsLog.check_identity`,
that this run measures the same element on the same GPU (name, UUID, driver), with the same
seed and protocol; otherwise it raises :class:`ResultsMismatchError`. Not checked, on purpose:

* the grid and the κ labels: points are keyed by (element, κ, ω), so a changed grid or κ set
  resumes exactly the points it shares with the file and measures the rest under the same
  conditions (extending a sweep is the point of resuming);
* the host: the GPU's UUID identifies the card wherever it is plugged in, and a simulator's
  results do not depend on the host (it is recorded for the reader).

Files written before these fields existed (no ``uuid``, ``driver``, ``seed`` or some protocol
setting in the header) are accepted: what the header does record is checked, a missing
protocol setting counts as that setting's default (what the older code used), and the other
missing fields cannot be checked. Their point records may lack a ``name``; the element of the
point's key is used (older writers dropped it, so resumed points came back named
``signature``).

One writer per file: :func:`results_lock` is the lock a sweep holds on ``<results>.lock``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frontier.errors import FormatError
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .device import DeviceError
from .locks import ProcessLock

RESULTS_FORMAT = "energy-calculus/results"
#: 2: header with identity (uuid, driver, seed, host); points in the lossless codec.
RESULTS_VERSION = 2

#: Device fields of the header that must match on resume (when the file records them).
DEVICE_IDENTITY = ("device", "uuid", "driver", "seed")


class ResultsMismatchError(DeviceError):
    """A results file belongs to another measurement than this run (another GPU, seed,
    protocol or element): resuming it would mix measurements. ``file``, ``field`` (e.g.
    ``device.uuid``, ``protocol.target_rse``), ``found`` (the file's value) and ``this_run``."""

    def __init__(self, file: str, field: str, found: Any, this_run: Any):
        self.file, self.field, self.found, self.this_run = file, field, found, this_run
        ours = "unknown" if this_run is None else repr(this_run)
        super().__init__(
            f"{file}: {field} is {found!r} in this results file but {ours} in this run; "
            f"resuming would mix measurements: use another results file ({_hint(field)})")


def _hint(field: str) -> str:
    if field in ("device.device", "device.uuid", "device.driver"):
        return "or resume this one on the GPU and driver it was measured with"
    if field.startswith("protocol."):
        return f"or rerun with the same protocol setting {field.split('.', 1)[1]}"
    return f"or rerun with the same {field.split('.')[-1]}"


def point_key(element: str, kappa: str | None, omega: OperatingPoint) -> str:
    """Identity of one measured point in a results file."""
    return json.dumps([element, kappa, omega.to_dict()], sort_keys=True)


def dev_key(omega: OperatingPoint) -> str:
    """Identity of an ω_dev (for ready-power calibrations)."""
    return json.dumps(omega.dev.to_dict(), sort_keys=True)


def results_lock(path: str | os.PathLike, doing: str = "") -> ProcessLock:
    """The one-writer lock of results file ``path`` (on the sibling ``<path>.lock``, which
    stays behind: it is only a rendezvous). Acquire it before opening the file."""
    return ProcessLock(f"{os.fspath(path)}.lock", f"results file {os.fspath(path)}", doing)


def _codec() -> tuple[Any, Any]:
    from frontier.pareto import signature_from_dict, signature_to_dict

    return signature_to_dict, signature_from_dict


def _element_of(key: str) -> str | None:
    try:
        k = json.loads(key)
    except (TypeError, ValueError):
        return None
    return k[0] if isinstance(k, list) and k and isinstance(k[0], str) and k[0] else None


def _normalized(o: Any) -> Any:
    return json.loads(json.dumps(o, default=str))


class ResultsLog:
    """Append-only JSON-lines store of measured points (``path=None``: in memory only)."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path is not None else None
        self.points: dict[str, Signature] = {}
        self.ready_w: dict[str, float] = {}
        self.header: dict[str, Any] | None = None
        self.dropped_partial_line = False
        if self.path is not None and self.path.exists():
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        data = self.path.read_bytes()
        good_end = 0
        lines = data.split(b"\n")
        complete = lines[:-1]      # the part after the last newline is incomplete (maybe empty)
        for i, raw in enumerate(complete, start=1):
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                good_end += len(raw) + 1
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as exc:
                if i == len(complete) and not lines[-1]:
                    # the kill came after the newline of a torn write: treat as partial
                    self.dropped_partial_line = True
                    break
                raise FormatError(str(self.path), f"line {i}", f"invalid JSON: {exc.msg}") from None
            self._take(rec, i)
            good_end += len(raw) + 1
        if lines[-1].strip() or good_end < len(data):
            self.dropped_partial_line = True
        if good_end < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())

    def _take(self, rec: Any, line: int) -> None:
        if not isinstance(rec, dict) or "kind" not in rec:
            raise FormatError(str(self.path), f"line {line}", "expected an object with a 'kind'")
        kind = rec["kind"]
        if kind == "header":
            self.header = rec
        elif kind == "ready":
            try:
                self.ready_w[rec["omega_dev"]] = float(rec["ready_power_w"])
            except (KeyError, TypeError, ValueError):
                raise FormatError(str(self.path), f"line {line}",
                                  "a 'ready' record needs omega_dev and a numeric ready_power_w") from None
        elif kind == "point":
            if "key" not in rec or "signature" not in rec:
                raise FormatError(str(self.path), f"line {line}", "a 'point' record needs key and signature")
            self.points[rec["key"]] = self._decode(rec, f"line {line}.signature")
        else:
            raise FormatError(str(self.path), f"line {line}.kind", f"unknown kind {kind!r}")

    def _decode(self, rec: Mapping[str, Any], where: str) -> Signature:
        _, from_dict = _codec()
        body = rec["signature"]
        name = None
        if not (isinstance(body, Mapping) and "name" in body):
            # an older record: the name is the element of the key (or of the header)
            name = _element_of(rec["key"]) or (self.header or {}).get("element") or None
        return from_dict(body, file=str(self.path or "<results>"), path=where, name=name)

    def _append(self, rec: dict[str, Any]) -> str:
        line = json.dumps(rec, allow_nan=False, default=str) + "\n"
        if self.path is None:
            return line
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        if new:        # make the new file's directory entry durable too
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return line

    def check_identity(self, now: Mapping[str, Any], protocol_defaults: Mapping[str, Any]) -> None:
        """Raise :class:`ResultsMismatchError` unless the file's header (if any) describes the
        measurement ``now`` describes (a header as :meth:`write_header` takes): same
        ``element``, same device fields :data:`DEVICE_IDENTITY` where the file records them,
        same protocol (a setting the file lacks counts as its default in
        ``protocol_defaults``). See the module docstring for what is not checked and why."""
        if self.header is None:
            return
        file = str(self.path)
        was, now = self.header, _normalized(dict(now))
        if "element" in was and was["element"] != now.get("element"):
            raise ResultsMismatchError(file, "element", was["element"], now.get("element"))
        dev_was, dev_now = was.get("device") or {}, now.get("device") or {}
        for f in DEVICE_IDENTITY:
            if f in dev_was and dev_was[f] != dev_now.get(f):
                raise ResultsMismatchError(file, f"device.{f}", dev_was[f], dev_now.get(f))
        if "protocol" in was:
            p_was, p_now = was["protocol"] or {}, now.get("protocol") or {}
            defaults = _normalized(dict(protocol_defaults))
            for f in sorted(set(p_was) | set(p_now)):
                a, b = p_was.get(f, defaults.get(f)), p_now.get(f, defaults.get(f))
                if a != b:
                    raise ResultsMismatchError(file, f"protocol.{f}", a, b)

    def write_header(self, header: Mapping[str, Any]) -> None:
        """Record what is being swept (only when the file is new)."""
        if self.header is None:
            self.header = {"kind": "header", "format": RESULTS_FORMAT, "version": RESULTS_VERSION,
                           **_normalized(dict(header))}
            self._append(self.header)

    def add_ready(self, omega: OperatingPoint, power_w: float) -> None:
        """Append a ready-power calibration."""
        k = dev_key(omega)
        self.ready_w[k] = float(power_w)
        self._append({"kind": "ready", "omega_dev": k, "ready_power_w": float(power_w)})

    def add_point(self, key: str, sig: Signature) -> Signature:
        """Append one measured point (durable when this returns) and return it as a resume
        will read it back (the same signature, its metadata in JSON form), so what a sweep
        returns never depends on whether a point was measured or resumed."""
        to_dict, _ = _codec()
        line = self._append({"kind": "point", "key": key, "signature": _json_safe(to_dict(sig))})
        back = self._decode(json.loads(line), "point")
        self.points[key] = back
        return back


def _json_safe(o: Any) -> Any:
    if isinstance(o, float):
        return o if o == o and abs(o) != float("inf") else None
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_json_safe(v) for v in o]
    return o
