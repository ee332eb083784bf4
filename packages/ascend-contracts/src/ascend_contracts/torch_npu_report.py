"""Findings of a torch_npu contract check and the two ways to print them (a table, JSON), shaped like the vLLM check's.

Nothing in `ascend_core.upstream` absorbs a torch_npu difference, so every P0/P1 finding blocks.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ascend_contracts.report import SEVERITIES, Finding


@dataclass(frozen=True, kw_only=True)
class TorchNpuFinding(Finding):
    covered_by: str | None = None
    use: str = "call"
    check: str  # "pins": the pins against this release; "call": a call site against it; "coverage": pins vs calls
    where: str = ""  # file:line in function() of the call site, for "call" and "coverage" findings


@dataclass(kw_only=True)
class TorchNpuReport:
    target: str
    version: str
    pinned_from: list[str]  # the releases the pins files were generated from
    pins_checked: int
    calls_checked: int
    findings: list[TorchNpuFinding] = field(default_factory=list)
    uncovered: list[dict] = field(default_factory=list)  # {"op", "via", "package", "where"} of unpinned calls
    seconds: float = 0.0

    @property
    def blocking(self) -> int:
        return sum(1 for f in self.findings if f.blocking)

    @property
    def exit_code(self) -> int:
        return 1 if self.blocking else 0

    def sorted_findings(self) -> list[TorchNpuFinding]:
        return sorted(self.findings, key=lambda f: (SEVERITIES.index(f.severity), f.check, f.symbol, f.where))

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "torch_npu_version": self.version,
            "pinned_from": self.pinned_from,
            "pins_checked": self.pins_checked,
            "calls_checked": self.calls_checked,
            "findings": [asdict(f) for f in self.sorted_findings()],
            "uncovered": self.uncovered,
            "blocking": self.blocking,
            "seconds": round(self.seconds, 3),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def render_torch_npu_table(report: TorchNpuReport, max_symbol_width: int = 70) -> str:
    pinned = ", ".join(report.pinned_from) or "no pins"
    lines = [f"torch_npu contract check: {report.target} (torch_npu {report.version}; pins from {pinned}), "
             f"{report.pins_checked} pinned ops, {report.calls_checked} call sites"]
    rows = report.sorted_findings()
    if rows:
        sym_w = min(max_symbol_width, max(len("SYMBOL"), *(len(f.symbol) for f in rows)))
        chk_w = max(len("CHECK"), *(len(f.check) for f in rows))
        lines.append(f"{'SEV':<4} {'CHECK':<{chk_w}}  {'SYMBOL':<{sym_w}}  DETAIL")
        for f in rows:
            where = f" [{f.where}]" if f.where else ""
            lines.append(f"{f.severity:<4} {f.check:<{chk_w}}  {f.symbol:<{sym_w}}  {f.detail}{where}")
    counts = ", ".join(f"{s}: {sum(1 for f in report.findings if f.severity == s)}" for s in SEVERITIES)
    lines.append(f"{'FAIL' if report.blocking else 'ok'}: {len(report.findings)} findings ({counts}); "
                 f"{len(report.uncovered)} unpinned call sites, {report.blocking} blocking (P0/P1); "
                 f"{report.seconds:.2f} s")
    return "\n".join(lines)
