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


# What Ascend's DFlash2 draft builds on: upstream's model factories (decoder layer, model) and its MRV2 speculator.
DFLASH2_MODULES = ("vllm.model_executor.models.qwen3_dflash2", "vllm.v1.worker.gpu.spec_decode.dflash2.speculator")


def dflash2_unavailable_reason() -> str | None:
    """Why DFlash2 drafts cannot run on the installed vLLM (the legacy lane has no DFlash2 factories), or None."""
    from ascend_core.upstream.probes import module_exists
    from ascend_core.upstream.version import installed_vllm_version

    missing = [m for m in DFLASH2_MODULES if not module_exists(m)]
    if not missing:
        return None
    return f"vLLM {installed_vllm_version()} has no DFlash2 factories ({', '.join(missing)} absent)"
