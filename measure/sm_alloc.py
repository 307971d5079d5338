"""Run any callable on n SMs through CUDA green contexts, and split a device into disjoint
SM partitions for co-runs.

Green contexts partition SMs per process without changing any card setting, so this is the
SM-allocation knob usable even on a GPU whose settings are not ours. They need **torch >= 2.9
built with CUDA >= 12.8** (:func:`check_green_context_support` says which part is missing).
The torch API changed across versions; this module feature-detects:

* torch 2.9–2.11: ``GreenContext.create(num_sms, device_id)`` then ``set_context()`` /
  ``pop_context()``;
* torch 2.12+: keyword-only ``GreenContext.create(*, num_sms=..., device_id=...)``;
* newer: constructor ``GreenContext(num_sms=...)``, ``ctx.sm_count`` and ``ctx.Stream()``.

Work runs on a **stream created from the context** (``ctx.Stream()`` under
``torch.cuda.stream``) where the API offers it; ``set_context`` / ``pop_context`` (deprecated
upstream, and fragile when work switches streams itself) is the fallback.

**Granted, not requested.** The driver rounds a request up to the architecture's granularity
(Hopper: multiples of 8, so 66 SMs run as 72). :func:`granted_sm_count` reads the count back
from the context where torch exposes it and computes it from the granularity otherwise; sweeps
record the granted count (:func:`measure.sweep.sweep`).

**Disjoint partitions.** ``GreenContext.create`` carves each context out of the *whole*
device, so two contexts created one after the other overlap (both start at the same SMs).
:func:`split_sms` makes a co-run's partitions from one split of the device instead: the CUDA
driver's ``cuDevSmResourceSplitByCount`` through ``cuda-python`` / ``cuda-bindings`` when it
is importable, else torch's own ``GreenContext.split`` when present. Where only the
overlapping contexts exist, the result says so (``SMSplit.disjoint`` is False): it is never
silently assumed disjoint.

torch and cuda-python are optional: without them a :class:`FeatureUnavailableError` says
what is missing.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from frontier.errors import InputError

from .device import Device, DeviceError, FeatureUnavailableError

log = logging.getLogger(__name__)

#: Oldest torch with ``torch.cuda.green_contexts`` that this module drives.
MIN_TORCH = (2, 9)
#: Oldest CUDA (torch's build, and the driver) with green contexts usable from torch.
MIN_CUDA = (12, 8)
#: What to install, in every message about a missing piece.
REQUIREMENT = "torch >= 2.9 built with CUDA >= 12.8"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise FeatureUnavailableError(
            f"SM allocation needs PyTorch with CUDA green contexts ({REQUIREMENT}): "
            "`pip install energy-calculus[torch]`; torch is not installed") from None
    return torch


def _version(text: Any) -> tuple[int, int] | None:
    """(major, minor) of a version string such as ``2.9.1+cu128`` or ``12.8``; None if absent
    or unparseable."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(text)) if text is not None else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_green_context_support(torch: Any) -> None:
    """Raise :class:`FeatureUnavailableError` naming what is missing when ``torch`` is older
    than 2.9, was built without CUDA, or with CUDA older than 12.8 (parts a module does not
    report are not checked)."""
    have = getattr(torch, "__version__", None)
    tv = _version(have)
    if tv is not None and tv < MIN_TORCH:
        raise FeatureUnavailableError(
            f"torch {have} is too old for CUDA green contexts: they need {REQUIREMENT} "
            "(`pip install 'torch>=2.9'`)")
    version = getattr(torch, "version", None)
    if version is None or not hasattr(version, "cuda"):
        return
    if version.cuda is None:
        raise FeatureUnavailableError(
            f"torch {have or '?'} was built without CUDA: green contexts need {REQUIREMENT}")
    cv = _version(version.cuda)
    if cv is not None and cv < MIN_CUDA:
        raise FeatureUnavailableError(
            f"torch {have or '?'} is built with CUDA {version.cuda}: green contexts need "
            f"{REQUIREMENT} (install a cu128 or newer torch build)")


def green_context_class(torch: Any = None) -> Any:
    """``torch.cuda.green_contexts.GreenContext``, or a clear error when absent or gated."""
    torch = torch if torch is not None else _torch()
    check_green_context_support(torch)
    gc_mod = getattr(getattr(torch, "cuda", None), "green_contexts", None)
    cls = getattr(gc_mod, "GreenContext", None)
    if cls is None:
        raise FeatureUnavailableError(
            f"torch {getattr(torch, '__version__', '?')} has no torch.cuda.green_contexts.GreenContext "
            f"(needs {REQUIREMENT})")
    return cls


def _create(cls: Any, num_sms: int, device_id: int) -> Any:
    create = getattr(cls, "create", None)
    if create is not None:
        params = inspect.signature(create).parameters
        kw_only = any(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
        if kw_only:
            kwargs = {"num_sms": num_sms}
            if "device_id" in params:
                kwargs["device_id"] = device_id
            return create(**kwargs)
        return create(num_sms, device_id)
    return cls(num_sms=num_sms)


def rounded_up(requested: int, granularity: int) -> int:
    """``requested`` rounded up to a multiple of ``granularity`` (what the driver grants)."""
    g = max(1, int(granularity))
    return -(-int(requested) // g) * g


def _granted(ctx: Any, requested: int, granularity: int) -> int:
    for attr in ("sm_count", "num_sms", "smCount"):
        try:
            v = getattr(ctx, attr, None)
        except Exception:  # noqa: BLE001 - a read-back property may call the driver
            v = None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return rounded_up(requested, granularity)


def _has_stream_api(ctx: Any, torch: Any) -> bool:
    cuda = getattr(torch, "cuda", None)
    return (callable(getattr(ctx, "Stream", None)) and callable(getattr(cuda, "stream", None))
            and callable(getattr(cuda, "current_stream", None)))


@dataclass
class SMAllocation:
    """A green context holding ``granted`` SMs (``requested`` rounded up by the driver).

    Used as a context manager: work inside runs on a stream of the context (``path ==
    "stream"``) when torch offers ``ctx.Stream()``, else between ``set_context()`` and
    ``pop_context()`` (``path == "set_context"``). A mutable handle (it holds the live
    context and its stream), not a value."""

    requested: int
    granted: int
    context: Any
    torch: Any = None
    device_index: int = 0
    path: str | None = None
    _stream: Any = field(default=None, repr=False)
    _guard: Any = field(default=None, repr=False)
    _parent: Any = field(default=None, repr=False)

    def __enter__(self) -> SMAllocation:
        if self.torch is not None and _has_stream_api(self.context, self.torch):
            cuda = self.torch.cuda
            if self._stream is None:
                self._stream = self.context.Stream()
            self._parent = cuda.current_stream(self.device_index)
            self._stream.wait_stream(self._parent)      # work queued before runs first
            self._guard = cuda.stream(self._stream)
            self._guard.__enter__()
            self.path = "stream"
        elif hasattr(self.context, "set_context"):
            self.context.set_context()
            self.path = "set_context"
        elif hasattr(self.context, "__enter__"):
            self.context.__enter__()
            self.path = "context_manager"
        else:
            raise FeatureUnavailableError("this GreenContext has neither Stream(), set_context() "
                                          "nor a context manager")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.path == "stream":
            guard, self._guard = self._guard, None
            guard.__exit__(*exc)
            self._parent.wait_stream(self._stream)      # work queued after waits for ours
        elif self.path == "set_context":
            self.context.pop_context()
        elif self.path == "context_manager":
            self.context.__exit__(*exc)


def allocate_sms(num_sms: int, device_index: int = 0, torch: Any = None,
                 granularity: int = 8) -> SMAllocation:
    """A green context with ``num_sms`` SMs on ``device_index`` (use as a context manager);
    ``granted`` is read back from the context (else rounded up to ``granularity``)."""
    if num_sms < 1:
        raise InputError(f"num_sms must be >= 1, got {num_sms}")
    torch = torch if torch is not None else _torch()
    cls = green_context_class(torch)
    try:
        ctx = _create(cls, int(num_sms), int(device_index))
    except FeatureUnavailableError:
        raise
    except Exception as exc:  # driver/runtime errors come as RuntimeError and friends
        raise FeatureUnavailableError(f"creating a green context with {num_sms} SMs failed: {exc}") from exc
    granted = _granted(ctx, int(num_sms), granularity)
    if granted != num_sms:
        log.debug("green context: %d SMs requested, %d granted", num_sms, granted)
    return SMAllocation(int(num_sms), granted, ctx, torch, int(device_index))


# Green contexts are created once per (torch module, device, SM count) and reused: creating
# one inside a timed window would be measured as part of the work.
_CACHE: dict[tuple[int, int, int], tuple[Any, SMAllocation]] = {}


def cached_allocation(num_sms: int, device_index: int = 0, torch: Any = None) -> SMAllocation:
    """A reused green context of ``num_sms`` SMs (created on first use)."""
    torch = torch if torch is not None else _torch()
    key = (id(torch), int(device_index), int(num_sms))
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not torch:      # holding torch keeps its id from being reused
        hit = _CACHE[key] = (torch, allocate_sms(num_sms, device_index, torch))
    return hit[1]


def run_on_sms(work: Callable[[], Any], n: int, num_sms: int, device_index: int = 0,
               torch: Any = None) -> int:
    """Call ``work()`` n times inside a green context of ``num_sms`` SMs; returns SMs granted."""
    with cached_allocation(num_sms, device_index, torch) as alloc:
        for _ in range(int(n)):
            work()
    return alloc.granted


def available(torch: Any = None) -> bool:
    """Whether green contexts can be used here."""
    try:
        green_context_class(torch)
    except FeatureUnavailableError:
        return False
    return True


def granted_sm_count(device: Device, requested: int, torch: Any = None) -> int:
    """The SMs ``device`` grants for a request of ``requested``.

    On a real GPU with green contexts available (a device with a ``cuda_index``, e.g.
    :class:`~measure.nvml.NVMLDevice`), the count is read back from the (cached) context the
    work will run in; otherwise (the simulator, no torch, a failing driver) it is computed
    from the device's granularity (:meth:`~measure.device.OperatingSet.granted_sm_count`)."""
    opset = device.operating_set()
    if int(requested) >= opset.sm_count:
        return opset.sm_count
    if not getattr(device, "simulated", False) and hasattr(type(device), "cuda_index"):
        try:
            index = int(device.cuda_index)
            return min(opset.sm_count, cached_allocation(int(requested), index, torch).granted)
        except (DeviceError, ImportError) as exc:   # FeatureUnavailableError is a DeviceError
            log.debug("reading the granted SM count back failed (%s); computing it", exc)
    return opset.granted_sm_count(int(requested))


# -- disjoint partitions --------------------------------------------------------------------

@dataclass(frozen=True)
class SMPartition:
    """One group of SMs: ``granted`` of them (``requested`` rounded up). ``stream`` runs work
    on exactly these SMs (a torch stream where torch is present, else the driver's
    ``CUstream``); ``context`` is the green context behind it."""

    requested: int
    granted: int
    stream: Any = None
    context: Any = None

    def to_dict(self) -> dict[str, int]:
        """JSON-ready: requested and granted SMs."""
        return {"requested": self.requested, "granted": self.granted}


@dataclass(frozen=True)
class SMSplit:
    """Partitions for a co-run. ``disjoint``: no SM is in two partitions (made by one split of
    the device); False means the partitions **may share SMs** (separate contexts each carved
    from the whole device) and a co-run on them is labelled overlapping. ``method``:
    ``"driver_split"``, ``"torch_split"`` or ``"torch_contexts"``."""

    partitions: tuple[SMPartition, ...]
    disjoint: bool
    method: str
    note: str = ""

    @property
    def overlapping(self) -> bool:
        """Whether the partitions may share SMs (the label a co-run on them must carry)."""
        return not self.disjoint

    @property
    def granted(self) -> tuple[int, ...]:
        """SMs granted per partition, in request order."""
        return tuple(p.granted for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: partitions, ``disjoint``, ``overlapping``, method and note."""
        return {"partitions": [p.to_dict() for p in self.partitions], "disjoint": self.disjoint,
                "overlapping": self.overlapping, "method": self.method, "note": self.note}


def cuda_driver() -> Any:
    """The CUDA driver bindings (``cuda.bindings.driver``, else the older ``cuda.cuda``), or
    None when cuda-python is not installed."""
    try:
        from cuda.bindings import driver
        return driver
    except ImportError:
        pass
    try:
        from cuda import cuda as driver
        return driver
    except ImportError:
        return None


def _check(what: str, result: Any) -> Any:
    """The values of a cuda-python call (which returns ``(CUresult, *values)``), or a
    :class:`FeatureUnavailableError` naming the call and the error."""
    err, *vals = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise FeatureUnavailableError(f"{what} failed: {getattr(err, 'name', err)} ({int(err)})")
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else tuple(vals)


def _green_ctx(drv: Any, dev: Any, resource: Any) -> Any:
    desc = _check("cuDevResourceGenerateDesc", drv.cuDevResourceGenerateDesc([resource], 1))
    return _check("cuGreenCtxCreate", drv.cuGreenCtxCreate(
        desc, dev, drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))


def _driver_split(counts: Sequence[int], device_index: int, drv: Any, torch: Any) -> SMSplit:
    """Each partition split off what the previous splits left (``cuDevSmResourceSplitByCount``
    with one group, the remainder re-read through a green context as the next input, since
    drivers refuse a raw split output as input): siblings of a split are disjoint, so all are."""
    sm_type = drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
    _check("cuInit", drv.cuInit(0))
    dev = _check("cuDeviceGet", drv.cuDeviceGet(int(device_index)))
    resource = _check("cuDeviceGetDevResource", drv.cuDeviceGetDevResource(dev, sm_type))
    parts: list[SMPartition] = []
    for i, n in enumerate(counts):
        groups, _, remaining = _check(f"cuDevSmResourceSplitByCount({n} SMs)",
                                      drv.cuDevSmResourceSplitByCount(1, resource, 0, int(n)))
        group = groups[0]
        ctx = _green_ctx(drv, dev, group)
        stream = _check("cuGreenCtxStreamCreate", drv.cuGreenCtxStreamCreate(
            ctx, drv.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
        if torch is not None and hasattr(getattr(torch, "cuda", None), "ExternalStream"):
            stream = torch.cuda.ExternalStream(int(stream), int(device_index))
        parts.append(SMPartition(int(n), int(group.sm.smCount), stream, ctx))
        if i + 1 < len(counts):
            rest = _green_ctx(drv, dev, remaining)
            resource = _check("cuGreenCtxGetDevResource", drv.cuGreenCtxGetDevResource(rest, sm_type))
    return SMSplit(tuple(parts), True, "driver_split",
                   "one split of the device (cuDevSmResourceSplitByCount): partitions are disjoint")


def _torch_split(cls: Any, counts: Sequence[int], device_index: int, granularity: int) -> SMSplit:
    asked = tuple(rounded_up(n, granularity) for n in counts)   # torch's split does not round
    ctxs = cls.split(num_sms=asked, device_id=int(device_index))
    parts = tuple(SMPartition(int(n), _granted(c, n, granularity),
                              c.Stream() if callable(getattr(c, "Stream", None)) else None, c)
                  for n, c in zip(counts, ctxs))
    return SMSplit(parts, True, "torch_split", "one split of the device (GreenContext.split)")


def _overlapping(cls: Any, counts: Sequence[int], device_index: int, torch: Any,
                 granularity: int) -> SMSplit:
    parts = []
    for n in counts:
        a = allocate_sms(int(n), device_index, torch, granularity)
        stream = a.context.Stream() if _has_stream_api(a.context, torch) else None
        parts.append(SMPartition(int(n), a.granted, stream, a.context))
    note = ("separate green contexts, each carved from the whole device: they may share SMs "
            "(install cuda-python for a disjoint split); a co-run on them is labelled overlapping")
    log.warning("SM partitions %s: %s", "+".join(str(p.granted) for p in parts), note)
    return SMSplit(tuple(parts), False, "torch_contexts", note)


def split_sms(counts: Sequence[int], device_index: int = 0, torch: Any = None, driver: Any = None,
              granularity: int = 8, sm_total: int | None = None) -> SMSplit:
    """Partitions of ``counts`` SMs (each rounded up by the driver) for a co-run on one device.

    Tries, in order: the CUDA driver's split through cuda-python (``driver``: injected
    bindings, else :func:`cuda_driver`), torch's ``GreenContext.split``; both give disjoint
    partitions. Else one green context per count, which may overlap (``disjoint=False``,
    logged once as a warning). ``sm_total`` (optional) refuses granted sums over the device
    before anything is created."""
    counts = [int(n) for n in counts]
    if not counts or any(n < 1 for n in counts):
        raise InputError(f"SM counts must be >= 1 (at least one), got {counts}")
    want = [rounded_up(n, granularity) for n in counts]
    if sm_total is not None and sum(want) > sm_total:
        raise FeatureUnavailableError(
            f"SM split {'+'.join(map(str, counts))} is granted as {'+'.join(map(str, want))} = "
            f"{sum(want)} SMs, more than the device's {sm_total}")
    drv = driver if driver is not None else cuda_driver()
    if drv is not None:
        if torch is None:
            try:
                torch = _torch()
            except FeatureUnavailableError:
                torch = None
        return _driver_split(counts, device_index, drv, torch)
    torch = torch if torch is not None else _torch()
    cls = green_context_class(torch)
    if callable(getattr(cls, "split", None)):
        return _torch_split(cls, counts, device_index, granularity)
    return _overlapping(cls, counts, device_index, torch, granularity)
