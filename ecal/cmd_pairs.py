"""``ecal check --pairs WORKLOAD``: which pairs of a workload may use the Reduction Theorem.

For every candidate pair (e₁, e₂) it measures, on one simulated H200 per workload device, the
mutual context-insensitivity tests of :mod:`measure.pairs` (entry: e₂ right after e₁ against
e₂ alone in the null context; runtime: e₁ ∥ e₂ against the ⊕ / ⊕multi prediction) and
decides with :mod:`frontier.insensitivity` (Eq. 23 band + the Eq. 13 allowance). A pair that
passes composes at the null context; one that fails must be characterized jointly.

Exit status: 0 when every pair may use the reduction, 1 when some must be characterized
jointly (as ``ecal check``'s 1 = flagged), 2 on bad input.

**Pairs measured on a GPU.** FILE may instead hold measured co-runs: an interaction table
(``ecal.interactions/1``, what :func:`measure.joint.characterize_pairs` returns, saved with
:func:`frontier.interaction_io.save_interaction_table`), or a signature file
(``ecal.signatures/1``) whose co-run signatures carry ``meta.joint.members`` (as joint
characterization writes them). Each co-run is held against the ⊕ prediction of its members
measured alone at the same ω_dev and SM counts — signatures found in FILE itself and in every
``--signatures ALONE.json`` (``ecal characterize ... -o``; the element is a key's part before
its first ``@``). Only the runtime test applies (a joint characterization measures co-runs);
nothing is measured, so ``--device`` and ``--seed`` do not apply::

    ecal check --pairs pairs_h200.interactions.json --signatures alone_h200.json

**Workload file** (JSON)::

    {"schema_version": 1,
     "description": "optional text",
     "elements": {                         # name -> element: n invocations of a kernel
        "gemm16": {"kernel": "gemm_bf16_8192",   # a simulator preset (ecal characterize --list)
                   "n": 10,                      # invocations that make up the element (default 1)
                   "sm_count": 16,               # SMs it runs on (null/absent: the whole device)
                   "device": "gpu0"},            # workload device (default "gpu0")
        ...},
     "pairs": [["gemm16", "flash16"],            # optional; e₁ first (the entry test runs
               {"first": "heater", "second": "send8",     # e₂ right after e₁)
                "tests": ["entry"]}],            # optional: "entry" and/or "runtime" (default
                                                 # both; a cross-device pair has runtime only)
     "protocol": {"window_s": 0.2, "min_windows": 3,     # optional measure.Protocol fields
                  "max_windows": 8, "warmup_s": 0.05, "target_rse": 0.002}}

Without ``pairs``, every pair of elements on the same device is tested, in file order.
Elements on different devices form a cross-device pair (runtime test only, ⊕multi).
Explicit SM counts of a same-device pair must fit the device together as granted (Hopper
grants SMs in steps of 8: 66 SMs are 72); an element without ``sm_count`` takes the whole
device, and a co-run with it time-slices the SMs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, fields
from itertools import combinations
from typing import Any

from frontier.errors import FormatError

#: Fields a workload's ``protocol`` may set (the rest keep measure.pairs.PAIR_PROTOCOL's).
PROTOCOL_FIELDS = ("window_s", "min_windows", "max_windows", "warmup_s", "target_rse", "cooldown_s")
_TOP_FIELDS = {"schema_version", "description", "elements", "pairs", "protocol", "units"}
_ELEMENT_FIELDS = {"kernel", "n", "sm_count", "device", "description"}
#: Largest invocation count an element may ask for (a million kernels is hours of GPU time).
MAX_INVOCATIONS = 10**6


@dataclass(frozen=True)
class PairWorkload:
    """A parsed workload: elements (``measure.pairs.PairElement``), the ordered pairs to test,
    the protocol, and the description."""

    elements: dict[str, Any]
    pairs: tuple[tuple[str, str], ...]
    protocol: Any
    description: str = ""
    tests: tuple[tuple[str, ...], ...] = ()

    def tests_of(self, i: int) -> tuple[str, ...]:
        """The tests pair ``i`` asks for."""
        if i < len(self.tests):
            return self.tests[i]
        a, b = self.pairs[i]
        return ("runtime",) if self.elements[a].device != self.elements[b].device else ("entry", "runtime")


def add_pairs_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--pairs``, ``--device`` and ``--seed`` to the ``check`` parser (its ``file``
    positional is then the pair workload; ``--alpha`` and ``--json`` are shared)."""
    parser.add_argument("--pairs", action="store_true",
                        help="FILE is a pair workload: test which pairs may use the reduction "
                             "(compose at the null context) and which must be characterized jointly")
    parser.add_argument("--device", default="sim",
                        help="with --pairs: sim (one simulated H200 per workload device, default)")
    parser.add_argument("--seed", type=int, default=0, help="with --pairs: simulator seed")
    parser.add_argument("--signatures", action="append", default=None, metavar="ALONE.json",
                        help="with --pairs on measured co-runs (an interaction table or a signature "
                             "file): the elements measured alone (ecal characterize -o); repeat for "
                             "several files (default: only the signatures in FILE)")


def _int(file: str, path: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise FormatError(file, path, f"must be an integer in {lo}..{hi}, got {v!r}")
    return v


def _element(file: str, name: str, d: Any, sm_total: int) -> Any:
    from measure.pairs import PairElement
    from measure.sim import PRESETS

    path = f"elements.{name}"
    if not isinstance(d, dict):
        raise FormatError(file, path, f"must be an object, got {type(d).__name__}")
    extra = sorted(set(d) - _ELEMENT_FIELDS)
    if extra:
        raise FormatError(file, f"{path}.{extra[0]}", f"unknown field (known: {', '.join(sorted(_ELEMENT_FIELDS))})")
    kernel = d.get("kernel")
    if not isinstance(kernel, str):
        raise FormatError(file, f"{path}.kernel", f"missing or not a string (a simulator preset: "
                                                  f"{', '.join(sorted(PRESETS))})")
    if kernel not in PRESETS:
        raise FormatError(file, f"{path}.kernel", f"unknown simulated kernel {kernel!r} "
                                                  f"(known: {', '.join(sorted(PRESETS))})")
    n = _int(file, f"{path}.n", d.get("n", 1), 1, MAX_INVOCATIONS)
    sm = d.get("sm_count")
    if sm is not None:
        sm = _int(file, f"{path}.sm_count", sm, 1, sm_total)
    device = d.get("device", "gpu0")
    if not isinstance(device, str) or not device.strip():
        raise FormatError(file, f"{path}.device", f"must be a non-empty string, got {device!r}")
    return PairElement(name, PRESETS[kernel], n, sm, device)


def _tests(file: str, path: str, v: Any, cross: bool) -> tuple[str, ...]:
    if v is None:
        return ("runtime",) if cross else ("entry", "runtime")
    if (not isinstance(v, list) or not v or len(set(v)) != len(v)
            or not all(x in ("entry", "runtime") for x in v)):
        raise FormatError(file, path, f"must be a non-empty list of 'entry' and/or 'runtime', got {v!r}")
    if cross and "entry" in v:
        raise FormatError(file, path, "a cross-device pair has no entry test (its devices share no "
                                      "entry state): use [\"runtime\"]")
    return tuple(x for x in ("entry", "runtime") if x in v)


def _pair(file: str, i: int, p: Any, names: dict[str, Any]) -> tuple[str, str, Any]:
    path = f"pairs[{i}]"
    tests = None
    if isinstance(p, dict):
        extra = sorted(set(p) - {"first", "second", "tests"})
        if extra:
            raise FormatError(file, f"{path}.{extra[0]}", "unknown field (known: first, second, tests)")
        tests = p.get("tests")
        p = [p.get("first"), p.get("second")]
    if not isinstance(p, list) or len(p) != 2 or not all(isinstance(x, str) for x in p):
        raise FormatError(file, path, f"must be [first, second] (two element names) or "
                                      f"{{\"first\": ..., \"second\": ...}}, got {p!r}")
    for x in p:
        if x not in names:
            raise FormatError(file, path, f"unknown element {x!r} (elements: {', '.join(names)})")
    if p[0] == p[1]:
        raise FormatError(file, path, f"pairs {p[0]!r} with itself")
    cross = names[p[0]].device != names[p[1]].device
    return p[0], p[1], _tests(file, f"{path}.tests", tests, cross)


def _check_split(file: str, i: int, a: Any, b: Any, granted: Any, sm_total: int) -> None:
    if a.device != b.device or a.sm_count is None or b.sm_count is None:
        return
    ga, gb = granted(a.sm_count), granted(b.sm_count)
    if ga + gb > sm_total:
        raise FormatError(file, f"pairs[{i}]", f"SM split {a.name}={a.sm_count} (granted {ga}) + "
                                               f"{b.name}={b.sm_count} (granted {gb}) = {ga + gb} "
                                               f"exceeds the device's {sm_total} SMs")


def parse_workload(doc: Any, file: str = "<workload>") -> PairWorkload:
    """A :class:`PairWorkload` from a parsed JSON document; every problem is a
    :class:`~frontier.errors.FormatError` naming the file and the field."""
    from measure.pairs import PAIR_PROTOCOL
    from measure.protocol import Protocol
    from measure.sim import SimulatedGPU

    ops = SimulatedGPU().operating_set()
    sm_total = ops.sm_count
    if not isinstance(doc, dict):
        raise FormatError(file, "(top level)", f"must be an object, got {type(doc).__name__}")
    extra = sorted(set(doc) - _TOP_FIELDS)
    if extra:
        raise FormatError(file, extra[0], f"unknown field (known: {', '.join(sorted(_TOP_FIELDS))})")
    if doc.get("schema_version") != 1:
        raise FormatError(file, "schema_version", f"must be 1, got {doc.get('schema_version')!r}")
    els = doc.get("elements")
    if not isinstance(els, dict) or not els:
        raise FormatError(file, "elements", "missing or empty (an object: name -> element)")
    elements = {str(k): _element(file, str(k), v, sm_total) for k, v in els.items()}
    if "pairs" in doc:
        raw = doc["pairs"]
        if not isinstance(raw, list) or not raw:
            raise FormatError(file, "pairs", "must be a non-empty list (or absent: every pair on one device)")
        parsed = [_pair(file, i, p, elements) for i, p in enumerate(raw)]
        pairs = [(a, b) for a, b, _ in parsed]
        tests = [t for _, _, t in parsed]
        seen: dict[tuple[str, str], int] = {}
        for i, p in enumerate(pairs):
            if p in seen:
                raise FormatError(file, f"pairs[{i}]", f"repeats pairs[{seen[p]}] ({p[0]}, {p[1]})")
            seen[p] = i
    else:
        pairs = [(a, b) for a, b in combinations(elements, 2)
                 if elements[a].device == elements[b].device]
        tests = [("entry", "runtime")] * len(pairs)
        if not pairs:
            raise FormatError(file, "pairs", "absent, and no two elements share a device: "
                                             "list the pairs to test")
    for i, (a, b) in enumerate(pairs):
        _check_split(file, i, elements[a], elements[b], ops.granted_sm_count, sm_total)
    proto = PAIR_PROTOCOL
    if "protocol" in doc:
        pd = doc["protocol"]
        if not isinstance(pd, dict):
            raise FormatError(file, "protocol", f"must be an object, got {type(pd).__name__}")
        bad = sorted(set(pd) - set(PROTOCOL_FIELDS))
        if bad:
            raise FormatError(file, f"protocol.{bad[0]}", f"unknown field (known: {', '.join(PROTOCOL_FIELDS)})")
        for k, v in pd.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise FormatError(file, f"protocol.{k}", f"must be a number, got {v!r}")
        kw = {f.name: getattr(proto, f.name) for f in fields(Protocol)}
        kw.update(pd)
        try:
            proto = Protocol(**kw)
        except (TypeError, ValueError) as exc:
            raise FormatError(file, "protocol", str(exc)) from None
    desc = doc.get("description", "")
    return PairWorkload(elements, tuple(pairs), proto, desc if isinstance(desc, str) else "",
                        tuple(tests))


def load_workload(path: str) -> PairWorkload:
    """Read and parse a pair workload file (strict JSON: see :func:`frontier.files.read_json`)."""
    from frontier.files import read_json

    return parse_workload(read_json(path), str(path))


def open_devices(spec: str, names: list[str], seed: int) -> dict[str, Any]:
    """One simulated H200 per workload device name (``--device sim``)."""
    from measure.device import DeviceError
    from measure.sim import SimulatedGPU

    kind = spec.strip().lower()
    if kind not in ("sim", "sim:h200"):
        raise DeviceError(f"--device {spec!r}: ecal check --pairs runs the simulator's presets "
                          "(--device sim); on a GPU, measure pairs of your own work with "
                          "measure.joint.characterize_pairs over an NVMLDevice (its run_parallel; "
                          "experiments/corun_splits_real.py is an example), then check them here: "
                          "ecal check --pairs TABLE.json --signatures ALONE.json")
    return {n: SimulatedGPU(seed=seed) for n in names}


def run_pairs(workload: PairWorkload, seed: int = 0, alpha: float = 0.05, device: str = "sim") -> list:
    """Measure and decide every pair of ``workload``; a list of
    :class:`~frontier.insensitivity.PairVerdict` in workload order."""
    from measure.pairs import measure_pair

    names = sorted({e.device for e in workload.elements.values()})
    devs = open_devices(device, names, seed)
    out = []
    for i, (a, b) in enumerate(workload.pairs):
        out.append(measure_pair(devs, workload.elements[a], workload.elements[b],
                                protocol=workload.protocol, alpha=alpha, key=f"pair/{a}/{b}",
                                tests=workload.tests_of(i)))
    return out


@dataclass(frozen=True)
class MeasuredPairs:
    """Co-runs measured elsewhere (:class:`~frontier.interaction.InteractionEntry` each) and the
    alone signatures to hold them against (file key → signature)."""

    coruns: tuple[Any, ...]
    alone: dict[str, Any]
    files: tuple[str, ...]


def measured_kind(doc: Any) -> str | None:
    """``"interactions"`` or ``"signatures"`` when ``doc`` is such a file, else None (a pair
    workload, or something its parser refuses)."""
    from frontier.formats import KINDS
    from frontier.interaction_io import LEGACY_FORMAT

    if not isinstance(doc, dict):
        return None
    fmt = doc.get("format")
    if fmt in (KINDS["interactions"].tag, LEGACY_FORMAT):
        return "interactions"
    if fmt == KINDS["signatures"].tag:
        return "signatures"
    return None


def _joint_entry(file: str, key: str, sig: Any, simulated: bool) -> Any:
    """An interaction entry from a co-run signature that carries ``meta.joint.members``."""
    from frontier.interaction import InteractionEntry, PairKey, Provenance

    members = (sig.meta.get("joint") or {}).get("members")
    path = f"signatures.{key}.meta.joint.members"
    if (not isinstance(members, list) or len(members) != 2
            or not all(isinstance(m, dict) and isinstance(m.get("element"), str) for m in members)):
        raise FormatError(file, path, "must be two {element, sm_count} objects")
    try:
        pk = PairKey.of(members[0]["element"], members[0].get("sm_count"),
                        members[1]["element"], members[1].get("sm_count"), sig.omega.dev)
        dev = sig.meta.get("device")
        return InteractionEntry(pk, sig.with_(omega=sig.omega.dev),
                                Provenance(str(dev) if dev is not None else "?",
                                           bool(sig.meta.get("simulated", simulated))))
    except (ValueError, TypeError) as exc:
        raise FormatError(file, path, str(exc)) from None


def load_measured(file: str, doc: Any, signature_files: list[str] | None) -> MeasuredPairs:
    """Co-runs from ``file`` (an interaction table, or a signature file's co-run signatures)
    and alone signatures from ``file`` and ``signature_files``."""
    from frontier.interaction_io import table_from_dict
    from frontier.io import load_signatures, parse_signatures, signature_file_body

    alone: dict[str, Any] = {}
    coruns: list[Any] = []
    if measured_kind(doc) == "interactions":
        coruns = list(table_from_dict(doc, file))
    else:
        body = signature_file_body(file, doc)
        simulated = bool((body.get("meta") or {}).get("simulated", False))
        for key, sig in parse_signatures(file, body).items():
            if "joint" in sig.meta:
                coruns.append(_joint_entry(file, key, sig, simulated))
            else:
                alone[key] = sig
    for f in signature_files or []:
        for key, sig in load_signatures(f).items():
            if "joint" not in sig.meta:
                alone.setdefault(key, sig)
    if not coruns:
        raise FormatError(file, "signatures", "no co-run signature (one whose meta.joint names its "
                                              "two members): nothing to check")
    return MeasuredPairs(tuple(coruns), alone, (file, *(signature_files or [])))


def report_dict(verdicts: list, args: argparse.Namespace,
                measured: MeasuredPairs | None = None) -> dict[str, Any]:
    """The ``--json`` document (``measured``: the co-runs were read from files, not run)."""
    if measured is not None:
        return {"workload": str(args.file), "measured": True, "files": list(measured.files),
                "alpha": args.alpha, "simulated": all(v.simulated for v in verdicts),
                "pairs": [v.to_dict() for v in verdicts],
                "may_use_reduction": [v.label for v in verdicts if v.may_use_reduction],
                "characterize_jointly": [v.label for v in verdicts if not v.may_use_reduction]}
    return {"workload": str(args.file), "device": args.device, "seed": args.seed,
            "alpha": args.alpha, "simulated": all(v.simulated for v in verdicts),
            "pairs": [v.to_dict() for v in verdicts],
            "may_use_reduction": [v.label for v in verdicts if v.may_use_reduction],
            "characterize_jointly": [v.label for v in verdicts if not v.may_use_reduction]}


def cmd_check_pairs(args: argparse.Namespace) -> int:
    """``ecal check --pairs WORKLOAD``: exit 0 when every pair may use the reduction, 1 when
    some must be characterized jointly (bad input raises: the CLI's exit 2)."""
    from frontier.deviation import critical_value

    from .common import UsageError
    from .output import dump_json

    critical_value(args.alpha)          # a bad --alpha is an error before any work
    if getattr(args, "bias_aware", False):
        raise UsageError("--bias-aware does not apply to --pairs: the pair tests always grant "
                         "the Eq. 13 allowance (see frontier/insensitivity.py)")
    from frontier.files import read_json
    from measure.pairs import measured_pair_verdicts

    doc = read_json(args.file)
    measured = None
    description = ""
    if measured_kind(doc) is not None:
        measured = load_measured(str(args.file), doc, getattr(args, "signatures", None))
        verdicts = measured_pair_verdicts(measured.coruns, measured.alone, alpha=args.alpha)
        where = f"measured co-runs, alone signatures from {', '.join(measured.files)}"
    else:
        if getattr(args, "signatures", None):
            raise UsageError("--signatures goes with measured co-runs (an interaction table or a "
                             "signature file), not with a pair workload, whose elements are measured here")
        wl = parse_workload(doc, str(args.file))
        description = wl.description
        verdicts = run_pairs(wl, seed=args.seed, alpha=args.alpha, device=args.device)
        where = f"seed {args.seed}"
    joint = [v for v in verdicts if not v.may_use_reduction]
    if args.json:
        dump_json(report_dict(verdicts, args, measured))
    else:
        sim = " — SIMULATED H200 (physics model, not real hardware)" if all(
            v.simulated for v in verdicts) else ""
        print(f"{args.file}: {len(verdicts)} pair(s), {where}, "
              f"alpha={args.alpha:g}{sim}")
        if description:
            print(description)
        for v in verdicts:
            print(v.summary())
        ok = [v.label for v in verdicts if v.may_use_reduction]
        print(f"{len(ok)} of {len(verdicts)} pair(s) may use the reduction (compose at the null "
              f"context): {', '.join(ok) or '-'}")
        print(f"{len(joint)} must be characterized jointly: "
              f"{', '.join(v.label for v in joint) or '-'}")
    sys.stdout.flush()
    return 1 if joint else 0
