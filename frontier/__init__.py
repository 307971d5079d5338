"""frontier: the energy algebra — operating points, signatures, ⊗ ⊕ ⊕multi with propagated
uncertainty, deviation tests, Pareto frontiers and their composition. Pure (numpy/scipy/matplotlib).
"""

from .codec import signature_from_dict, signature_to_dict
from .compose import clark_max, idle, par, par_multi, repeat, seq
from .dag import DagSchedule, TransitionUse, dag, dag_schedule
from .deviation import DeviationResult, LocalizationResult, critical_value, deviation, prefix_scan
from .errors import CompositionError, EnergyCalculusError, FormatError, InvalidSignatureError
from .files import read_json, write_json_atomic
from .interaction import InteractionTable, compose_pair, par_with, record_of
from .io import load_signatures, save_signatures
from .operating_point import OperatingPoint
from .pareto import (
    Frontier,
    PruningWarning,
    achievable_set,
    compose_par,
    compose_par_multi,
    compose_seq,
    pareto_frontier,
    point_label,
    thin,
)
from .signature import Signature, Term
from .transition import TransitionTable
from .workbook import CompositionEntry, Workbook, load_workbook, parse_workbook

__all__ = [
    "OperatingPoint", "Signature", "Term", "seq", "repeat", "par", "par_multi", "idle", "clark_max",
    "EnergyCalculusError", "InvalidSignatureError", "CompositionError", "FormatError",
]

# Frontiers, their composition and transition elements (plots: ``import frontier.plot``,
# kept out of the package import so matplotlib loads only when plotting).
__all__ += [
    "Frontier", "PruningWarning", "pareto_frontier", "achievable_set", "thin", "compose_seq",
    "compose_par", "compose_par_multi", "point_label", "signature_to_dict", "signature_from_dict",
    "TransitionTable",
]

# Deviation checks (Eq. 23), DAG accounting and file formats (one signature codec:
# ``frontier.codec``; H200 data parsing: ``frontier.h200``, located by ``measure.replay``).
__all__ += [
    "deviation", "critical_value", "prefix_scan", "DeviationResult", "LocalizationResult",
    "dag", "dag_schedule", "DagSchedule", "TransitionUse",
    "Workbook", "CompositionEntry", "load_workbook", "parse_workbook", "load_signatures",
    "save_signatures", "read_json", "write_json_atomic",
]

# Co-running pairs measured jointly (Reduction Theorem): use them where measured, par() elsewhere.
__all__ += ["InteractionTable", "compose_pair", "par_with", "record_of"]
