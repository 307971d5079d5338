"""Fake ``torch`` and CUDA-driver (``cuda.bindings.driver``) modules for SM allocation tests.

They behave as the hardware was seen to behave (issue 30):

* a request is **rounded up** to the granularity (Hopper: multiples of 8; 66 runs as 72);
* ``GreenContext.create`` carves each context out of the **whole** device: a context of n SMs
  holds SMs ``0 .. n-1``, so two contexts created one after the other **overlap**;
* the driver's ``cuDevSmResourceSplitByCount`` takes its groups from the resource it is given
  and returns the rest as ``remaining``: **siblings are disjoint**. Like real drivers, it
  refuses a raw split output as input (re-read it through a green context first).

Every object carries ``sm_ids`` (a frozenset of SM indices) so a test can check overlap.

``make_fake_torch(version=..., cuda=..., stream_api=..., split_api=...)`` returns a
module-like namespace; ``make_fake_driver()`` a module-like driver. ``calls`` on each records
what was called, in order.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import types
from typing import Any

SM_TOTAL = 132
GRANULARITY = 8


def _granted(n: int, granularity: int, total: int) -> int:
    return min(total, -(-int(n) // granularity) * granularity)


class FakeStream:
    """A stream bound to a set of SMs; ``wait_stream`` is recorded."""

    _ids = itertools.count(1)

    def __init__(self, sm_ids: frozenset[int], calls: list) -> None:
        self.sm_ids = sm_ids
        self.handle = next(self._ids)
        self._calls = calls
        FakeStream.by_handle[self.handle] = self

    #: every stream made, by handle (an ``ExternalStream`` of a driver stream wraps it)
    by_handle: dict[int, FakeStream] = {}

    def wait_stream(self, other: Any) -> None:
        self._calls.append(("wait_stream", self.handle, getattr(other, "handle", None)))

    def wait_event(self, event: Any) -> None:
        self._calls.append(("wait_event", self.handle, event.handle))

    def __int__(self) -> int:
        return self.handle


class FakeEvent:
    """A CUDA event; ``record`` notes the stream it was recorded on."""

    _ids = itertools.count(1)

    def __init__(self, calls: list) -> None:
        self.handle = next(self._ids)
        self._calls = calls

    def record(self, stream: Any = None) -> None:
        self._calls.append(("record", self.handle, getattr(stream, "handle", None)))


def make_fake_torch(version: str = "2.9.1+cu128", cuda: str | None = "12.8", *,
                    stream_api: bool = True, split_api: bool = False, green_contexts: bool = True,
                    sm_total: int = SM_TOTAL, granularity: int = GRANULARITY,
                    fail_create: str | None = None) -> Any:
    """A fake torch whose ``cuda.green_contexts.GreenContext`` rounds and overlaps as above.

    ``stream_api``: contexts offer ``Stream()`` (newer torch); else only set/pop.
    ``split_api``: ``GreenContext.split(num_sms=(...))`` gives disjoint contexts (torch's own
    split, CUDA 13.1+). ``fail_create``: every create raises RuntimeError with this text."""
    calls: list[tuple] = []
    state: dict[str, Any] = {"current": None, "context": None}
    default = FakeStream(frozenset(range(sm_total)), calls)

    class GreenContext:
        def __init__(self, *, num_sms: int | None = None, device_id: int | None = None,
                     _ids: frozenset[int] | None = None) -> None:
            if fail_create:
                raise RuntimeError(fail_create)
            if _ids is None:
                if num_sms is None or not 0 < num_sms <= sm_total:
                    raise RuntimeError(f"Invalid number of SMs requested for green context: {num_sms}")
                _ids = frozenset(range(_granted(num_sms, granularity, sm_total)))  # from SM 0: overlap
            self.sm_ids = _ids
            self.requested = num_sms
            calls.append(("create", num_sms, device_id, len(_ids)))

        @property
        def sm_count(self) -> int:
            return len(self.sm_ids)

        @staticmethod
        def create(*, num_sms: int | None = None, device_id: int | None = None) -> GreenContext:
            return GreenContext(num_sms=num_sms, device_id=device_id)

        def set_context(self) -> None:
            state["context"] = self
            calls.append(("set_context", self.sm_count))

        def pop_context(self) -> None:
            state["context"] = None
            calls.append(("pop_context", self.sm_count))

    if stream_api:
        def Stream(self: Any) -> FakeStream:   # noqa: N802 - torch's name
            s = FakeStream(self.sm_ids, calls)
            calls.append(("Stream", self.sm_count, s.handle))
            return s
        GreenContext.Stream = Stream

    if split_api:
        def split(*, num_sms: tuple[int, ...], device_id: int | None = None) -> tuple:
            free = sorted(range(sm_total))
            out = []
            for n in num_sms:
                if n % granularity or n > len(free):
                    raise RuntimeError(f"CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION for {n} SMs")
                ids, free = frozenset(free[:n]), free[n:]
                out.append(GreenContext(num_sms=n, device_id=device_id, _ids=ids))
            calls.append(("split", tuple(num_sms)))
            return tuple(out)
        GreenContext.split = staticmethod(split)

    @contextlib.contextmanager
    def stream(s: Any):
        prev, state["current"] = state["current"], s
        calls.append(("enter_stream", s.handle))
        try:
            yield s
        finally:
            state["current"] = prev
            calls.append(("exit_stream", s.handle))

    def current_stream(device: int | None = None) -> FakeStream:
        return state["current"] or default

    def ExternalStream(handle: int, device: int | None = None) -> Any:   # noqa: N802
        inner = FakeStream.by_handle.get(int(handle))
        return types.SimpleNamespace(handle=int(handle), external=True, device=device,
                                     sm_ids=getattr(inner, "sm_ids", None),
                                     wait_event=getattr(inner, "wait_event", None))

    def Stream(device: int | None = None) -> FakeStream:   # noqa: N802 - torch's name
        """A new stream: on the green context current at its creation, else the whole device."""
        ctx = state["context"]
        s = FakeStream(ctx.sm_ids if ctx is not None else frozenset(range(sm_total)), calls)
        calls.append(("new_stream", len(s.sm_ids), s.handle))
        return s

    cuda_ns = types.SimpleNamespace(
        stream=stream, current_stream=current_stream, ExternalStream=ExternalStream,
        Stream=Stream, Event=lambda: FakeEvent(calls),
        is_available=lambda: True, synchronize=lambda device=None: calls.append(("synchronize",)),
        get_device_properties=lambda device=None: types.SimpleNamespace(multi_processor_count=sm_total))
    if green_contexts:
        cuda_ns.green_contexts = types.SimpleNamespace(GreenContext=GreenContext)
    return types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(cuda=cuda),
                                 cuda=cuda_ns, calls=calls, state=state)


class CUresult(enum.IntEnum):
    """The subset of ``CUresult`` the fake returns."""

    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_RESOURCE_TYPE = 914
    CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 915


class _Resource:
    """A ``CUdevResource`` of type SM: ``.type``, ``.sm.smCount`` and the fake's ``sm_ids``."""

    def __init__(self, sm_ids: frozenset[int], raw_split: bool = False) -> None:
        self.type = 1
        self.sm_ids = frozenset(sm_ids)
        self.sm = types.SimpleNamespace(smCount=len(self.sm_ids))
        self.raw_split = raw_split


def make_fake_driver(sm_total: int = SM_TOTAL, granularity: int = GRANULARITY) -> Any:
    """A fake ``cuda.bindings.driver``: calls return ``(CUresult, *values)`` like cuda-python."""
    calls: list[tuple] = []
    ok = CUresult.CUDA_SUCCESS

    def cuInit(flags: int) -> tuple:   # noqa: N802 - the driver's names
        calls.append(("cuInit",))
        return (ok,)

    def cuDeviceGet(ordinal: int) -> tuple:   # noqa: N802
        return ok, int(ordinal)

    def cuDeviceGetDevResource(device: int, typ: int) -> tuple:   # noqa: N802
        return ok, _Resource(frozenset(range(sm_total)))

    def cuDevSmResourceSplitByCount(nbGroups: int, input_: Any, useFlags: int,  # noqa: N802,N803
                                    minCount: int) -> tuple:
        calls.append(("split", nbGroups, input_.sm.smCount, minCount))
        if input_.raw_split:
            return CUresult.CUDA_ERROR_INVALID_RESOURCE_TYPE, None, 0, None
        n = _granted(minCount, granularity, sm_total)
        free = sorted(input_.sm_ids)
        if n * nbGroups > len(free):
            return CUresult.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, None, 0, None
        groups = [_Resource(frozenset(free[i * n:(i + 1) * n]), raw_split=True) for i in range(nbGroups)]
        rest = _Resource(frozenset(free[n * nbGroups:]), raw_split=True)
        return ok, groups, nbGroups, rest

    def cuDevResourceGenerateDesc(resources: list, nbResources: int) -> tuple:   # noqa: N802,N803
        return ok, types.SimpleNamespace(sm_ids=frozenset().union(*(r.sm_ids for r in resources)))

    def cuGreenCtxCreate(desc: Any, dev: int, flags: int) -> tuple:   # noqa: N802
        calls.append(("cuGreenCtxCreate", len(desc.sm_ids)))
        return ok, types.SimpleNamespace(sm_ids=desc.sm_ids)

    def cuGreenCtxGetDevResource(hCtx: Any, typ: int) -> tuple:   # noqa: N802,N803
        return ok, _Resource(hCtx.sm_ids)

    def cuGreenCtxStreamCreate(greenCtx: Any, flags: int, priority: int) -> tuple:   # noqa: N802,N803
        s = FakeStream(greenCtx.sm_ids, calls)
        return ok, s

    return types.SimpleNamespace(
        CUresult=CUresult, calls=calls,
        CUdevResourceType=types.SimpleNamespace(CU_DEV_RESOURCE_TYPE_SM=1),
        CUgreenCtxCreate_flags=types.SimpleNamespace(CU_GREEN_CTX_DEFAULT_STREAM=1),
        CUstream_flags=types.SimpleNamespace(CU_STREAM_NON_BLOCKING=1),
        cuInit=cuInit, cuDeviceGet=cuDeviceGet, cuDeviceGetDevResource=cuDeviceGetDevResource,
        cuDevSmResourceSplitByCount=cuDevSmResourceSplitByCount,
        cuDevResourceGenerateDesc=cuDevResourceGenerateDesc, cuGreenCtxCreate=cuGreenCtxCreate,
        cuGreenCtxGetDevResource=cuGreenCtxGetDevResource, cuGreenCtxStreamCreate=cuGreenCtxStreamCreate)
