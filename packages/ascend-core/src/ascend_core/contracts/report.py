"""Findings of a contract check, their severities, and the two ways to print them (a table, JSON).

P0: a patched/subclassed/imported/called symbol is gone.  P1: a relied-on field, parameter or constant is gone,
renamed or changed.  P2: a signature or default changed, or an optional symbol is absent. A finding is covered when
an adapter in `ascend_core.upstream` absorbs the difference; only uncovered P0/P1 findings block.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

SEVERITIES = ("P0", "P1", "P2")
BLOCKING = frozenset({"P0", "P1"})


@dataclass(frozen=True, kw_only=True)
class Finding:
    severity: str
    symbol: str
    detail: str
    covered_by: str | None
    package: str = ""
    use: str = ""

    @property
    def blocking(self) -> bool:
        return self.covered_by is None and self.severity in BLOCKING


@dataclass(kw_only=True)
class Report:
    target: str
    version: str | None
    pins_checked: int
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def uncovered(self) -> int:
        return sum(1 for f in self.findings if f.covered_by is None)

    @property
    def blocking(self) -> int:
        return sum(1 for f in self.findings if f.blocking)

    @property
    def exit_code(self) -> int:
        return 1 if self.blocking else 0

    def sorted_findings(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: (SEVERITIES.index(f.severity), f.symbol))

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "vllm_version": self.version,
            "pins_checked": self.pins_checked,
            "findings": [asdict(f) for f in self.sorted_findings()],
            "uncovered": self.uncovered,
            "blocking": self.blocking,
            "seconds": round(self.seconds, 3),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(report: Report, symbol_width: int = 72, detail_width: int = 78) -> str:
    """A fixed-width table, most severe first, then a one-line verdict."""
    head = f"vLLM contract check: {report.target} (vLLM {report.version or 'unknown'}), {report.pins_checked} pins"
    lines = [head]
    if report.findings:
        lines.append(f"{'SEV':<4} {'SYMBOL':<{symbol_width}} {'DETAIL':<{detail_width}} COVERED BY")
        for f in report.sorted_findings():
            cover = f.covered_by or "-- UNCOVERED --"
            lines.append(f"{f.severity:<4} {_cell(f.symbol, symbol_width):<{symbol_width}} "
                         f"{_cell(f.detail, detail_width):<{detail_width}} {cover}")
    counts = ", ".join(f"{s}: {sum(1 for f in report.findings if f.severity == s)}" for s in SEVERITIES)
    verdict = "FAIL" if report.blocking else "ok"
    lines.append(f"{verdict}: {len(report.findings)} findings ({counts}); {report.uncovered} uncovered, "
                 f"{report.blocking} blocking (uncovered P0/P1); {report.seconds:.2f} s")
    return "\n".join(lines)
