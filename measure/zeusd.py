"""Change GPU clocks and power limits without root, through zeusd (Zeus's privileged daemon).

Locking clocks and setting the power limit need root (``CAP_SYS_ADMIN``); reading them does
not. `zeusd <https://ml.energy/zeus/zeusd/>`_ runs as root and offers those setters over HTTP
on a Unix domain socket, whose path its users export as ``ZEUSD_SOCK_PATH``. With that variable
set, :class:`~measure.nvml.NVMLDevice` sends its five setters and resets here
(:class:`ZeusdClient`) and keeps every read on NVML (docs/zeusd.md).

The protocol is that of zeusd 0.3 and later (checked against zeusd 0.5.0,
``zeusd/src/routes/gpu.rs``): ``POST /gpu/<operation>`` with everything in the query string,
no body — ``gpu_ids`` (comma-separated NVML indices), the operation's own fields and
``block``; ``block=true`` makes zeusd answer only after the driver call, with its outcome:

=====================================  ==========================================
route                                  query fields besides ``gpu_ids``, ``block``
=====================================  ==========================================
``/gpu/set_gpu_locked_clocks``         ``min_clock_mhz``, ``max_clock_mhz``
``/gpu/reset_gpu_locked_clocks``       none
``/gpu/set_mem_locked_clocks``         ``min_clock_mhz``, ``max_clock_mhz``
``/gpu/reset_mem_locked_clocks``       none
``/gpu/set_power_limit``               ``power_limit_mw``
=====================================  ==========================================

Success is 200 with an empty body. zeusd's refusals, as :class:`ZeusdClient` types them (one
line each, naming the route and zeusd's own message):

* 400 — a value the card refuses (NVML ``InvalidArg``/``NotSupported``, "Invalid request"):
  :class:`~measure.device.UnsupportedSettingError`; no such GPU index ("GPU index N does not
  exist.") or a query zeusd cannot parse: :class:`ZeusdError`;
* 401 (a token is required or was rejected) and 403 (NVML ``NoPermission``: zeusd itself is
  not privileged, or the token lacks the ``gpu-control`` scope):
  :class:`~measure.device.PermissionDeniedError`;
* 404 — the ``gpu-control`` API group is disabled, or zeusd is older than 0.3 (its routes
  were ``/gpu/{id}/...`` with a JSON body): :class:`ZeusdError`;
* 5xx — zeusd or the driver failed: retried (the setters are idempotent), then
  :class:`ZeusdError` with ``maybe_applied`` set;
* no socket, nothing listening, no permission to connect: :class:`ZeusdError` saying zeusd is
  not reachable at that path and what to do.

Bodies are JSON ``{"errors": {"<gpu id>": "<message>"}}`` for per-GPU failures,
``{"error": "<message>"}`` for some refusals, or plain text (actix-web's own errors).

Every error carries ``route``, ``status`` (None when zeusd was not reached) and
``maybe_applied``: True only when the request may have reached the driver (a timeout or a lost
connection after it was sent, a 5xx), so a journal keeps the setting to restore it.
Standard library only (``http.client`` over ``AF_UNIX``); a fresh connection per request.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Protocol
from urllib.parse import urlencode

from .device import DeviceError, PermissionDeniedError, UnsupportedSettingError

log = logging.getLogger(__name__)

#: Environment variable naming zeusd's Unix socket (the one Zeus reads).
SOCK_PATH_ENV = "ZEUSD_SOCK_PATH"
#: Environment variable holding a zeusd bearer token (needed only when zeusd requires auth).
TOKEN_ENV = "ZEUSD_TOKEN"
#: Seconds to wait for zeusd to connect and answer one request.
DEFAULT_TIMEOUT_S = 10.0

_MAX_BODY_BYTES = 64 * 1024
_MAX_MESSAGE_CHARS = 300

_TO_DO = ("start zeusd (`sudo zeusd serve --socket-path {path} --socket-permissions 666`, "
          "docs/zeusd.md), or unset " + SOCK_PATH_ENV + " to call NVML directly (needs root)")


class SetterRelay(Protocol):
    """What :class:`~measure.nvml.NVMLDevice` needs to relay its root-only calls: the five
    setters and resets, by NVML GPU index, raising :class:`~measure.device.DeviceError`."""

    def set_gpu_locked_clocks(self, gpu_index: int, min_clock_mhz: int,
                              max_clock_mhz: int) -> None:
        """Lock the SM clock of GPU ``gpu_index`` to ``[min_clock_mhz, max_clock_mhz]``."""

    def reset_gpu_locked_clocks(self, gpu_index: int) -> None:
        """Remove the SM clock lock of GPU ``gpu_index``."""

    def set_mem_locked_clocks(self, gpu_index: int, min_clock_mhz: int,
                              max_clock_mhz: int) -> None:
        """Lock the memory clock of GPU ``gpu_index`` to ``[min_clock_mhz, max_clock_mhz]``."""

    def reset_mem_locked_clocks(self, gpu_index: int) -> None:
        """Remove the memory clock lock of GPU ``gpu_index``."""

    def set_power_limit(self, gpu_index: int, power_limit_mw: int) -> None:
        """Set the power limit of GPU ``gpu_index``, in milliwatts."""


class ZeusdError(DeviceError):
    """zeusd was not reachable, or refused or failed a request (module doc).

    ``route`` is the request's path (e.g. ``/gpu/set_power_limit``), ``status`` zeusd's HTTP
    status (None when it was not reached), ``maybe_applied`` whether the change may have
    happened anyway."""

    def __init__(self, message: str, route: str = "", status: int | None = None,
                 maybe_applied: bool = False):
        self.route, self.status, self.maybe_applied = route, status, maybe_applied
        super().__init__(message)


class _UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection over a Unix domain socket (the Host header says localhost)."""

    def __init__(self, sock_path: str, timeout_s: float):
        super().__init__("localhost", timeout=timeout_s)
        self._sock_path = sock_path

    def connect(self) -> None:
        """Connect to the socket file (replaces the TCP connect)."""
        self.sock = _open_socket(self._sock_path, self.timeout)


def _open_socket(sock_path: str, timeout_s: float | None) -> socket.socket:
    """A stream socket connected to ``sock_path`` with ``timeout_s`` on every operation."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(sock_path)
    except BaseException:
        sock.close()
        raise
    return sock


def _one_line(text: str) -> str:
    """``text`` on one line, at most a few hundred characters."""
    line = " ".join(text.split())
    return line if len(line) <= _MAX_MESSAGE_CHARS else line[:_MAX_MESSAGE_CHARS - 1] + "…"


def _message(body: bytes, reason: str) -> str:
    """zeusd's message in a refusal: the per-GPU ``errors``, an ``error``, or the text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        errors = doc.get("errors")
        if isinstance(errors, dict) and errors:
            return _one_line("; ".join(f"GPU {k}: {v}" for k, v in sorted(errors.items())))
        if isinstance(doc.get("error"), str):
            return _one_line(doc["error"])
    return _one_line(text) if text else reason or "no message"


def _u32(name: str, value: int) -> int:
    """``value`` as zeusd's unsigned 32-bit field ``name`` (UnsupportedSettingError if not)."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise UnsupportedSettingError(f"{name} must be an integer, got {value!r}") from None
    if not 0 <= v < 2 ** 32 or v != value:
        raise UnsupportedSettingError(f"{name} must be a whole number from 0 to 2^32-1, "
                                      f"got {value!r}")
    return v


class ZeusdClient:
    """Client of a zeusd at Unix socket ``sock_path`` for the five GPU setters and resets.

    Each call connects afresh, sends ``POST /gpu/<operation>?gpu_ids=N&...&block=true`` (with
    ``Authorization: Bearer token`` when a token is given) and returns once zeusd has applied
    it, or raises a one-line typed error (module doc). A 5xx answer is retried ``attempts``
    times in all, waiting ``backoff_s`` (doubling) with ``sleep`` between tries;
    ``timeout_s`` bounds connecting and each wait for an answer.
    """

    def __init__(self, sock_path: str | os.PathLike[str], timeout_s: float = DEFAULT_TIMEOUT_S,
                 token: str | None = None, attempts: int = 3, backoff_s: float = 0.05,
                 sleep: Callable[[float], None] = time.sleep):
        self.sock_path = os.fspath(sock_path)
        self.timeout_s = float(timeout_s)
        self.token = token or None
        self.attempts = max(1, int(attempts))
        self.backoff_s = float(backoff_s)
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"ZeusdClient({self.sock_path!r}, timeout_s={self.timeout_s:g})"

    # -- the five operations ---------------------------------------------------------------
    def set_gpu_locked_clocks(self, gpu_index: int, min_clock_mhz: int,
                              max_clock_mhz: int) -> None:
        """Lock the SM clock of GPU ``gpu_index`` (NVML index) to ``[min, max]`` MHz."""
        self._post("set_gpu_locked_clocks", gpu_index,
                   min_clock_mhz=_u32("min_clock_mhz", min_clock_mhz),
                   max_clock_mhz=_u32("max_clock_mhz", max_clock_mhz))

    def reset_gpu_locked_clocks(self, gpu_index: int) -> None:
        """Remove the SM clock lock of GPU ``gpu_index`` (NVML index)."""
        self._post("reset_gpu_locked_clocks", gpu_index)

    def set_mem_locked_clocks(self, gpu_index: int, min_clock_mhz: int,
                              max_clock_mhz: int) -> None:
        """Lock the memory clock of GPU ``gpu_index`` (NVML index) to ``[min, max]`` MHz."""
        self._post("set_mem_locked_clocks", gpu_index,
                   min_clock_mhz=_u32("min_clock_mhz", min_clock_mhz),
                   max_clock_mhz=_u32("max_clock_mhz", max_clock_mhz))

    def reset_mem_locked_clocks(self, gpu_index: int) -> None:
        """Remove the memory clock lock of GPU ``gpu_index`` (NVML index)."""
        self._post("reset_mem_locked_clocks", gpu_index)

    def set_power_limit(self, gpu_index: int, power_limit_mw: int) -> None:
        """Set the power limit of GPU ``gpu_index`` (NVML index), in milliwatts."""
        self._post("set_power_limit", gpu_index,
                   power_limit_mw=_u32("power_limit_mw", power_limit_mw))

    # -- one request -----------------------------------------------------------------------
    def _post(self, operation: str, gpu_index: int, **fields: int) -> None:
        route = f"/gpu/{operation}"
        query = urlencode({"gpu_ids": str(_u32("gpu_index", gpu_index)),
                           **{k: str(v) for k, v in fields.items()}, "block": "true"})
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            status, reason, body = self._send(route, query)
            log.debug("zeusd %s POST %s?%s -> %d", self.sock_path, route, query, status)
            if 200 <= status < 300:        # zeusd answers 200 with an empty body
                return
            if status >= 500 and attempt < self.attempts:
                self._sleep(delay)
                delay *= 2
                continue
            raise self._refusal(route, status, _message(body, reason), gpu_index, attempt)

    def _send(self, route: str, query: str) -> tuple[int, str, bytes]:
        """POST ``route?query``; zeusd's (status, reason, body). Connection failures raise."""
        conn = _UnixHTTPConnection(self.sock_path, self.timeout_s)
        try:
            try:
                conn.connect()
            except OSError as exc:
                raise self._unreachable(route, exc) from None
            headers = {"Content-Length": "0", "Connection": "close"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            try:
                conn.request("POST", f"{route}?{query}", headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.reason, resp.read(_MAX_BODY_BYTES)
            except (OSError, http.client.HTTPException) as exc:
                # Sent, perhaps applied: the caller must assume the change may have happened.
                what = (f"did not answer within {self.timeout_s:g} s"
                        if isinstance(exc, TimeoutError)
                        else f"dropped the connection ({type(exc).__name__}: {exc})")
                raise ZeusdError(f"zeusd at {self.sock_path} {what} to POST {route}; the change "
                                 "may or may not have been made", route,
                                 maybe_applied=True) from None
        finally:
            conn.close()

    def _unreachable(self, route: str, exc: OSError) -> ZeusdError:
        """The one-line error for a socket that cannot be connected to."""
        if isinstance(exc, FileNotFoundError):
            why = "no socket there"
        elif isinstance(exc, ConnectionRefusedError):
            why = "nothing is listening there (zeusd is not running, or left a stale socket)"
        elif isinstance(exc, PermissionError):
            why = ("this user may not connect to it (the socket's mode or owner: start zeusd "
                   "with --socket-permissions 666, or --socket-gid of a group you are in)")
        elif isinstance(exc, TimeoutError):
            why = f"it did not accept a connection within {self.timeout_s:g} s"
        else:
            why = f"{type(exc).__name__}: {exc.strerror or exc}"
        return ZeusdError(f"zeusd is not reachable at {self.sock_path} ({SOCK_PATH_ENV}): {why}; "
                          + _TO_DO.format(path=self.sock_path), route)

    def _refusal(self, route: str, status: int, message: str, gpu_index: int,
                 attempts: int) -> DeviceError:
        """zeusd's non-200 answer as a typed one-line error (module doc)."""
        call = f"zeusd POST {route}"
        said = f"HTTP {status}: {message}"
        if status == 401:
            err: DeviceError = PermissionDeniedError(
                call, said, f"zeusd at {self.sock_path} requires a token: set {TOKEN_ENV} to one "
                "with the gpu-control scope (`zeusd token issue`)")
        elif status == 403:
            err = PermissionDeniedError(
                call, said, f"zeusd at {self.sock_path} was refused the change: run zeusd as root "
                "(or with CAP_SYS_ADMIN) with the gpu-control API group enabled; if it requires "
                f"tokens, {TOKEN_ENV} must hold one with the gpu-control scope")
        elif status == 400 and "does not exist" in message:
            err = ZeusdError(f"{call} failed ({said}): zeusd has no GPU {gpu_index}; it numbers "
                             "GPUs as NVML does on its host, so run it on this host seeing all "
                             "GPUs", route, status)
        elif status == 400 and ("NVML error" in message or "Invalid request" in message
                                or "not supported" in message.lower()):
            err = UnsupportedSettingError(f"{call} failed: the GPU refused the value ({said})")
        elif status == 404:
            err = ZeusdError(f"{call} failed ({said}): zeusd at {self.sock_path} does not offer "
                             "this route: enable the gpu-control API group (`zeusd serve --enable "
                             "gpu-control ...`), or upgrade zeusd (0.3 or later)", route, status)
        elif status >= 500:
            tries = f" after {attempts} tries" if attempts > 1 else ""
            err = ZeusdError(f"{call} failed{tries} ({said}); the change may or may not have "
                             "been made", route, status, maybe_applied=True)
        else:
            err = ZeusdError(f"{call} was rejected ({said}): is zeusd at {self.sock_path} "
                             "0.3 or later?", route, status)
        if not isinstance(err, ZeusdError):     # the same attributes on the typed ones
            vars(err).update(route=route, status=status, maybe_applied=False)
        return err


def zeusd_from_env(environ: Mapping[str, str] = os.environ,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> ZeusdClient | None:
    """A :class:`ZeusdClient` for the socket in ``ZEUSD_SOCK_PATH`` (token: ``ZEUSD_TOKEN``),
    or None when that variable is unset or empty. Nothing is connected yet."""
    path = environ.get(SOCK_PATH_ENV, "").strip()
    if not path:
        return None
    return ZeusdClient(path, timeout_s=timeout_s, token=environ.get(TOKEN_ENV) or None)
