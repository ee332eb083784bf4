"""Compare contract pins with one vLLM release (installed, source tree or wheel) and grade the drift."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ascend_contracts.pins import SIGNATURE_KEY, Pin, adapter_exists
from ascend_contracts.report import Finding, Report
from ascend_contracts.shapes import Missing, Shape, UpstreamView, normalize_literal

_CLASS_KINDS = ("class", "dataclass")
_CALLABLE_KINDS = ("function", "method")


# Why a feature is refused on the vLLM a view stands for (an adapter path in, its reason or None out); only a view
# of the running vLLM can answer (a source tree or wheel is not what the refusal functions probe).
Refusal = Callable[[str], "str | None"]


class Grader:
    """Builds one pin's findings; resolves `covered_by` and `refused_by`, and refuses adapter names that do not
    exist. A `refused_by` finding is covered only where `refusal` says that feature is refused at start-up."""

    def __init__(self, pin: Pin, known_adapters: dict[str, bool], refusal: Refusal | None = None):
        self.pin = pin
        self.known = known_adapters
        self.refusal = refusal
        self.findings: list[Finding] = []

    def _exists(self, adapter: str) -> bool:
        if adapter not in self.known:
            self.known[adapter] = adapter_exists(adapter)
        return self.known[adapter]

    def add(self, severity: str, symbol: str, detail: str, cover_key: str) -> None:
        adapter = self.pin.cover(cover_key)
        refused = None
        if adapter is not None and not self._exists(adapter):
            detail += f" [covered_by names {adapter!r}, which ascend_core.upstream does not define]"
            adapter = None
        gate = self.pin.refused_by
        if adapter is None and gate is not None:
            if not self._exists(gate):
                detail += f" [refused_by names {gate!r}, which ascend_core.upstream does not define]"
            elif self.refusal is None:
                detail += f" [refused_by {gate}: not evaluated, only the running vLLM can say]"
            else:
                refused = self.refusal(gate)
                if refused:
                    adapter = gate
                    detail += f"; the feature is refused at start-up here: {refused}"
                else:
                    detail += f" [{gate} does not refuse the feature on this vLLM]"
        self.findings.append(Finding(severity=severity, symbol=symbol, detail=detail, covered_by=adapter,
                                     package=self.pin.package, use=self.pin.use, refused=refused or None))


def _renamed_to(pin: Pin, name: str, present: Iterable[str]) -> str:
    present = set(present)
    alternatives = [a for a in pin.aliases.get(name, ()) if a in present]
    return f"; this vLLM has {', '.join(repr(a) for a in alternatives)} instead" if alternatives else ""


def signature_change(expected: tuple[str, ...], actual: tuple[str, ...]) -> str:
    def split(entry: str) -> tuple[str, str | None]:
        name, _, default = entry.partition("=")
        return name, (default if "=" in entry else None)

    exp = dict(split(e) for e in expected)
    act = dict(split(a) for a in actual)
    parts = []
    removed = [n for n in exp if n not in act]
    added = [n for n in act if n not in exp]
    if removed:
        parts.append("removed " + ", ".join(removed))
    if added:
        parts.append("added " + ", ".join(a + ("" if act[a] is not None else " (required)") for a in added))
    changed = [f"{n}: {exp[n] or 'required'} -> {act[n] or 'required'}" for n in exp if n in act and exp[n] != act[n]]
    if changed:
        parts.append("default " + "; ".join(changed))
    if not parts:
        parts.append("order changed")
    return "signature changed: " + "; ".join(parts)


def check_pin(pin: Pin, view: UpstreamView, known_adapters: dict[str, bool] | None = None) -> list[Finding]:
    grade = Grader(pin, {} if known_adapters is None else known_adapters, getattr(view, "feature_refusal", None))
    shape = view.resolve(pin.symbol)
    if isinstance(shape, Missing):
        moved = view.find_elsewhere(pin.symbol, pin.moved)
        detail = ("absent (optional: " if pin.optional else f"gone ({pin.use} target): ") + shape.reason
        detail += ")" if pin.optional else ""
        detail += f"; now at {moved}" if moved else ""
        grade.add("P2" if pin.optional else "P0", pin.symbol, detail, pin.symbol)
        return grade.findings
    if shape.dynamic:  # exists, but only an import could tell its members; installed mode checks them
        return grade.findings
    _check_kind(grade, pin, shape)
    for name in pin.fields:
        if name not in shape.members and not (shape.params and any(p.name == name for p in shape.params)):
            if name in pin.optional_names:
                grade.add("P2", f"{pin.symbol}.{name}", f"{name!r} absent (optional)", name)
                continue
            detail = f"{name!r} gone" + _renamed_to(pin, name, shape.members)
            grade.add("P1", f"{pin.symbol}.{name}", detail, name)
    if pin.params:
        present = [p.name for p in shape.params or ()]
        for name in pin.params:
            if name in present:
                continue
            if name in pin.optional_names:
                grade.add("P2", f"{pin.symbol}({name})", f"parameter {name!r} absent (optional)", name)
                continue
            grade.add("P1", f"{pin.symbol}({name})", f"parameter {name!r} gone" + _renamed_to(pin, name, present),
                      name)
    if pin.signature is not None and shape.signature is not None:
        expected = tuple(_normalize_entry(e) for e in pin.signature)
        if expected != shape.signature:
            grade.add("P2", pin.symbol, signature_change(expected, shape.signature), SIGNATURE_KEY)
    if pin.value is not None and shape.value != normalize_literal(pin.value):
        grade.add("P1", pin.symbol, f"value changed: {pin.value} -> {shape.value or 'not a literal'}", pin.symbol)
    return grade.findings


def _normalize_entry(entry: str) -> str:
    name, sep, default = entry.partition("=")
    return f"{name}={normalize_literal(default)}" if sep else name


def _check_kind(grade: Grader, pin: Pin, shape: Shape) -> None:
    if pin.kind in _CLASS_KINDS and shape.kind != "class":
        severity = "P0" if pin.use == "subclass" else "P1"
        grade.add(severity, pin.symbol, f"pinned as a {pin.kind}, now a {shape.kind} ({shape.where})", pin.symbol)
    elif pin.kind in _CALLABLE_KINDS and shape.kind not in ("function", "class"):
        grade.add("P1", pin.symbol, f"pinned as a {pin.kind}, now a {shape.kind} ({shape.where})", pin.symbol)
    elif pin.kind == "module" and shape.kind != "module":
        grade.add("P1", pin.symbol, f"pinned as a module, now a {shape.kind}", pin.symbol)


def check(pins: Iterable[Pin], view: UpstreamView) -> Report:
    """Every pin against `view`; the report says which findings an adapter covers."""
    start = time.perf_counter()
    pins = list(pins)
    known: dict[str, bool] = {}
    findings = [f for pin in pins for f in check_pin(pin, view, known)]
    return Report(target=view.label, version=view.version, pins_checked=len(pins), findings=findings,
                  seconds=time.perf_counter() - start)
