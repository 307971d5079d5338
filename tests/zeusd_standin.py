"""A stand-in zeusd for tests: the GPU control routes of zeusd 0.3+ on a Unix socket.

It answers as zeusd 0.5.0 does (``zeusd/src/routes/gpu.rs``, ``routes/mod.rs``, ``error.rs``
and ``auth.rs`` in github.com/ml-energy/zeus), as far as a client can see:

* ``POST /gpu/<operation>?gpu_ids=I[,J...]&<fields>&block=true|false``, all in the query
  string (a body is ignored); operations and fields in :data:`WRITE_ROUTES`;
* 200 with an empty body on success; with ``block=false`` zeusd answers 200 before the driver
  call, so a failure is not reported (and not applied here);
* a query it cannot deserialize (missing, unknown or duplicate field, a value that is not a
  u32 or a bool): 400, plain text ``Query deserialize error: ...`` (actix-web's own error);
* ``gpu_ids`` empty or not a number: 400, JSON ``{"error": ...}``; an index it does not have:
  400, plain text ``GPU index N does not exist.``;
* a failed driver call: JSON ``{"errors": {"<id>": "NVML error: ..."}}`` with the worst
  status of the GPUs: 403 for NVML ``NoPermission``, 400 for ``InvalidArgument`` and
  ``NotSupported``, 500 for anything else;
* the ``gpu-control`` group disabled: 404, JSON ``{"error": "API group 'gpu-control' is not
  enabled on this server."}``; a token required and missing or wrong: 401, JSON ``{"error":
  ...}`` (a plain shared string here, not a JWT);
* another method on a write route, or any other path (zeusd 0.2's ``/gpu/{id}/...`` too): 404
  with an empty body (actix-web guards each route's resource by method, so a GET matches no
  resource).

Exact message wording differs from the real daemon; the statuses and body shapes do not.
Given a pynvml-like ``nvml`` (a fake, playing the root-privileged side), it applies each
change through it; it records every request in :attr:`ZeusdStandIn.requests`, and
:meth:`ZeusdStandIn.answer_next` queues a canned answer for an operation.
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

#: zeusd's GPU write operations (route ``/gpu/<operation>``) → their fields besides
#: ``gpu_ids`` and ``block``, with the field's type ("u32" or "bool").
WRITE_ROUTES: dict[str, tuple[tuple[str, str], ...]] = {
    "set_persistence_mode": (("enabled", "bool"),),
    "set_power_limit": (("power_limit_mw", "u32"),),
    "set_gpu_locked_clocks": (("min_clock_mhz", "u32"), ("max_clock_mhz", "u32")),
    "reset_gpu_locked_clocks": (),
    "set_mem_locked_clocks": (("min_clock_mhz", "u32"), ("max_clock_mhz", "u32")),
    "reset_mem_locked_clocks": (),
    "reset_locked_clocks": (),
}

#: Operation → the NVML calls it makes (with the handle, then the fields in order).
_NVML_CALLS: dict[str, tuple[str, ...]] = {
    "set_persistence_mode": ("nvmlDeviceSetPersistenceMode",),
    "set_power_limit": ("nvmlDeviceSetPowerManagementLimit",),
    "set_gpu_locked_clocks": ("nvmlDeviceSetGpuLockedClocks",),
    "reset_gpu_locked_clocks": ("nvmlDeviceResetGpuLockedClocks",),
    "set_mem_locked_clocks": ("nvmlDeviceSetMemoryLockedClocks",),
    "reset_mem_locked_clocks": ("nvmlDeviceResetMemoryLockedClocks",),
    "reset_locked_clocks": ("nvmlDeviceResetGpuLockedClocks", "nvmlDeviceResetMemoryLockedClocks"),
}


@dataclass(frozen=True)
class Request:
    """One request as the stand-in saw it, and the status it answered."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    body: bytes
    authorization: str | None
    status: int

    @property
    def params(self) -> dict[str, str]:
        """The query as a dict (the last value of a repeated key)."""
        return dict(self.query)


class _Answer(Exception):
    """Raised inside a handler to answer at once: status, body, content type."""

    def __init__(self, status: int, body: bytes = b"", content_type: str = "text/plain"):
        super().__init__(status)
        self.status, self.body, self.content_type = status, body, content_type


def _text(status: int, text: str) -> _Answer:
    return _Answer(status, text.encode(), "text/plain; charset=utf-8")


def _json(status: int, doc: Any) -> _Answer:
    return _Answer(status, json.dumps(doc).encode(), "application/json")


class ZeusdStandIn:
    """A zeusd stand-in serving at ``sock_path`` (threaded) until :meth:`stop`.

    ``nvml``: a pynvml-like module to apply changes through (initialised here; a fresh
    file-backed fake sharing the test's card plays zeusd's root privileges); without one,
    changes are only recorded. ``gpu_count``: the GPUs it has (default: ``nvml``'s count, else
    1). ``token``: require ``Authorization: Bearer <token>``. ``control_enabled=False``: the
    ``gpu-control`` API group is disabled.
    """

    def __init__(self, sock_path: str | os.PathLike[str], nvml: Any = None,
                 gpu_count: int | None = None, token: str | None = None,
                 control_enabled: bool = True):
        self.sock_path = os.fspath(sock_path)
        self.nvml = nvml
        self.token = token
        self.control_enabled = control_enabled
        self.requests: list[Request] = []
        self.applied: list[tuple[str, int, tuple[int, ...]]] = []
        self._canned: dict[str, list[_Answer]] = {}
        self._lock = threading.Lock()          # one driver call at a time, as zeusd's per-GPU task
        if nvml is not None:
            nvml.nvmlInit()
        self.gpu_count = (gpu_count if gpu_count is not None
                          else int(nvml.nvmlDeviceGetCount()) if nvml is not None else 1)
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> ZeusdStandIn:
        """Bind the socket and serve in a daemon thread."""
        standin = self

        class Handler(_Handler):
            owner = standin

        server = socketserver.ThreadingUnixStreamServer(self.sock_path, Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.02,),
                                        name="zeusd-standin",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, remove the socket file."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        Path(self.sock_path).unlink(missing_ok=True)

    def __enter__(self) -> ZeusdStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test helpers -------------------------------------------------------------------------
    def answer_next(self, operation: str, status: int, body: str | bytes | dict = b"",
                    times: int = 1) -> None:
        """Answer the next ``times`` requests for ``operation`` with ``status`` and ``body`` (a
        dict is sent as JSON), applying nothing."""
        if isinstance(body, dict):
            answer = _json(status, body)
        else:
            answer = _text(status, body.decode() if isinstance(body, bytes) else body)
        with self._lock:
            self._canned.setdefault(operation, []).extend([answer] * int(times))

    def posts(self) -> list[tuple[str, dict[str, str]]]:
        """(path, query) of every POST seen, in order."""
        with self._lock:
            return [(r.path, r.params) for r in self.requests if r.method == "POST"]

    def clear(self) -> None:
        """Forget the requests and changes seen so far."""
        with self._lock:
            self.requests.clear()
            self.applied.clear()

    # -- what zeusd does ----------------------------------------------------------------------
    def _serve(self, method: str, target: str, body: bytes, auth: str | None) -> _Answer:
        parts = urlsplit(target)
        path = parts.path
        query = tuple(parse_qsl(parts.query, keep_blank_values=True))
        try:
            answer = self._route(method, path, query, auth)
        except _Answer as a:
            answer = a
        with self._lock:
            self.requests.append(Request(method, path, query, body, auth, answer.status))
        return answer

    def _route(self, method: str, path: str, query: tuple[tuple[str, str], ...],
               auth: str | None) -> _Answer:
        op = path[len("/gpu/"):] if path.startswith("/gpu/") else ""
        if op not in WRITE_ROUTES:
            raise _Answer(404)
        if not self.control_enabled:       # the auth middleware, before routing
            raise _json(404, {"error": "API group 'gpu-control' is not enabled on this server."})
        if self.token is not None:
            if not auth or not auth.startswith("Bearer "):
                raise _json(401, {"error": "Authentication required. Provide an "
                                           "Authorization: Bearer <token> header."})
            if auth[len("Bearer "):] != self.token:
                raise _json(401, {"error": "Invalid token."})
        if method != "POST":
            raise _Answer(404)
        with self._lock:
            canned = self._canned.get(op)
            if canned:
                raise canned.pop(0)
        fields = self._deserialize(op, query)
        gpu_ids = self._gpu_ids(fields.pop("gpu_ids"))
        block = fields.pop("block")
        values = tuple(int(fields[name]) for name, kind in WRITE_ROUTES[op] if kind == "u32")
        errors: dict[str, tuple[int, str]] = {}
        for gpu in gpu_ids:
            failed = self._apply(op, gpu, values, fields)
            if failed is not None:
                errors[str(gpu)] = failed
        if errors and block:
            worst = max(status for status, _ in errors.values())
            raise _json(worst, {"errors": {k: msg for k, (_, msg) in errors.items()}})
        return _Answer(200)

    @staticmethod
    def _deserialize(op: str, query: tuple[tuple[str, str], ...]) -> dict[str, Any]:
        """The query as zeusd's serde struct would take it (deny_unknown_fields)."""
        spec = {"gpu_ids": "string", **dict(WRITE_ROUTES[op]), "block": "bool"}
        seen: dict[str, Any] = {}
        for key, raw in query:
            if key not in spec:
                expected = ", ".join(f"`{k}`" for k in spec)
                raise _text(400, f"Query deserialize error: unknown field `{key}`, expected "
                                 f"one of {expected}")
            if key in seen:
                raise _text(400, f"Query deserialize error: duplicate field `{key}`")
            kind = spec[key]
            if kind == "u32":
                if not raw.isdigit() or int(raw) >= 2 ** 32:
                    raise _text(400, "Query deserialize error: invalid digit found in string")
                seen[key] = int(raw)
            elif kind == "bool":
                if raw not in ("true", "false"):
                    raise _text(400, "Query deserialize error: provided string was not `true` "
                                     "or `false`")
                seen[key] = raw == "true"
            else:
                seen[key] = raw
        for key in spec:
            if key not in seen:
                raise _text(400, f"Query deserialize error: missing field `{key}`")
        return seen

    def _gpu_ids(self, raw: str) -> list[int]:
        if not raw.strip():
            raise _json(400, {"error": "gpu_ids must contain at least one GPU index"})
        ids = []
        for part in raw.split(","):
            p = part.strip()
            if not p:
                raise _json(400, {"error": "gpu_ids contains an empty GPU index"})
            if not p.isdigit():
                raise _json(400, {"error": f"Invalid GPU index: {p}"})
            ids.append(int(p))
        ids = sorted(set(ids))
        for i in ids:
            if i >= self.gpu_count:
                raise _text(400, f"GPU index {i} does not exist.")
        return ids

    def _apply(self, op: str, gpu: int, values: tuple[int, ...],
               fields: dict[str, Any]) -> tuple[int, str] | None:
        """Make the driver calls for ``op`` on ``gpu``; (status, message) if one failed."""
        nv = self.nvml
        with self._lock:
            if nv is not None:
                args: tuple[Any, ...] = (fields["enabled"],) if op == "set_persistence_mode" \
                    else values
                try:
                    handle = nv.nvmlDeviceGetHandleByIndex(gpu)
                    for fn in _NVML_CALLS[op]:
                        if hasattr(nv, fn):
                            getattr(nv, fn)(handle, *args)
                except nv.NVMLError as exc:
                    code = getattr(exc, "value", None)
                    if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", 4):
                        status = 403
                    elif code in (getattr(nv, "NVML_ERROR_INVALID_ARGUMENT", 2),
                                  getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3)):
                        status = 400
                    else:
                        status = 500
                    return status, f"NVML error: {exc}"
            self.applied.append((op, gpu, values))
        return None


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 front of :class:`ZeusdStandIn` (``owner`` set per server)."""

    owner: ZeusdStandIn
    protocol_version = "HTTP/1.1"

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        answer = self.owner._serve(self.command, self.path, body,
                                   self.headers.get("Authorization"))
        self.send_response(answer.status)
        if answer.body:
            self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        try:
            self.end_headers()
            if answer.body:
                self.wfile.write(answer.body)
        except (BrokenPipeError, ConnectionResetError):
            pass              # the client hung up early: nothing left to tell it

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Quiet (a Unix socket has no client address to log)."""
