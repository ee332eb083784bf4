"""The installed vLLM's lane and capabilities, derived from the probes and cached per process."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from ascend_core.upstream.errors import UpstreamContractError
from ascend_core.upstream.probes import Loader, ProbeResult, default_loader, module_exists, run_probes
from ascend_core.upstream.version import installed_vllm_version


class Lane(str, enum.Enum):
    LEGACY = "legacy"  # <= 0.28: shared_by, compress_ratio, num_tokens_across_dp
    CURRENT = "current"  # >= 0.29: layers/strides, tokens_per_state, dp_sync[_state]


@dataclass(frozen=True)
class Capabilities:
    lane: Lane
    vllm_version: str | None
    kv_layer_field: str
    kv_tensor_stride_fields: tuple[str, ...]
    kv_tensor_host_resident: bool
    mla_ratio_field: str
    planner_module: str
    has_kv_cache_layout: bool
    has_shared_allocate: bool
    speculator_dp_arg: str | None
    logits_skip_gather: bool
    connector_unregister_kv_caches: bool
    has_kv_spec_registry: bool
    probes: tuple[ProbeResult, ...]


def detect_capabilities(loader: Loader = default_loader) -> Capabilities:
    """Probe the installed vLLM (or what `loader` hands out); raise one error naming every failed required probe."""
    version = installed_vllm_version()
    if loader is default_loader and not module_exists("vllm"):
        missing = ProbeResult("vllm_importable", False, None, "no module named 'vllm': install a vLLM build", True)
        raise UpstreamContractError([missing], None)
    probes = run_probes(loader)
    failed = [p for p in probes if p.required and not p.ok]
    if failed:
        raise UpstreamContractError(failed, version)
    v = {p.name: p.value for p in probes}
    return Capabilities(
        lane=Lane.CURRENT if v["kv_tensor_layer_field"] == "layers" else Lane.LEGACY,
        vllm_version=version,
        kv_layer_field=v["kv_tensor_layer_field"],
        kv_tensor_stride_fields=tuple(v["kv_tensor_strides"] or ()),
        kv_tensor_host_resident=bool(v["kv_tensor_host_resident"]),
        mla_ratio_field=v["mla_ratio_field"],
        planner_module=v["planner_module"],
        has_kv_cache_layout=bool(v["kv_cache_layout_module"]),
        has_shared_allocate=bool(v["shared_allocate_kv_cache"]),
        speculator_dp_arg=v["speculator_dp_arg"],
        logits_skip_gather=bool(v["logits_skip_gather"]),
        connector_unregister_kv_caches=bool(v["connector_unregister_kv_caches"]),
        has_kv_spec_registry=bool(v["kv_spec_registry"]),
        probes=tuple(probes),
    )


@functools.cache
def capabilities() -> Capabilities:
    """The installed vLLM's capabilities, probed once per process."""
    return detect_capabilities()
