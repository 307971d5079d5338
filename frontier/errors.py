"""Typed errors. Every message names the element or file and the value.

The hierarchy (catch what you mean):

* :class:`EnergyCalculusError` (an ``Exception``) roots every error this project raises.
* :class:`InputError` (also a ``ValueError``, as numpy/scipy raise for bad arguments): the input
  is wrong — a malformed file, a bad option or value, an infeasible deadline, a setting the
  device does not support. ``ecal`` prints it as one line and exits 2.
* Device, store and environment errors (``measure.DeviceError``, ``measure.store.StoreError``,
  ``solvers.SolverUnavailableError``) are *not* ``ValueError``: a training loop's
  ``except ValueError`` must never swallow a lost GPU or a damaged store.
* :class:`UnknownNameError` (an ``InputError`` and a ``KeyError``): a name that is not there.
* :class:`InternalError` (also a ``RuntimeError``): a check of the project's own result failed
  (e.g. a plan's certificate); that is a bug, and ``ecal`` shows its traceback.
"""


class EnergyCalculusError(Exception):
    """Base class of every error this project raises."""


class InputError(EnergyCalculusError, ValueError):
    """Bad input: a malformed file, a bad option or value, a request that cannot be met."""


class UnknownNameError(InputError, KeyError):
    """A name that is not there (an element, a composition, a preset): an :class:`InputError`
    that is also a ``KeyError``, as a mapping's caller expects; its message is shown as is."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InternalError(EnergyCalculusError, RuntimeError):
    """A check of the project's own result failed: a bug, never the user's input."""


class InvalidSignatureError(InputError):
    """A signature's values are not physical (NaN, negative time, d < 0 beyond noise...)."""


class CompositionError(InputError):
    """Elements cannot be composed this way (devices overlap, SMs over-subscribed, ω_dev differs)."""


class FormatError(InputError):
    """A file is malformed. The message names the file, the path inside it and the problem."""

    def __init__(self, file: str, path: str, problem: str):
        self.file, self.path, self.problem = str(file), path, problem
        super().__init__(f"{file}: {path}: {problem}")
