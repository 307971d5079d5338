"""The JSON-lines results file of a sweep: every measured point is appended as it is taken
(flush + fsync), so nothing measured is lost, and a rerun resumes from it.

Lines are JSON objects with a ``kind``: ``"header"`` (device, grid, protocol), ``"ready"``
(ready power at one ω_dev) or ``"point"`` (one signature). A last line cut short by a kill is
dropped (the file is truncated back to the last complete line) and that point is measured
again; a malformed line anywhere else is an error naming the file and line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from frontier.errors import FormatError
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature


def point_key(element: str, kappa: str | None, omega: OperatingPoint) -> str:
    """Identity of one measured point in a results file."""
    return json.dumps([element, kappa, omega.to_dict()], sort_keys=True)


def dev_key(omega: OperatingPoint) -> str:
    """Identity of an ω_dev (for ready-power calibrations)."""
    return json.dumps(omega.dev.to_dict(), sort_keys=True)


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
        from frontier.io import signature_from_dict

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
            self._take(rec, i, signature_from_dict)
            good_end += len(raw) + 1
        if lines[-1].strip() or good_end < len(data):
            self.dropped_partial_line = True
        if good_end < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())

    def _take(self, rec: Any, line: int, from_dict: Any) -> None:
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
            self.points[rec["key"]] = from_dict(rec["signature"], file=str(self.path), path=f"line {line}.signature")
        else:
            raise FormatError(str(self.path), f"line {line}.kind", f"unknown kind {kind!r}")

    def _append(self, rec: dict[str, Any]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(rec, allow_nan=False, default=str) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def write_header(self, header: dict[str, Any]) -> None:
        """Record what is being swept (only when the file is new)."""
        if self.header is None:
            self.header = {"kind": "header", **header}
            self._append(self.header)

    def add_ready(self, omega: OperatingPoint, power_w: float) -> None:
        """Append a ready-power calibration."""
        k = dev_key(omega)
        self.ready_w[k] = float(power_w)
        self._append({"kind": "ready", "omega_dev": k, "ready_power_w": float(power_w)})

    def add_point(self, key: str, sig: Signature) -> None:
        """Append one measured point (durable when this returns)."""
        from frontier.io import signature_to_dict

        self.points[key] = sig
        self._append({"kind": "point", "key": key, "signature": _json_safe(signature_to_dict(sig))})


def _json_safe(o: Any) -> Any:
    if isinstance(o, float):
        return o if o == o and abs(o) != float("inf") else None
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_json_safe(v) for v in o]
    return o
