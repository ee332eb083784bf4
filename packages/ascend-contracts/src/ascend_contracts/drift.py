"""What changes in the pinned symbols when moving from one vLLM release to another (the main2main question).

`check` grades one release against the pins; `drift(pins, old, new)` grades the *difference* between two releases,
restricted to what the pins name (the symbol, its relied-on fields/params and their aliases, its signature and
value), with the same severities and the same `covered_by` lookup. A name appearing only in the newer release is
reported as P2 so a new entry point (a moved planner, an added hook) is visible too.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from ascend_contracts.checker import Grader, signature_change
from ascend_contracts.pins import SIGNATURE_KEY, Pin
from ascend_contracts.report import Finding, Report
from ascend_contracts.shapes import Missing, Shape, UpstreamView


def _names(shape: Shape) -> set[str]:
    return set(shape.members) | {p.name for p in shape.params or ()}


def _member(symbol: str, name: str, shape: Shape) -> str:
    """`symbol.name` for an attribute, `symbol(name)` for a parameter (as the checker spells them)."""
    is_param = name not in shape.members and any(p.name == name for p in shape.params or ())
    return f"{symbol}({name})" if is_param else f"{symbol}.{name}"


def _canonical(pin: Pin) -> dict[str, str]:
    """Every name the pin relies on, and every alias of one, mapped to the pin's own name for it."""
    out = {name: name for name in (*pin.fields, *pin.params)}
    for name, others in pin.aliases.items():
        out.setdefault(name, name)
        for other in others:
            out[other] = name
    return out


def drift_pin(pin: Pin, old: UpstreamView, new: UpstreamView, known: dict[str, bool]) -> list[Finding]:
    grade = Grader(pin, known)
    before, after = old.resolve(pin.symbol), new.resolve(pin.symbol)
    if isinstance(before, Missing) and isinstance(after, Missing):
        return []
    if isinstance(after, Missing):
        moved = new.find_elsewhere(pin.symbol, pin.moved)
        detail = f"removed ({pin.use} target): {after.reason}" + (f"; now at {moved}" if moved else "")
        grade.add("P2" if pin.optional else "P0", pin.symbol, detail, pin.symbol)
        return grade.findings
    if isinstance(before, Missing):
        grade.add("P2", pin.symbol, f"added in {new.version or new.label} ({after.where})", pin.symbol)
        return grade.findings
    old_names, new_names = _names(before), _names(after)
    canonical = _canonical(pin)
    for name, ours in canonical.items():
        if name in old_names and name not in new_names:
            successors = [n for n, c in canonical.items() if c == ours and n in new_names and n not in old_names]
            detail = f"{name!r} removed" + (f"; replaced by {', '.join(map(repr, successors))}" if successors else "")
            grade.add("P2" if ours in pin.optional_names else "P1", _member(pin.symbol, name, before), detail, ours)
        elif name in new_names and name not in old_names:
            renamed = any(c == ours and n in old_names and n not in new_names for n, c in canonical.items())
            if not renamed:  # a rename was reported with the name it replaced
                grade.add("P2", _member(pin.symbol, name, after), f"{name!r} added", ours)
    # Only a pinned signature is compared: without one, the relied-on names above are the whole contract.
    if pin.signature is not None and before.signature is not None and after.signature is not None \
            and before.signature != after.signature:
        grade.add("P2", pin.symbol, signature_change(before.signature, after.signature), SIGNATURE_KEY)
    if pin.value is not None and before.value != after.value:
        grade.add("P1", pin.symbol, f"value changed: {before.value} -> {after.value}", pin.symbol)
    return grade.findings


def drift(pins: Iterable[Pin], old: UpstreamView, new: UpstreamView) -> Report:
    start = time.perf_counter()
    pins = list(pins)
    known: dict[str, bool] = {}
    findings = [f for pin in pins for f in drift_pin(pin, old, new, known)]
    target = f"{old.label} -> {new.label}"
    version = f"{old.version or '?'} -> {new.version or '?'}"
    return Report(target=target, version=version, pins_checked=len(pins), findings=findings,
                  seconds=time.perf_counter() - start)
