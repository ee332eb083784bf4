"""Findings of a contract check, their severities, and the two ways to print them (a table, JSON).

P0: a patched/subclassed/imported/called symbol is gone.  P1: a relied-on field, parameter or constant is gone,
renamed or changed.  P2: a signature or default changed, or an optional symbol is absent. A finding is covered when
an adapter in `ascend_core.upstream` absorbs the difference, or when the feature using the symbol is refused at
start-up on this vLLM (`refused` holds that refusal's reason); only uncovered P0/P1 findings block.
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
    refused: str | None = None

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


def render_table(report: Report, max_symbol_width: int = 90) -> str:
    """A fixed-width table, most severe first (detail last, never cut), then a one-line verdict."""
    lines = [f"vLLM contract check: {report.target} (vLLM {report.version or '?'}), {report.pins_checked} pins"]
    rows = report.sorted_findings()
    if rows:
        sym_w = min(max_symbol_width, max(len("SYMBOL"), *(len(f.symbol) for f in rows)))
        cov_w = max(len("COVERED BY"), *(len(f.covered_by or "UNCOVERED") for f in rows))
        pkg_w = max(len("PINNED BY"), *(len(f.package) for f in rows))
        lines.append(f"{'SEV':<4} {'SYMBOL':<{sym_w}}  {'COVERED BY':<{cov_w}}  {'PINNED BY':<{pkg_w}}  DETAIL")
        for f in rows:
            lines.append(f"{f.severity:<4} {f.symbol:<{sym_w}}  {f.covered_by or 'UNCOVERED':<{cov_w}}  "
                         f"{f.package:<{pkg_w}}  {f.detail}")
    counts = ", ".join(f"{s}: {sum(1 for f in report.findings if f.severity == s)}" for s in SEVERITIES)
    verdict = "FAIL" if report.blocking else "ok"
    lines.append(f"{verdict}: {len(report.findings)} findings ({counts}); {report.uncovered} uncovered, "
                 f"{report.blocking} blocking (uncovered P0/P1); {report.seconds:.2f} s")
    return "\n".join(lines)
