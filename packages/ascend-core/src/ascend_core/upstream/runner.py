"""Adapters for the model runners' KV binding and for what Model Runner V2 needs from the installed vLLM.

V1: `vllm.v1.worker.utils.bind_kv_cache` took `kv_cache_groups` from 0.29 on (the legacy lane binds by layer index
alone), so one call site passes it only where the installed function takes it.

MRV2: Ascend's MRV2 runner allocates the KV cache through `init_kv_cache(..., kv_cache_allocation_context, *,
block_tables, attn_groups)` and binds it with `bind_kv_cache_to_layers`; releases without those hooks (the legacy
lane's MRV2 allocates inside a different `init_kv_cache(runner_kv_caches, ...)`) cannot run it, and start-up says
so with `mrv2_unavailable_reason()` instead of failing halfway through building the runner.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ascend_core.upstream.probes import default_loader, probe_mrv2_kv_hooks
from ascend_core.upstream.version import installed_vllm_version

BIND_MODULE = "vllm.v1.worker.utils"


def bind_kv_cache_kwargs(kv_cache_groups: Any, bind: Callable[..., Any] | None = None) -> dict[str, Any]:
    """`{"kv_cache_groups": ...}` when the installed `bind_kv_cache` (or `bind`) takes it, else nothing."""
    if bind is None:
        bind = default_loader(BIND_MODULE, "bind_kv_cache")
    return {"kv_cache_groups": kv_cache_groups} if "kv_cache_groups" in inspect.signature(bind).parameters else {}


@functools.cache
def mrv2_unavailable_reason() -> str | None:
    """Why Ascend's Model Runner V2 cannot run on the installed vLLM (the `mrv2_kv_hooks` probe's words), or None.

    Runs that one probe alone, reading vLLM's runner sources without importing them, so the simulated platform may
    ask before it turns Triton's interpreter on.
    """
    try:
        _, usable, detail = probe_mrv2_kv_hooks(default_loader)
    except Exception as exc:  # a module that does not parse or import is what the probe reports
        usable, detail = False, f"{type(exc).__name__}: {exc}"
    return None if usable else f"vLLM {installed_vllm_version()}: {detail}"


def resolved_kv_cache_layout(cache_config: Any) -> Any:
    """The engine's resolved `KVCacheLayout`, or None on a vLLM without one (the legacy lane shapes KV per backend;
    our allocator then uses its default block-major layout)."""
    resolve = getattr(cache_config, "get_resolved_kv_cache_layout", None)
    return resolve() if resolve is not None else None
