"""What the graph machinery decided, as usage counters an engine test reads back (`ascend_usage()`).

Keys: `graph.capture.<MODE>.<tokens>` per graph captured, `graph.replay.<MODE>.<tokens>` per replay,
`graph.dispatch.<batch kind>.<MODE>` per step dispatched (kind "uniform_decode" or "mixed"), and
`graph.eager_past_largest.<batch kind>` when a step was larger than the largest captured size.
"""

from __future__ import annotations

import functools
from typing import Any

from ascend_platform import usage


@functools.cache
def _key(*parts: object) -> str:
    """A counter's name, built once per distinct value (replays and dispatches happen every step)."""
    return ".".join(str(part) for part in parts)


def captured(mode: Any, num_tokens: int) -> None:
    usage.count(_key("graph.capture", mode.name, num_tokens))


def replayed(mode: Any, num_tokens: int) -> None:
    usage.count(_key("graph.replay", mode.name, num_tokens))


def dispatched(kind: str, mode: Any, past_largest: bool) -> None:
    usage.count(_key("graph.dispatch", kind, mode.name))
    if past_largest:
        usage.count(_key("graph.eager_past_largest", kind))
