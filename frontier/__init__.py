"""frontier: the energy algebra — operating points, signatures, ⊗ ⊕ ⊕multi with propagated
uncertainty, deviation tests, Pareto frontiers and their composition. Pure (numpy/scipy/matplotlib).
"""

from .compose import clark_max, idle, par, par_multi, seq
from .dag import DagSchedule, TransitionUse, dag, dag_schedule
from .deviation import DeviationResult, LocalizationResult, critical_value, deviation, prefix_scan
from .errors import CompositionError, EnergyCalculusError, FormatError, InvalidSignatureError
from .io import (
    CompositionEntry,
    Workbook,
    load_signatures,
    load_workbook,
    parse_workbook,
    read_json,
    save_signatures,
    write_json_atomic,
)
from .operating_point import OperatingPoint
from .signature import Signature, Term

__all__ = [
    "OperatingPoint", "Signature", "Term", "seq", "par", "par_multi", "idle", "clark_max",
    "EnergyCalculusError", "InvalidSignatureError", "CompositionError", "FormatError",
]

# Deviation checks (Eq. 23), DAG accounting and file formats (H200 data: ``frontier.h200``).
__all__ += [
    "deviation", "critical_value", "prefix_scan", "DeviationResult", "LocalizationResult",
    "dag", "dag_schedule", "DagSchedule", "TransitionUse",
    "Workbook", "CompositionEntry", "load_workbook", "parse_workbook", "load_signatures",
    "save_signatures", "read_json", "write_json_atomic",
]
