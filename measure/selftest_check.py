"""The values a selftest is made of: a :class:`Check` (one assumption against one measured
number, with its verdict) and the :class:`SelftestWorks` it runs. Shared by
:mod:`measure.selftest` (the read-only checks) and :mod:`measure.selftest_write` (``--write``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

#: A check's verdict.
Verdict = Literal["pass", "warn", "fail", "skipped"]


@dataclass(frozen=True)
class Check:
    """One assumption held against one measured number."""

    name: str
    assumption: str
    verdict: Verdict
    value: float | None = None
    unit: str = ""
    detail: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite numbers as null)."""
        v = self.value if self.value is None or math.isfinite(self.value) else None
        return {"name": self.name, "assumption": self.assumption, "verdict": self.verdict,
                "value": v, "unit": self.unit, "detail": self.detail, "data": jsonable(self.data)}


@dataclass(frozen=True)
class SelftestWorks:
    """What the selftest runs: ``a`` (compute-bound: its time should scale with SMs), ``b``
    (another element), and ``seq`` (one invocation = ``a`` then ``b``, the ⊗ composite)."""

    a: Any
    b: Any
    seq: Any
    a_name: str = "a"
    b_name: str = "b"


def jsonable(o: Any) -> Any:
    """``o`` with non-finite floats as None and mappings/sequences made plain dicts/lists."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, Mapping):
        return {str(k): jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [jsonable(v) for v in o]
    return o
