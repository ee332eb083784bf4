"""Adapters for vLLM's Model Runner V2 prefill-context-parallel manager (`vllm.v1.worker.gpu.pcp_manager`).

The manager's constructor and `partition_batch()` changed shape across releases: vLLM PR 53515 added the persistent
input buffers (`max_num_reqs`, `max_num_tokens`, `block_tables` keywords) and moved the graph padding into the
partition step (`batch_desc`, earlier a bare padded token count), PR 53869 added the capture slot mappings
(`get_dummy_slot_mappings`). Ascend's manager subclasses the upstream one and passes only what the installed class
takes; these helpers decide that from signatures, never from version strings.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

PCP_MANAGER_MODULE = "vllm.v1.worker.gpu.pcp_manager"
# Names the padded token count of a partition step has had, newest first.
PARTITION_PAD_ARGS = ("batch_desc", "padded_num_tokens", "num_tokens_padded")


def upstream_pcp_manager_cls() -> type | None:
    """The installed vLLM's MRV2 `PCPManager`, or None when this vLLM has no MRV2 PCP."""
    import importlib

    from ascend_core.upstream.probes import module_exists

    if not module_exists(PCP_MANAGER_MODULE):
        return None
    return getattr(importlib.import_module(PCP_MANAGER_MODULE), "PCPManager", None)


def _params(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    return inspect.signature(fn).parameters


def pcp_init_kwargs(candidates: Mapping[str, Any], init: Callable[..., Any] | None = None) -> dict[str, Any]:
    """The subset of `candidates` that the upstream `PCPManager.__init__` (or `init`) accepts.

    A keyword the installed class does not take is dropped, so one call site serves every lane; the dropped names
    are the caller's to supply itself (Ascend's manager owns its buffers either way).
    """
    if init is None:
        cls = upstream_pcp_manager_cls()
        if cls is None:
            raise RuntimeError(f"the installed vLLM has no {PCP_MANAGER_MODULE}.PCPManager (MRV2 PCP)")
        init = cls.__init__
    params = _params(init)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(candidates)
    return {k: v for k, v in candidates.items() if k in params}


def pcp_partition_arg(partition: Callable[..., Any] | None = None) -> str | None:
    """Which padding argument `partition_batch` takes: one of PARTITION_PAD_ARGS, or None (pads itself)."""
    if partition is None:
        cls = upstream_pcp_manager_cls()
        if cls is None:
            return None
        partition = cls.partition_batch
    params = _params(partition)
    return next((n for n in PARTITION_PAD_ARGS if n in params), None)


def pcp_partition_kwargs(batch_desc: Any, partition: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Keywords that hand `batch_desc` (a `BatchExecutionDescriptor`) to the installed `partition_batch`.

    The current lane takes the descriptor itself; the earlier one took the padded token count, which is None
    when the step runs eagerly.
    """
    name = pcp_partition_arg(partition)
    if name is None:
        return {}
    if name == "batch_desc":
        return {name: batch_desc}
    eager = batch_desc is None or not bool(getattr(batch_desc, "cg_mode", None))
    return {name: None if eager else int(batch_desc.num_tokens)}


def pcp_has_capture_buffers(cls: type | None = None) -> bool:
    """Whether the upstream manager stages capture batches in its own buffers (PRs 53515 and 53869)."""
    cls = cls if cls is not None else upstream_pcp_manager_cls()
    return cls is not None and all(
        hasattr(cls, name)
        for name in ("prepare_inputs_to_capture", "get_dummy_block_tables", "get_dummy_slot_mappings")
    )
