"""Open devices and resolve work from command-line strings (``ecal characterize``).

Your own code is named ``package.module:attribute``, imported the way ``python -m`` would: the
current working directory is put first on ``sys.path`` (no ``PYTHONPATH`` needed). The
attribute is either the **work** itself (a zero-argument callable, one step of what is
measured) or a **factory** that builds it::

    # mytrain.py
    def make_step():                 # factory: runs once, outside every timed window
        model = build_model().cuda()
        batch = load_batch()
        opt = torch.optim.AdamW(model.parameters())

        def step():                  # work: what each timed window repeats
            opt.zero_grad(set_to_none=True)
            model(batch).sum().backward()
            opt.step()

        return step

How the two are told apart (:func:`resolve_work`, ``factory=None``): the attribute is called
once, before any device setting changes. If that call returns a callable (or a mapping of
implementation labels κ to callables), the attribute was a factory and what it returned is
the work; otherwise the attribute is the work, and that call was its first, unmeasured run (a
training step returns a loss tensor or None, never a function). A class is a factory by the
same rule (its instances are the work). ``factory=True`` / ``False`` (``ecal characterize
--factory`` / ``--no-factory``) decides it explicitly, e.g. for a step that returns a model.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from frontier.errors import EnergyCalculusError

from .device import Device, DeviceError


class UserCodeError(EnergyCalculusError):
    """The user's own code raised while it was imported or set up (its factory, or the first
    call that tells a factory from a work): ``spec`` names it, ``stage`` says where; the
    original exception is the ``__cause__``. Not a :class:`DeviceError`: ``ecal`` reports it
    as the user's work failing (exit 3, with the traceback), not as bad input."""

    def __init__(self, spec: str, stage: str):
        self.spec, self.stage = spec, stage
        super().__init__(f"your work {spec} raised during {stage}")


@dataclass(frozen=True)
class ResolvedWork:
    """What :func:`resolve_work` found: ``work`` (a callable, a simulated kernel, or a mapping
    κ label → callable), the ``name`` it suggests for the element (the preset's name, the
    work's ``name`` attribute, else the attribute as typed), and whether it came from a
    factory."""

    spec: str
    work: Any
    name: str
    from_factory: bool = False


#: What works without a GPU, for every message that refuses the user's own code for want of one.
WITHOUT_A_GPU = ("without a GPU you can still plan from profiles (`ecal plan` on a workload or a "
                 "Perseus profile), from Zeus logs (`ecal import zeus-log LOG -o sigs.json`), or try "
                 "the whole route on the simulator's presets (`ecal characterize --list`, `ecal demo`)")


def open_device(spec: str = "sim", read_only: bool = False, seed: int = 0, nvml: Any = None) -> Device:
    """``"sim"`` / ``"sim:h200"`` → a simulated H200; ``"nvml:INDEX"`` → a real GPU via NVML
    (``nvml``: an injected pynvml-like module, for tests)."""
    kind, _, arg = spec.strip().lower().partition(":")
    if kind == "sim":
        if arg not in ("", "h200"):
            raise DeviceError(f"unknown simulated device {spec!r}; known: sim, sim:h200")
        from .sim import SimulatedGPU

        return SimulatedGPU(seed=seed, read_only=read_only)
    if kind == "nvml":
        try:
            index = int(arg or "0")
        except ValueError:
            raise DeviceError(f"device {spec!r}: expected nvml:INDEX with an integer index") from None
        from .nvml import NVMLDevice

        return NVMLDevice(index=index, read_only=read_only, nvml=nvml)
    raise DeviceError(f"unknown device {spec!r}; use sim, sim:h200 or nvml:INDEX")


def resolve_work(spec: str, device: Device | None = None, factory: bool | None = None,
                 search_dir: str | os.PathLike | None = None) -> Any:
    """The work named by ``spec``: a simulated kernel preset by name (on the simulator), or
    ``module:attribute`` (your own code; a factory is called here, once). See
    :func:`load_work`, which also returns the suggested element name."""
    return load_work(spec, device, factory=factory, search_dir=search_dir).work


def load_work(spec: str, device: Device | None = None, factory: bool | None = None,
              search_dir: str | os.PathLike | None = None) -> ResolvedWork:
    """Resolve ``spec`` into a :class:`ResolvedWork`.

    ``module:attribute`` is imported with ``search_dir`` (default: the current working
    directory) first on ``sys.path`` (kept there, as ``python -m`` does, so the work can import
    its siblings later). ``factory``: None decides by calling the attribute once (module doc),
    True calls it and requires a callable back, False takes the attribute as the work.

    On a simulated device a ``module:attribute`` must be a simulated kernel (a
    :class:`~measure.sim.SimKernel` or a sequence of them): a Python function cannot advance
    the simulator's clock, so it is refused with a :class:`DeviceError` before it is called.
    Errors: :class:`DeviceError` (one line) for what cannot be loaded; :class:`UserCodeError`
    when the user's code raises while imported or set up.
    """
    if ":" not in spec:
        return _preset(spec, device)
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise DeviceError(f"work {spec!r}: expected module:attribute (e.g. mytrain:make_step)")
    obj = getattr(_import(mod_name, spec, search_dir), attr, _MISSING)
    if obj is _MISSING:
        raise DeviceError(f"cannot load work {spec!r}: module {mod_name!r} has no attribute {attr!r}")
    if _is_sim_kernel(obj):
        return ResolvedWork(spec, obj, str(getattr(obj, "name", None) or attr))
    if device is not None and device.simulated:
        raise DeviceError(f"{spec} is your own code, which the simulator cannot run (only its "
                          f"kernels advance its clock): it runs on a GPU (--device nvml:INDEX); "
                          f"{WITHOUT_A_GPU}")
    if not callable(obj):
        raise DeviceError(f"work {spec!r} is not callable (a {type(obj).__name__})")
    if factory is False:
        return ResolvedWork(spec, obj, _name(obj, attr))
    try:
        made = obj()
    except Exception as exc:
        raise UserCodeError(spec, "set-up (its first call)") from exc
    if _is_work(made):
        return ResolvedWork(spec, made, _name(made, attr), from_factory=True)
    if factory is True:
        raise DeviceError(f"factory {spec} returned {type(made).__name__}, not a callable work "
                          "(or a mapping of implementation labels to callables)")
    return ResolvedWork(spec, obj, _name(obj, attr))


_MISSING = object()


def _import(mod_name: str, spec: str, search_dir: str | os.PathLike | None) -> Any:
    where = os.path.abspath(os.fspath(search_dir) if search_dir is not None else os.getcwd())
    if where not in sys.path:
        sys.path.insert(0, where)
        importlib.invalidate_caches()     # a module written after the last import scan
    try:
        return importlib.import_module(mod_name)
    except ImportError as exc:
        raise DeviceError(f"cannot load work {spec!r}: {exc} (looked in {where} and sys.path)") from None
    except Exception as exc:
        raise UserCodeError(spec, f"the import of {mod_name}") from exc


def _is_sim_kernel(obj: Any) -> bool:
    from .sim import SimKernel

    return isinstance(obj, SimKernel) or (
        isinstance(obj, Sequence) and not isinstance(obj, str) and bool(obj)
        and all(isinstance(k, SimKernel) for k in obj))


def _is_work(made: Any) -> bool:
    """Whether a factory's return value is work: a callable, or a non-empty mapping of
    implementation labels to callables."""
    if isinstance(made, Mapping):
        return bool(made) and all(isinstance(k, str) and callable(v) for k, v in made.items())
    return callable(made)


def _name(work: Any, attr: str) -> str:
    n = getattr(work, "name", None) if not isinstance(work, Mapping) else None
    return n if isinstance(n, str) and n else attr


def _preset(spec: str, device: Device | None) -> ResolvedWork:
    from .sim import PRESETS, traced_kernel

    kernel = PRESETS.get(spec) or traced_kernel(spec)
    if kernel is not None:
        if device is not None and not device.simulated:
            raise DeviceError(f"{spec!r} is a simulated kernel; on a real GPU give module:function")
        return ResolvedWork(spec, kernel, str(getattr(kernel, "name", spec)))
    raise DeviceError(f"unknown work {spec!r}: give a simulated preset ({', '.join(sorted(PRESETS))}, "
                      "or a traced kernel traced_compute_<T>us / traced_memory_<T>us) "
                      "or module:function")
