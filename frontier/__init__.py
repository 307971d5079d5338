"""frontier: the energy algebra — operating points, signatures, ⊗ ⊕ ⊕multi with propagated
uncertainty, deviation tests, Pareto frontiers and their composition. Pure (numpy/scipy/matplotlib).
"""

from .compose import clark_max, idle, par, par_multi, seq
from .errors import CompositionError, EnergyCalculusError, FormatError, InvalidSignatureError
from .operating_point import OperatingPoint
from .signature import Signature, Term

__all__ = [
    "OperatingPoint", "Signature", "Term", "seq", "par", "par_multi", "idle", "clark_max",
    "EnergyCalculusError", "InvalidSignatureError", "CompositionError", "FormatError",
]
