"""Interaction tables: co-running pairs characterized jointly, the rest composed at the null
context (spec §6.3 Reduction Theorem, §6.6 mixed treatment, §10.4 co-run characterization).

A pair that shares a device's resources (HBM bandwidth, SMs, the power cap) is not
interference-insensitive (Eq. 12), so ``par`` of its alone-characterized signatures is biased.
The remedy is to measure the pair *together* at each (ω_dev, SM split) a plan can choose and use
that co-run signature in place of the composition; every other pair keeps the null-context
prediction, with its Eq. 13 bias bound. Only the composed pairs contribute bias terms (§6.6).

* :class:`PairKey` — a pair's identity: the two element names with the SMs each gets
  (order-insensitive) and the ω_dev they share.
* :class:`InteractionTable` — an immutable mapping ``PairKey → InteractionEntry`` (the
  measured joint signature and its :class:`Provenance`). Its file format is in
  :mod:`frontier.interaction_io`; :mod:`measure.joint` fills it from a device.
* :func:`compose_pair` — the table's joint signature where it has one, else ``par`` at the
  null context; returns the signature and a :class:`PairRecord` saying which, and why.
* :func:`par_with` — a drop-in for ``frontier.compose.par`` bound to a table.
* :func:`record_of` — which pairs of a set of composites were measured jointly and which
  were composed (read back from the composites' ``meta``).

**Why ``par_with`` (a partial) and not a stateful ``Composer``.** A call site changes one name
(``par`` → ``jpar = par_with(table)``) and keeps its arguments, so ``frontier.compose`` and
every caller stay as they are. It keeps no state: the record of what was done travels inside
each composite's ``meta["interaction"]``, where :func:`record_of` reads it, so nothing has to be
threaded through (or reset between) call sites. ``dag`` needs no wrapper: its tasks are
already-composed signatures (a task's co-runners are composed by ``par``/``par_with`` first),
it serializes the tasks of one device, and overlap across devices is ⊕multi, whose shared
resources a same-device pair table does not describe. The solvers' Problem builder takes the
composites through ``Option.from_signature`` unchanged.

Error identity: a joint signature renamed by ``compose_pair`` keeps its per-leaf ``terms``
(like ``frontier.io``'s ``on``), so using one joint measurement in several compositions still
counts its estimation error as shared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from .compose import MaxMethod, par
from .errors import CompositionError, InputError
from .operating_point import OperatingPoint
from .signature import Signature

#: ``meta["source"]`` of a joint signature as :func:`compose_pair` returns it.
MEASURED_JOINTLY = "measured jointly"
#: Default c_α of the reported Eq. 13 bias bound (two-sided 95 %).
C_ALPHA = 1.96


class InteractionTableError(InputError):
    """An interaction table is inconsistent (two entries for one pair, a composed signature
    given as a measurement, a signature at another ω_dev than its key)."""


def _sm_label(sm: int | None) -> str:
    return "all" if sm is None else str(sm)


@dataclass(frozen=True)
class Member:
    """One side of a pair: an element and the SMs it gets (``None``: the device default)."""

    element: str
    sm_count: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.element, str) or not self.element:
            raise InteractionTableError(f"a pair member needs a non-empty element name, got {self.element!r}")
        sm = self.sm_count
        if sm is not None and (isinstance(sm, bool) or not isinstance(sm, int) or sm < 1):
            raise InteractionTableError(f"element {self.element!r}: sm_count must be a positive "
                                        f"integer or None, got {sm!r}")

    def sort_key(self) -> tuple[str, int]:
        """Canonical order of the two members (name, then SMs; None first)."""
        return (self.element, -1 if self.sm_count is None else self.sm_count)

    def label(self) -> str:
        """``element@nSM``."""
        return f"{self.element}@{_sm_label(self.sm_count)}SM"


@dataclass(frozen=True)
class PairKey:
    """Identity of a co-running pair: two members (stored in canonical order, so a ∥ b and
    b ∥ a are one key) and the ω_dev they share (``sm_count`` dropped).

    >>> k = PairKey.of("send", 16, "gemm", 116, OperatingPoint(sm_clock_mhz=1980))
    >>> k == PairKey.of("gemm", 116, "send", 16, OperatingPoint(sm_clock_mhz=1980, sm_count=132))
    True
    >>> k.label()
    'gemm@116SM || send@16SM @ 1980MHz'
    """

    first: Member
    second: Member
    omega_dev: OperatingPoint = OperatingPoint()

    def __post_init__(self) -> None:
        a, b = sorted((self.first, self.second), key=Member.sort_key)
        object.__setattr__(self, "first", a)
        object.__setattr__(self, "second", b)
        if not isinstance(self.omega_dev, OperatingPoint):
            raise InteractionTableError(f"omega_dev must be an OperatingPoint, got {self.omega_dev!r}")
        object.__setattr__(self, "omega_dev", self.omega_dev.dev)

    @classmethod
    def of(cls, a: str, sm_a: int | None, b: str, sm_b: int | None,
           omega_dev: OperatingPoint = OperatingPoint()) -> PairKey:
        """The key of a (``sm_a`` SMs) ∥ b (``sm_b`` SMs) at ``omega_dev``."""
        return cls(Member(a, sm_a), Member(b, sm_b), omega_dev)

    @classmethod
    def for_signatures(cls, a: Signature, b: Signature) -> PairKey:
        """The key of two signatures about to be overlapped (names, ``omega.sm_count``, the
        ω_dev they must share)."""
        if a.omega.dev != b.omega.dev:
            raise CompositionError(
                f"par: ω_dev differs ({a.name!r}: {a.omega.dev.label()}, {b.name!r}: "
                f"{b.omega.dev.label()}); elements overlapped on one device share its clocks and cap")
        return cls.of(a.name, a.omega.sm_count, b.name, b.omega.sm_count, a.omega.dev)

    @property
    def members(self) -> tuple[Member, Member]:
        """Both members, in canonical order."""
        return (self.first, self.second)

    @property
    def sm_total(self) -> int | None:
        """SMs the pair occupies together (None when either side takes the default)."""
        if self.first.sm_count is None or self.second.sm_count is None:
            return None
        return self.first.sm_count + self.second.sm_count

    def label(self) -> str:
        """``a@nSM || b@mSM @ ω_dev``."""
        return f"{self.first.label()} || {self.second.label()} @ {self.omega_dev.label()}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``pair`` (two ``{element, sm_count}``) and ``omega_dev`` (set knobs)."""
        return {"pair": [{"element": m.element, "sm_count": m.sm_count} for m in self.members],
                "omega_dev": {k: v for k, v in self.omega_dev.to_dict().items() if v is not None}}


@dataclass(frozen=True)
class Provenance:
    """Where a joint signature comes from: the device (name, whether simulated, its seed and
    UUID where it has them), the measurement protocol's settings, and when the entry was
    recorded (UTC, ISO 8601; a point resumed from a results file is recorded when the table is
    built)."""

    device: str
    simulated: bool
    protocol: Mapping[str, Any] = field(default_factory=dict)
    recorded_utc: str = ""
    seed: int | None = None
    uuid: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "protocol", MappingProxyType(dict(self.protocol)))

    __hash__ = None  # type: ignore[assignment]  # holds a mapping

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (every field)."""
        return {"device": self.device, "simulated": self.simulated, "seed": self.seed,
                "uuid": self.uuid, "protocol": dict(self.protocol),
                "recorded_utc": self.recorded_utc}


@dataclass(frozen=True)
class InteractionEntry:
    """One jointly measured pair: its key, the co-run signature of a ∥ b (a measured leaf at
    the key's ω_dev) and its provenance."""

    key: PairKey
    signature: Signature
    provenance: Provenance

    def __post_init__(self) -> None:
        sig = self.signature
        if not isinstance(sig, Signature):
            raise InteractionTableError(f"{self.key.label()}: the joint signature must be a "
                                        f"Signature, got {type(sig).__name__}")
        if sig.composed:
            raise InteractionTableError(f"{self.key.label()}: {sig.name!r} is a composed signature; "
                                        "an interaction table holds co-run measurements only")
        if sig.omega.dev != self.key.omega_dev:
            raise InteractionTableError(f"{self.key.label()}: the joint signature {sig.name!r} was "
                                        f"measured at {sig.omega.dev.label()}, not at the key's ω_dev")

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class InteractionTable:
    """Immutable mapping from :class:`PairKey` to :class:`InteractionEntry` (one per key).

    >>> t = InteractionTable()
    >>> len(t), t.lookup(PairKey.of("a", 8, "b", 8)) is None
    (0, True)
    """

    entries: tuple[InteractionEntry, ...] = ()
    description: str | None = None
    _index: Mapping[PairKey, InteractionEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        entries = tuple(self.entries)
        index: dict[PairKey, InteractionEntry] = {}
        for e in entries:
            if not isinstance(e, InteractionEntry):
                raise InteractionTableError(f"table entries must be InteractionEntry, got {type(e).__name__}")
            if e.key in index:
                raise InteractionTableError(f"two entries for {e.key.label()}")
            index[e.key] = e
        object.__setattr__(self, "entries", entries)
        object.__setattr__(self, "_index", MappingProxyType(index))

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[InteractionEntry]:
        return iter(self.entries)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def keys(self) -> tuple[PairKey, ...]:
        """Every pair key, in entry order."""
        return tuple(e.key for e in self.entries)

    def lookup(self, key: PairKey) -> InteractionEntry | None:
        """The entry measured for ``key``, or None (pure lookup, no fallback)."""
        return self._index.get(key)

    def lookup_signatures(self, a: Signature, b: Signature) -> InteractionEntry | None:
        """The entry for ``a ∥ b`` as these signatures would be overlapped, or None."""
        return self.lookup(PairKey.for_signatures(a, b))

    def with_entries(self, entries: Iterable[InteractionEntry], replace: bool = False) -> InteractionTable:
        """A new table with ``entries`` added; an entry for a key already present is an error
        unless ``replace`` (then the new one wins, in the old one's place)."""
        new = list(entries)
        by_key = {e.key: e for e in new}
        if len(by_key) != len(new):
            raise InteractionTableError("the added entries hold two entries for one pair")
        clash = [e.key for e in self.entries if e.key in by_key]
        if clash and not replace:
            raise InteractionTableError(f"the table already has {clash[0].label()} "
                                        "(pass replace=True to take the new measurement)")
        kept = [by_key.pop(e.key) if e.key in by_key else e for e in self.entries]
        return InteractionTable(tuple(kept) + tuple(e for e in new if e.key in by_key),
                                self.description)

    def merged(self, other: InteractionTable, replace: bool = False) -> InteractionTable:
        """This table with ``other``'s entries added (see :meth:`with_entries`)."""
        return self.with_entries(other.entries, replace)


# -- composing with the table ------------------------------------------------------------

Source = Literal["measured", "composed"]


@dataclass(frozen=True)
class PairRecord:
    """What :func:`compose_pair` (or :func:`par_with`) did for one composite.

    ``source`` is ``"measured"`` (the table's joint signature was used) or ``"composed"``
    (``par`` at the null context). ``time_s``/``energy_j``/σ are those of the signature
    returned; ``null_*`` are ``par``'s prediction either way (so the co-run effect is
    ``energy_j − null_energy_j``). ``bias_bound_j`` is the Eq. 13 bound of what is used (0 for a
    joint measurement, c_α Σ m_i σ_E_i for the composition); ``null_bias_bound_j`` that of
    ``par``. ``key`` is None when the composite is not a pair (one or three+ elements).
    """

    name: str
    parts: tuple[str, ...]
    key: PairKey | None
    source: Source
    reason: str
    time_s: float
    energy_j: float
    sd_time_s: float
    sd_energy_j: float
    null_time_s: float
    null_energy_j: float
    bias_bound_j: float
    null_bias_bound_j: float
    c_alpha: float = C_ALPHA
    provenance: Provenance | None = None

    __hash__ = None  # type: ignore[assignment]

    @property
    def measured(self) -> bool:
        """Whether the table's joint signature was used."""
        return self.source == "measured"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (what goes into a composite's ``meta["interaction"]``)."""
        d: dict[str, Any] = {
            "name": self.name, "parts": list(self.parts), "source": self.source,
            "reason": self.reason, "time_s": self.time_s, "energy_j": self.energy_j,
            "sd_time_s": self.sd_time_s, "sd_energy_j": self.sd_energy_j,
            "null_time_s": self.null_time_s, "null_energy_j": self.null_energy_j,
            "bias_bound_j": self.bias_bound_j, "null_bias_bound_j": self.null_bias_bound_j,
            "c_alpha": self.c_alpha,
            "key": self.key.to_dict() if self.key is not None else None,
            "provenance": self.provenance.to_dict() if self.provenance is not None else None,
        }
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PairRecord:
        """Inverse of :meth:`to_dict` (for records read back from a composite's meta)."""
        key = None
        if d.get("key") is not None:
            (m1, m2), om = d["key"]["pair"], d["key"].get("omega_dev", {})
            key = PairKey.of(m1["element"], m1["sm_count"], m2["element"], m2["sm_count"],
                             OperatingPoint.from_dict(om))
        prov = Provenance(**d["provenance"]) if d.get("provenance") is not None else None
        return cls(name=d["name"], parts=tuple(d["parts"]), key=key, source=d["source"],
                   reason=d["reason"], time_s=d["time_s"], energy_j=d["energy_j"],
                   sd_time_s=d["sd_time_s"], sd_energy_j=d["sd_energy_j"],
                   null_time_s=d["null_time_s"], null_energy_j=d["null_energy_j"],
                   bias_bound_j=d["bias_bound_j"], null_bias_bound_j=d["null_bias_bound_j"],
                   c_alpha=d.get("c_alpha", C_ALPHA), provenance=prov)

    def line(self) -> str:
        """One human line: which pair, measured or composed, T and E against the null context."""
        what = self.key.label() if self.key is not None else " || ".join(self.parts)
        how = (MEASURED_JOINTLY if self.measured
               else f"composed at the null context (Eq. 13 bias <= {self.bias_bound_j:.3g} J)")
        return (f"{what}: {how}; T = {self.time_s * 1e3:.4g} ms (null {self.null_time_s * 1e3:.4g}), "
                f"E = {self.energy_j:.4g} J (null {self.null_energy_j:.4g})")


def _with_meta(sig: Signature, name: str | None, extra: Mapping[str, Any],
               devices: frozenset[str] | None = None) -> Signature:
    # dataclasses.replace keeps ``terms`` (the identity of the measurement's error) and the
    # Eq. 13 bookkeeping; only the name, meta and device labels change.
    changes: dict[str, Any] = {"meta": {**dict(sig.meta), **extra}}
    if name:
        changes["name"] = name
    if devices is not None:
        changes["devices"] = devices
    return dataclasses.replace(sig, **changes)


def _record(name: str, parts: Sequence[str], key: PairKey | None, source: Source, reason: str,
            used: Signature, null: Signature, c_alpha: float, prov: Provenance | None) -> PairRecord:
    return PairRecord(name=name, parts=tuple(parts), key=key, source=source, reason=reason,
                      time_s=used.time_s, energy_j=used.energy_j, sd_time_s=used.sd_time_s,
                      sd_energy_j=used.sd_energy_j, null_time_s=null.time_s,
                      null_energy_j=null.energy_j, bias_bound_j=used.bias_bound_j(c_alpha),
                      null_bias_bound_j=null.bias_bound_j(c_alpha), c_alpha=c_alpha,
                      provenance=prov)


def compose_pair(a: Signature, b: Signature, table: InteractionTable, *,
                 sm_total: int | None = None, name: str | None = None,
                 max_method: MaxMethod = "dominant", c_alpha: float = C_ALPHA
                 ) -> tuple[Signature, PairRecord]:
    """``a ∥ b`` on one device: the table's joint signature where it has one, else ``par(a, b)``
    at the null context with its Eq. 13 bias bound.

    ``par`` is always evaluated: it validates the pair (same device and ω_dev, SMs fit
    ``sm_total``) and gives the null-context prediction the record compares against. The
    signature returned carries the record in ``meta["interaction"]``; a joint one is named
    ``name`` (when given), runs on ``a``'s devices, has ``meta["source"] == "measured jointly"``
    and no bias (it is a measurement); a composed one is ``par``'s result, its bias bookkeeping
    intact.

    >>> s = 100.0
    >>> a = Signature("gemm", s_w=s, time_s=1.0, d_j=300.0, var_energy_j2=1.0,
    ...               omega=OperatingPoint(sm_clock_mhz=1980, sm_count=116))
    >>> b = Signature("send", s_w=s, time_s=0.1, d_j=5.0, var_energy_j2=0.01,
    ...               omega=OperatingPoint(sm_clock_mhz=1980, sm_count=16))
    >>> sig, rec = compose_pair(a, b, InteractionTable(), sm_total=132)
    >>> rec.source, round(sig.energy_j, 1), round(rec.bias_bound_j, 3)
    ('composed', 405.0, 2.156)
    """
    null = par(a, b, sm_total=sm_total, max_method=max_method, name=name)
    nm = null.name
    key = PairKey.for_signatures(a, b)
    entry = table.lookup(key)
    if entry is None:
        rec = _record(nm, (a.name, b.name), key, "composed", "no joint measurement in the table",
                      null, null, c_alpha, None)
        return _with_meta(null, None, {"interaction": rec.to_dict()}), rec
    joint = entry.signature
    rec = _record(nm, (a.name, b.name), key, "measured", MEASURED_JOINTLY, joint, null, c_alpha,
                  entry.provenance)
    extra = {"source": MEASURED_JOINTLY, "parts": [a.name, b.name], "interaction": rec.to_dict()}
    if sm_total is not None:
        extra["sm_total"] = int(sm_total)
    # The joint signature runs where the pair runs (the table's device label is the bench's).
    return _with_meta(joint, nm, extra, devices=a.devices), rec


def _flatten(elems: Sequence[Any]) -> list[Signature]:
    out: list[Signature] = []
    for e in elems:
        if isinstance(e, Signature):
            out.append(e)
        elif isinstance(e, Iterable) and not isinstance(e, (str, bytes, Mapping)):
            out.extend(_flatten(list(e)))
        else:
            raise CompositionError(f"can only compose Signature objects, got {type(e).__name__}")
    return out


def par_with(table: InteractionTable, *, c_alpha: float = C_ALPHA):
    """``par`` bound to an interaction table: same arguments, same result type.

    Two elements started together (no non-zero ``offsets_s``) go through :func:`compose_pair`;
    anything else (one element, three or more, staggered starts: a pair table does not describe
    them) is plain ``par`` with a ``"composed"`` record in ``meta["interaction"]`` saying why.

    >>> jpar = par_with(InteractionTable())
    >>> a = Signature("a", s_w=50, time_s=1.0, d_j=10)
    >>> b = Signature("b", s_w=50, time_s=2.0, d_j=20)
    >>> c = jpar(a, b); (c.energy_j, c.meta["interaction"]["source"])
    (130.0, 'composed')
    """
    if not isinstance(table, InteractionTable):
        raise TypeError(f"par_with needs an InteractionTable, got {type(table).__name__}")

    def jpar(*elems: Signature | Iterable[Signature], offsets_s: Sequence[float] | None = None,
             sm_total: int | None = None, max_method: MaxMethod = "dominant",
             name: str | None = None) -> Signature:
        es = _flatten(list(elems))
        staggered = offsets_s is not None and any(float(x) != 0.0 for x in offsets_s)
        if len(es) == 2 and not staggered:
            return compose_pair(es[0], es[1], table, sm_total=sm_total, name=name,
                                max_method=max_method, c_alpha=c_alpha)[0]
        sig = par(es, offsets_s=offsets_s, sm_total=sm_total, max_method=max_method, name=name)
        if len(es) < 2:
            return sig
        why = ("staggered starts: the table's pairs start together" if staggered
               else f"{len(es)} co-runners: the table holds pairs")
        rec = _record(sig.name, [e.name for e in es], None, "composed", why, sig, sig, c_alpha, None)
        return _with_meta(sig, None, {"interaction": rec.to_dict()})

    jpar.__doc__ = f"frontier.compose.par using an interaction table of {len(table)} pair(s)."
    return jpar


# -- what was measured and what composed --------------------------------------------------

@dataclass(frozen=True)
class CompositionRecord:
    """Which co-running pairs of a set of composites were measured jointly and which were
    composed at the null context (one record per distinct composite)."""

    measured: tuple[PairRecord, ...] = ()
    composed: tuple[PairRecord, ...] = ()

    __hash__ = None  # type: ignore[assignment]

    @property
    def bias_bound_j(self) -> float:
        """Largest Eq. 13 bound among the composed ones (0 when all were measured)."""
        return max((r.bias_bound_j for r in self.composed), default=0.0)

    def summary(self) -> str:
        """Counts, then one line per record (measured first)."""
        head = f"{len(self.measured)} pair(s) measured jointly, {len(self.composed)} composed at the null context"
        return "\n".join([head] + [f"  {r.line()}" for r in (*self.measured, *self.composed)])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``measured`` and ``composed`` lists of records."""
        return {"measured": [r.to_dict() for r in self.measured],
                "composed": [r.to_dict() for r in self.composed]}


def _walk(items: Any) -> Iterator[Signature]:
    if isinstance(items, Signature):
        yield items
    elif isinstance(items, Mapping):
        for v in items.values():
            yield from _walk(v)
    elif isinstance(items, Iterable) and not isinstance(items, (str, bytes)):
        for v in items:
            yield from _walk(v)


def record_of(composites: Any) -> CompositionRecord:
    """The record of every composite made by :func:`compose_pair` / :func:`par_with` in
    ``composites`` (a signature, an iterable of them, or a mapping of such, e.g. task →
    options), deduplicated by name and pair; signatures without a record are ignored."""
    seen: dict[tuple, PairRecord] = {}
    for sig in _walk(composites):
        raw = sig.meta.get("interaction")
        if not isinstance(raw, Mapping):
            continue
        rec = PairRecord.from_dict(raw)
        seen.setdefault((rec.name, rec.key, rec.parts, rec.source), rec)
    recs = list(seen.values())
    return CompositionRecord(tuple(r for r in recs if r.measured),
                             tuple(r for r in recs if not r.measured))
