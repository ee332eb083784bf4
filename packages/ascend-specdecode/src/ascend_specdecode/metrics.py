"""Per-position acceptance and mean accepted length, read from vLLM's own spec-decode metrics.

vLLM counts drafts, draft tokens, accepted tokens and accepted tokens per draft position (`SpecDecodingStats`,
exported as the ``vllm:spec_decode_*`` Prometheus metrics that `LLM.get_metrics()` returns). Conventions are
vLLM's: the acceptance rate at position i is ``accepted_at_i / num_drafts`` (so it also counts positions a draft
never reached) and the mean accepted length includes the bonus token, ``1 + accepted / num_drafts``.

Acceptance that quietly sinks after an upgrade is the failure users report, so `AcceptanceReport.check_floor`
raises naming every position below its floor, and `AcceptanceFloorLogger` (a vLLM stat logger) warns as it happens.
`AcceptanceFloorPlugin` is that logger as vLLM's stat-logger plugin (entry point group ``vllm.stat_logger_plugins``,
declared in this package's pyproject): every server vLLM builds (`vllm serve`, `ascend-vllm serve`: the AsyncLLM
front end loads the group) gets one per engine, with no code of the user's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from vllm.logger import init_logger

# The floor warning goes through a child of vLLM's root logger: a server configures only the ``vllm`` logger (a
# handler of its own, propagate off), and a warning under this package's own name did not reach its log.
floor_logger = init_logger("vllm").getChild("ascend_specdecode.acceptance_floor")

NUM_DRAFTS = "vllm:spec_decode_num_drafts"
NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
NUM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


class AcceptanceBelowFloor(AssertionError):
    """Some draft position's acceptance fell below the floor it must hold."""


@dataclass(frozen=True, kw_only=True)
class AcceptanceReport:
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: tuple[int, ...]

    @property
    def acceptance_per_position(self) -> tuple[float, ...]:
        if self.num_drafts == 0:
            return tuple(0.0 for _ in self.accepted_per_position)
        return tuple(a / self.num_drafts for a in self.accepted_per_position)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per verification step, bonus token included (vLLM's "mean acceptance length")."""
        return 1.0 + (self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def positions_below(self, floor: float | Sequence[float]) -> list[tuple[int, float, float]]:
        """``(position, rate, floor)`` for each position under its floor (a scalar floor applies to all)."""
        rates = self.acceptance_per_position
        floors = [floor] * len(rates) if isinstance(floor, int | float) else list(floor)
        if len(floors) != len(rates):
            raise ValueError(f"{len(floors)} floors given for {len(rates)} draft positions")
        return [(i, r, f) for i, (r, f) in enumerate(zip(rates, floors, strict=True)) if r < f]

    def check_floor(self, floor: float | Sequence[float], *, label: str = "") -> None:
        """Raise `AcceptanceBelowFloor` if no drafts were made or any position is under its floor."""
        where = f" ({label})" if label else ""
        if self.num_drafts == 0:
            raise AcceptanceBelowFloor(f"no drafts were verified{where}: speculation did not run")
        low = self.positions_below(floor)
        if low:
            detail = ", ".join(f"position {i}: {r:.3f} < {f:.3f}" for i, r, f in low)
            raise AcceptanceBelowFloor(f"draft acceptance below its floor{where}: {detail} ({self.num_drafts} drafts)")

    def _combine(self, other: AcceptanceReport, sign: int) -> AcceptanceReport:
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        mine = list(self.accepted_per_position) + [0] * (n - len(self.accepted_per_position))
        theirs = list(other.accepted_per_position) + [0] * (n - len(other.accepted_per_position))
        return AcceptanceReport(
            num_drafts=self.num_drafts + sign * other.num_drafts,
            num_draft_tokens=self.num_draft_tokens + sign * other.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens + sign * other.num_accepted_tokens,
            accepted_per_position=tuple(a + sign * b for a, b in zip(mine, theirs, strict=True)),
        )

    def minus(self, earlier: AcceptanceReport) -> AcceptanceReport:
        """The counts accumulated since `earlier` (vLLM's metrics are cumulative per engine)."""
        return self._combine(earlier, -1)

    def plus(self, other: AcceptanceReport) -> AcceptanceReport:
        return self._combine(other, 1)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AcceptanceReport:
        """Inverse of `as_dict` (counts only; rates are derived)."""
        return cls(
            num_drafts=d["num_drafts"],
            num_draft_tokens=d["num_draft_tokens"],
            num_accepted_tokens=d["num_accepted_tokens"],
            accepted_per_position=tuple(d["accepted_per_position"]),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_per_position": [round(r, 4) for r in self.acceptance_per_position],
            "mean_accepted_length": round(self.mean_accepted_length, 4),
        }


EMPTY = AcceptanceReport(num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, accepted_per_position=())


def acceptance_from_metrics(metrics: Iterable[Any], num_speculative_tokens: int | None = None) -> AcceptanceReport:
    """Sum vLLM's spec-decode metrics (`LLM.get_metrics()` output) over engines into one report."""
    drafts = draft_tokens = accepted = 0
    per_pos: list[int] = [0] * (num_speculative_tokens or 0)
    for metric in metrics:
        if metric.name == NUM_DRAFTS:
            drafts += int(metric.value)
        elif metric.name == NUM_DRAFT_TOKENS:
            draft_tokens += int(metric.value)
        elif metric.name == NUM_ACCEPTED:
            accepted += int(metric.value)
        elif metric.name == ACCEPTED_PER_POS:
            values = list(metric.values)
            per_pos.extend([0] * (len(values) - len(per_pos)))
            for i, v in enumerate(values):
                per_pos[i] += int(v)
    return AcceptanceReport(
        num_drafts=drafts,
        num_draft_tokens=draft_tokens,
        num_accepted_tokens=accepted,
        accepted_per_position=tuple(per_pos),
    )


def acceptance_from_stats(stats: Any) -> AcceptanceReport:
    """A report from one vLLM `SpecDecodingStats` (what the scheduler hands the stat loggers each step)."""
    return AcceptanceReport(
        num_drafts=stats.num_drafts,
        num_draft_tokens=stats.num_draft_tokens,
        num_accepted_tokens=stats.num_accepted_tokens,
        accepted_per_position=tuple(stats.num_accepted_tokens_per_pos),
    )


def _stat_logger_base() -> type:
    from vllm.v1.metrics.loggers import StatLoggerBase

    return StatLoggerBase


class AcceptanceFloorLogger(_stat_logger_base()):  # type: ignore[misc]
    """A vLLM stat logger that warns, per draft position, when acceptance falls under `floor`.

    Pass it to the engine (`stat_loggers=[AcceptanceFloorLogger.factory(0.3)]`); it accumulates the scheduler's
    spec-decode stats and checks them every `window` drafts, so a silent collapse shows in the log at once.
    """

    def __init__(
        self, vllm_config: Any, engine_index: int = 0, *, floor: float | Sequence[float] = 0.0, window: int = 256
    ):
        self.engine_index = engine_index
        self.floor: float | Sequence[float] = floor
        self.window = window
        self.alerts = 0
        self._reset()

    def _reset(self) -> None:
        self.total = EMPTY

    @classmethod
    def factory(cls, floor: float, window: int = 256):
        def make(vllm_config: Any, engine_index: int = 0) -> AcceptanceFloorLogger:
            return cls(vllm_config, engine_index, floor=floor, window=window)

        return make

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0):
        stats = getattr(scheduler_stats, "spec_decoding_stats", None)
        if stats is None:
            return
        self.total = self.total.plus(acceptance_from_stats(stats))
        if self.total.num_drafts >= self.window:
            self.log()

    def log(self) -> None:
        if self.total.num_drafts == 0:
            return
        low = self.total.positions_below(self.floor)
        if low:
            self.alerts += 1
            floor_logger.warning(
                "Speculative decoding acceptance below its floor on engine %d at positions %s over %d drafts",
                self.engine_index,
                ", ".join(f"{i}={r:.3f} (floor {f:.3f})" for i, r, f in low),
                self.total.num_drafts,
            )
        self._reset()

    def log_engine_initialized(self) -> None:
        pass


FLOOR_ENV = "ASCEND_SPECDECODE_ACCEPTANCE_FLOOR"
WINDOW_ENV = "ASCEND_SPECDECODE_ACCEPTANCE_WINDOW"
# A first draft accepted less than once in 20 steps: every step pays for K drafts and keeps almost none of them.
DEFAULT_FIRST_POSITION_FLOOR = 0.05
DEFAULT_WINDOW = 256


def _env_number(name: str, default: float, kind: type) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return kind(default)
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a {kind.__name__}") from None
    if value < 0 or (kind is float and value > 1) or (kind is int and value == 0):
        raise ValueError(f"{name}={raw!r} is out of range")
    return value


class AcceptanceFloorPlugin(AcceptanceFloorLogger):
    """`AcceptanceFloorLogger` as vLLM builds a stat-logger plugin, `cls(vllm_config, engine_index)`.

    It watches the first draft position, where a collapse shows first and where any working draft is accepted well
    above the floor (later positions of a fair draft can sit near zero): the floor is `FLOOR_ENV` (default
    `DEFAULT_FIRST_POSITION_FLOOR`; 0 turns the warning off), checked every `WINDOW_ENV` drafts (default
    `DEFAULT_WINDOW`) and whenever vLLM logs its periodic stats. An engine without speculation never reports
    spec-decode stats, so the plugin stays silent there.
    """

    def __init__(self, vllm_config: Any, engine_index: int = 0):
        spec = getattr(vllm_config, "speculative_config", None)
        k = int(getattr(spec, "num_speculative_tokens", None) or 1)
        first = _env_number(FLOOR_ENV, DEFAULT_FIRST_POSITION_FLOOR, float)
        super().__init__(
            vllm_config,
            engine_index,
            floor=[first] + [0.0] * (k - 1),
            window=_env_number(WINDOW_ENV, DEFAULT_WINDOW, int),
        )
