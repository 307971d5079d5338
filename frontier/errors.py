"""Typed errors raised by the algebra. Every message names the element or file and the value."""


class EnergyCalculusError(ValueError):
    """Base class for every error this project raises on bad input."""


class InvalidSignatureError(EnergyCalculusError):
    """A signature's values are not physical (NaN, negative time, d < 0 beyond noise...)."""


class CompositionError(EnergyCalculusError):
    """Elements cannot be composed this way (devices overlap, SMs over-subscribed, ω_dev differs)."""


class FormatError(EnergyCalculusError):
    """A file is malformed. The message names the file, the path inside it and the problem."""

    def __init__(self, file: str, path: str, problem: str):
        self.file, self.path, self.problem = str(file), path, problem
        super().__init__(f"{file}: {path}: {problem}")
