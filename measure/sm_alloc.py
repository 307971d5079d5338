"""Run any callable on n SMs through CUDA green contexts (``torch.cuda.green_contexts``).

Green contexts partition SMs per process without changing any card setting, so this is the
SM-allocation knob usable even on a GPU whose settings are not ours. The torch API changed
across versions; this module feature-detects:

* torch 2.9–2.11: ``GreenContext.create(num_sms, device_id)`` then ``set_context()`` /
  ``pop_context()``;
* torch 2.12+: keyword-only ``GreenContext.create(*, num_sms=..., device_id=...)``;
* torch 2.14+: constructor ``GreenContext(num_sms=...)``.

Hopper grants SMs in multiples of 8 (a request is rounded up): the count actually granted is
read back when torch exposes it (else computed from the granularity) and returned.
torch is optional: without it (or without the feature) a :class:`FeatureUnavailableError`
says what is missing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .device import FeatureUnavailableError


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise FeatureUnavailableError(
            "SM allocation needs PyTorch with CUDA green contexts (torch >= 2.9): "
            "`pip install energy-calculus[torch]`; torch is not installed") from None
    return torch


def green_context_class(torch: Any = None) -> Any:
    """``torch.cuda.green_contexts.GreenContext``, or a clear error when absent."""
    torch = torch if torch is not None else _torch()
    gc_mod = getattr(getattr(torch, "cuda", None), "green_contexts", None)
    cls = getattr(gc_mod, "GreenContext", None)
    if cls is None:
        raise FeatureUnavailableError(
            f"torch {getattr(torch, '__version__', '?')} has no torch.cuda.green_contexts.GreenContext "
            "(needs torch >= 2.9 with CUDA >= 12.4)")
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


def _granted(ctx: Any, requested: int, granularity: int) -> int:
    for attr in ("sm_count", "num_sms", "smCount"):
        v = getattr(ctx, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return -(-requested // granularity) * granularity


@dataclass
class SMAllocation:
    """A green context holding ``granted`` SMs (``requested`` rounded up by the driver)."""

    requested: int
    granted: int
    context: Any

    def __enter__(self) -> SMAllocation:
        if hasattr(self.context, "set_context"):
            self.context.set_context()
        elif hasattr(self.context, "__enter__"):
            self.context.__enter__()
        else:
            raise FeatureUnavailableError("this GreenContext has neither set_context() nor a context manager")
        return self

    def __exit__(self, *exc: Any) -> None:
        if hasattr(self.context, "pop_context"):
            self.context.pop_context()
        elif hasattr(self.context, "__exit__"):
            self.context.__exit__(*exc)


def allocate_sms(num_sms: int, device_index: int = 0, torch: Any = None,
                 granularity: int = 8) -> SMAllocation:
    """A green context with ``num_sms`` SMs on ``device_index`` (use as a context manager)."""
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {num_sms}")
    cls = green_context_class(torch)
    try:
        ctx = _create(cls, int(num_sms), int(device_index))
    except FeatureUnavailableError:
        raise
    except Exception as exc:  # driver/runtime errors come as RuntimeError and friends
        raise FeatureUnavailableError(f"creating a green context with {num_sms} SMs failed: {exc}") from exc
    return SMAllocation(int(num_sms), _granted(ctx, int(num_sms), granularity), ctx)


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
