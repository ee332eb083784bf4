"""Grade one torch_npu release against our torch_npu pins and our call sites; generate those pins from the scan.

`check_torch_npu(wheel, pins, calls)` reports (a) what changed in each pinned op's schema between the pinned release
and `wheel`, and (b) what in each call site `wheel`'s schemas reject, plus (c) calls whose op no pin names. A call is
held to every overload of its op, as torch_npu dispatches to the one its arguments fit; it passes if one accepts it.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ascend_contracts.pins import OUR_PACKAGES, package_dir
from ascend_contracts.torch_npu_calls import (
    CallProblem,
    NpuCall,
    check_call,
    facade_ops,
    module_loaders,
    scan_calls,
)
from ascend_contracts.torch_npu_pins import (
    TORCH_NPU_PINS_FILE,
    OpPin,
    OpPins,
    ResolvedCall,
    build_op_pins,
    load_op_pins,
)
from ascend_contracts.torch_npu_report import TorchNpuFinding, TorchNpuReport
from ascend_contracts.torch_npu_schema import parse_schema, schema_drift
from ascend_contracts.torch_npu_wheel import TorchNpuWheel

# Development-only packages: their calls (if any) never run in a user's engine.
DEV_PACKAGES = frozenset({"ascend_testkit"})


@dataclass(frozen=True)
class Sources:
    """The runtime packages' modules: `{import name: folder}`; files are named relative to the folder's parent."""

    folders: dict[str, Path]

    @classmethod
    def of_workspace(cls, root: Path) -> Sources:
        inits = [*sorted(root.glob("packages/*/src/*/__init__.py")), *sorted(root.glob("src/*/__init__.py"))]
        return cls({i.parent.name: i.parent for i in inits if i.parent.name not in DEV_PACKAGES})

    @classmethod
    def installed(cls, packages: Iterable[str] = OUR_PACKAGES) -> Sources:
        folders = {name: package_dir(name) for name in packages if name not in DEV_PACKAGES}
        return cls({name: folder for name, folder in folders.items() if folder is not None})

    def calls(self) -> list[tuple[str, NpuCall, tuple[str, ...]]]:
        """(package, call, the facade ops its function serves) for every torch_npu call in these packages."""
        from ascend_kernels.op_registry import npu_callers

        declared = npu_callers()  # "module:function" -> the facade ops whose NpuBinding.impl it is
        modules = []
        for folder in self.folders.values():
            for path in sorted(folder.rglob("*.py")):
                if "__pycache__" not in path.parts:
                    parts = path.relative_to(folder.parent).with_suffix("").parts
                    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                    modules.append((folder, path, module, path.read_text(encoding="utf-8")))
        # Loaders one module defines and others import (`from ascend_kernels.npu_backend import _npu`).
        loaders = frozenset(f"{module}.{name}" for _, path, module, text in modules
                            for name in module_loaders(text, str(path)))
        out = []
        for package, folder in self.folders.items():
            for owner, path, module, text in modules:
                if owner != folder:
                    continue
                calls = scan_calls(text, str(path.relative_to(folder.parent)), loaders)
                served = facade_ops(text) if calls else {}
                for call in calls:
                    callers = (declared.get(f"{module}:{call.function}") or served.get(call.function)
                               or ([f"{call.function}()"] if call.function else ["<module>"]))
                    out.append((package, call, tuple(callers)))
        return out

    def pins(self) -> dict[str, OpPins]:
        return {package: load_op_pins(folder / TORCH_NPU_PINS_FILE, package)
                for package, folder in self.folders.items() if (folder / TORCH_NPU_PINS_FILE).is_file()}


def overloads(schemas: dict[str, str], name: str) -> list[str]:
    """The wheel's keys for `name`: the default overload first, then the named ones."""
    return sorted((k for k in schemas if k == name or k.startswith(name + ".")), key=lambda k: (k != name, k))


def resolve_call(call: NpuCall, wheel: TorchNpuWheel, preferred: str | None = None
                 ) -> tuple[str | None, str | None, list[CallProblem]]:
    """(the overload key accepting the call or None, the key its problems are about, those problems)."""
    keys = overloads(wheel.schemas, call.op)
    if preferred in keys:
        keys.remove(preferred)
        keys.insert(0, preferred)
    results = [(key, check_call(call, parse_schema(wheel.schemas[key]))) for key in keys]
    for key, problems in results:
        if not problems:
            return key, key, []
    if not results:
        return None, None, []
    key, problems = results[0] if preferred in keys else min(results, key=lambda r: len(r[1]))
    return None, key, problems


def exposure_problem(via: str, op: str, wheel: TorchNpuWheel) -> str | None:
    """Why `via.<op>` is not where this wheel puts the op (torch_npu.<op>, torch_npu.atb.<op>, torch.ops.<ns>)."""
    namespace = wheel.namespaces.get(op)
    if via.startswith("torch.ops."):
        wanted = via.rsplit(".", 1)[1]
        return None if namespace == wanted else f"registered in torch.ops.{namespace}, not {via}"
    exposed = wheel.atb_exposure.get(op, "torch_npu" if namespace == "npu" else None)
    if exposed is None:
        return f"the atb op {op} is registered but torch_npu exposes it on neither torch_npu nor torch_npu.atb"
    return None if exposed == via else f"torch_npu {wheel.version} exposes it as {exposed}.{op}, not {via}.{op}"


def _finding(severity: str, symbol: str, detail: str, check: str, package: str, where: str = "") -> TorchNpuFinding:
    return TorchNpuFinding(severity=severity, symbol=symbol, detail=detail, check=check, package=package,
                           where=where)


def _pin_findings(pin: OpPin, wheel: TorchNpuWheel) -> list[TorchNpuFinding]:
    text = wheel.schemas.get(pin.op)
    symbol = f"{pin.via}.{pin.op}"
    if text is None:
        others = overloads(wheel.schemas, pin.name)
        if others:
            return [_finding("P1", symbol, f"overload gone in torch_npu {wheel.version}; it has "
                                           f"{', '.join(others)}", "pins", pin.package)]
        close = difflib.get_close_matches(pin.name, list(wheel.schemas), n=3, cutoff=0.8)
        hint = f"; similar: {', '.join(close)}" if close else ""
        return [_finding("P0", symbol, f"op gone in torch_npu {wheel.version} (pinned: {pin.schema.text}){hint}",
                         "pins", pin.package)]
    out = [_finding(c.severity, f"{pin.via}.{c.op}" + (f"({c.param})" if c.param else ""), c.detail, "pins",
                    pin.package) for c in schema_drift(pin.op, pin.schema, parse_schema(text), pin.uses)]
    if wheel.namespaces.get(pin.op) != pin.namespace:
        out.append(_finding("P2", symbol, f"registered by {wheel.namespaces.get(pin.op)!r} (pinned "
                                          f"{pin.namespace!r})", "pins", pin.package))
    moved = exposure_problem(pin.via, pin.name, wheel)
    if moved:
        out.append(_finding("P1", symbol, moved, "pins", pin.package))
    return out


def _call_findings(package: str, call: NpuCall, wheel: TorchNpuWheel, preferred: str | None
                   ) -> tuple[str | None, list[TorchNpuFinding]]:
    accepted, tried, problems = resolve_call(call, wheel, preferred)
    if tried is None:
        close = difflib.get_close_matches(call.op, [k.split(".")[0] for k in wheel.schemas], n=3, cutoff=0.8)
        hint = f"; similar: {', '.join(sorted(set(close)))}" if close else ""
        return None, [_finding("P0", call.target, f"torch_npu {wheel.version} declares no op {call.op}{hint}",
                               "call", package, call.where)]
    out = []
    moved = exposure_problem(call.via, call.op, wheel)
    if moved:
        out.append(_finding("P0", call.target, moved, "call", package, call.where))
    suffix = "" if tried == call.op else f" (against {tried}; no overload of {call.op} accepts the call)"
    if len(overloads(wheel.schemas, call.op)) == 1:
        suffix = ""
    for p in problems:
        symbol = call.target + (f"({p.param})" if p.param else "")
        out.append(_finding(p.severity, symbol, p.detail + suffix, "call", package, call.where))
    return accepted, out


def check_torch_npu(wheel: TorchNpuWheel, pins: dict[str, OpPins],
                    calls: list[tuple[str, NpuCall, tuple[str, ...]]]) -> TorchNpuReport:
    start = time.perf_counter()
    findings: list[TorchNpuFinding] = []
    for package_pins in pins.values():
        for pin in package_pins.ops:
            findings += _pin_findings(pin, wheel)
    uncovered: list[dict] = []
    resolved: list[ResolvedCall] = []
    for package, call, callers in calls:
        pinned = pins.get(package)
        names = {p.name: p.op for p in pinned.ops} if pinned else {}
        accepted, found = _call_findings(package, call, wheel, names.get(call.op))
        findings += found
        resolved.append(ResolvedCall(call=call, package=package, op=accepted, callers=callers,
                                     namespace=wheel.namespaces.get(accepted) if accepted else None))
        if call.op not in names:
            uncovered.append({"op": call.op, "via": call.via, "package": package, "where": call.where})
            findings.append(_finding("P1", call.target, f"called but not in {package}'s {TORCH_NPU_PINS_FILE} (run "
                                                         "`ascend-vllm contracts pin-torch-npu --write`)",
                                     "coverage", package, call.where))
    findings += _stale_pins(pins, resolved, wheel)
    return TorchNpuReport(target=str(wheel.path), version=wheel.version,
                          pinned_from=sorted({p.torch_npu for p in pins.values()}),
                          pins_checked=sum(len(p.ops) for p in pins.values()), calls_checked=len(calls),
                          findings=findings, uncovered=uncovered, seconds=time.perf_counter() - start)


def _stale_pins(pins: dict[str, OpPins], resolved: list[ResolvedCall], wheel: TorchNpuWheel) -> list[TorchNpuFinding]:
    """Pins no call needs any more; and, against the pinned release itself, entries regenerating would change."""
    out = []
    called = {(r.package, r.call.op) for r in resolved}
    for package, package_pins in pins.items():
        for pin in package_pins.ops:
            if (package, pin.name) not in called:
                out.append(_finding("P2", f"{pin.via}.{pin.op}", "pinned but no call site calls it (regenerate "
                                                                 "the pins)", "coverage", package))
        if package_pins.torch_npu != wheel.version:
            continue
        fresh = {row["op"]: row for row in build_op_pins(resolved, wheel.schemas).get(package, [])}
        for pin in package_pins.ops:
            row = fresh.get(pin.op)
            if row is None:
                continue
            pinned = {"uses": list(pin.uses), "called_by": list(pin.called_by), "schema": pin.schema.text,
                      "via": pin.via}
            changed = [f"{key} {pinned[key]!r} -> {row[key]!r}" for key in pinned if pinned[key] != row[key]]
            if changed:
                out.append(_finding("P2", f"{pin.via}.{pin.op}", f"pins differ from what regenerating them from "
                                    f"torch_npu {wheel.version} gives ({'; '.join(changed)})", "coverage", package))
    return out


def generate_pins(wheel: TorchNpuWheel, sources: Sources) -> dict[str, list[dict]]:
    """`{package: rows}` for the pins files: every call resolved against `wheel` (pinned overloads preferred)."""
    current = sources.pins()
    resolved = []
    for package, call, callers in sources.calls():
        names = {p.name: p.op for p in current[package].ops} if package in current else {}
        accepted, _, _ = resolve_call(call, wheel, names.get(call.op))
        if accepted is None and overloads(wheel.schemas, call.op):
            accepted = overloads(wheel.schemas, call.op)[0]  # pinned as is; the check then names what is wrong
        resolved.append(ResolvedCall(call=call, package=package, op=accepted, callers=callers,
                                     namespace=wheel.namespaces.get(accepted) if accepted else None))
    return build_op_pins(resolved, wheel.schemas)

