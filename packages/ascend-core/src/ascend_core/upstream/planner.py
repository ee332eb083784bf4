"""Adapter for where the installed vLLM keeps its KV-cache planner functions.

0.33 moved the planner out of `vllm.v1.core.kv_cache_utils` into `vllm.v1.core.kv_cache_planning`; callers ask for a
function by name and get it from whichever module this release has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ascend_core.upstream.probes import default_loader, module_exists

PLANNER_MODULES = ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils")


def planner_function(name: str) -> Callable[..., Any]:
    """The planner function `name` (e.g. `get_kv_cache_groups`) of the installed vLLM, newest module first."""
    for module in PLANNER_MODULES:
        if module_exists(module):
            fn = getattr(default_loader(module, None), name, None)
            if fn is not None:
                return fn
    raise AttributeError(f"no KV planner function {name!r} in any of {list(PLANNER_MODULES)}")
