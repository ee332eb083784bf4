"""Adapters for the data-parallel argument of `BaseSpeculator.propose()`.

Legacy lane: `num_tokens_across_dp`; 0.29-0.31: `dp_sync`; 0.32+: `dp_sync_state`. Our speculators accept any of
them and forward the one the installed vLLM takes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

DP_ARG_NAMES = ("dp_sync_state", "dp_sync", "num_tokens_across_dp")


def speculator_dp_arg(propose: Callable[..., Any] | None = None) -> str | None:
    """The DP argument name `propose` takes (default: the installed `BaseSpeculator.propose`)."""
    if propose is None:
        from ascend_core.upstream.lane import capabilities

        return capabilities().speculator_dp_arg
    params = inspect.signature(propose).parameters
    return next((n for n in DP_ARG_NAMES if n in params), None)


def pop_speculator_dp(kwargs: dict[str, Any]) -> Any:
    """Remove whichever lane's DP argument `kwargs` carries and return its value (None when absent).

    Two different DP arguments at once is a caller bug, reported rather than guessed at.
    """
    given = [n for n in DP_ARG_NAMES if n in kwargs]
    if len(given) > 1:
        raise TypeError(f"propose() got several data-parallel arguments: {given}; pass one")
    return kwargs.pop(given[0]) if given else None


def speculator_dp_kwargs(value: Any, propose: Callable[..., Any] | None = None) -> dict[str, Any]:
    """`{name: value}` for the DP argument the target `propose` takes; empty when it takes none."""
    name = speculator_dp_arg(propose)
    return {name: value} if name else {}
