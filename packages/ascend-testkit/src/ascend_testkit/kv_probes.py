"""Worker probes of the KV cache our allocator made (`EngineHost.rpc("ascend_testkit.kv_probes:<name>")`)."""

from __future__ import annotations

from typing import Any


def layer_kv(worker: Any) -> dict[str, dict[str, Any]]:
    """Per layer: the kind of typed view the allocator cut, its spec, and the bytes one token takes per layer.

    Bytes per token come from the views themselves: the per-state parts of the typed views (latent + rope for MLA,
    K + V otherwise) and, as a cross-check, the last axis of vLLM's own `[blocks, heads, states, bytes]` view times its
    heads; `states_per_block` is what a block holds (block_size // tokens per state).
    """
    allocation = getattr(worker.model_runner, "ascend_kv", None)
    if allocation is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, kv in allocation.layers.items():
        parts = {k: v for k, v in vars(kv).items() if hasattr(v, "shape") and k != "scale"}
        typed = sum(v.shape[-1] * v.shape[-2] * v.element_size() for v in parts.values())
        view = allocation.vllm_views[name]
        out[name] = {
            "kind": type(kv).__name__,
            "dims": {k: int(v.shape[-1]) for k, v in parts.items()},
            "dtype": str(next(iter(parts.values())).dtype),
            "bytes_per_token": int(typed),
            "vllm_view_bytes_per_token": int(view.shape[1] * view.shape[-1] * view.element_size()),
            "states_per_block": int(view.shape[2]),
        }
    return out


def kv_specs(worker: Any) -> dict[str, str]:
    """Layer -> class of the KV spec the runner planned it with."""
    config = getattr(worker.model_runner, "kv_cache_config", None)
    if config is None:
        return {}
    out = {}
    for group in config.kv_cache_groups:
        specs = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        for name in group.layer_names:
            spec = specs[name] if specs is not None else group.kv_cache_spec
            out[name] = f"{type(spec).__module__}.{type(spec).__qualname__}"
    return out


def connector_stats(worker: Any) -> dict[str, Any]:
    """This rank's KV connector counters (`connector_stats()`): the workers of a multi-rank engine run in processes of
    their own, where the host's `stats` cannot see them."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return {}
    connector = get_kv_transfer_group()
    return connector.connector_stats() if hasattr(connector, "connector_stats") else {}


def kv_groups(worker: Any) -> list[dict[str, Any]]:
    """The runner's KV cache groups as a connector sees them: per group its spec kind and geometry (block size, page
    bytes, sliding window, tokens per state) and whether vLLM lets connectors transfer it, with each layer's own
    page bytes (a group of `UniformTypeKVCacheSpecs` holds layers of several page sizes)."""
    config = getattr(worker.model_runner, "kv_cache_config", None)
    if config is None:
        return []
    out = []
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        specs = getattr(spec, "kv_cache_specs", None) or {name: spec for name in group.layer_names}
        first = specs[group.layer_names[0]]
        out.append({
            "spec": type(first).__name__,
            "block_size": int(first.block_size),
            "sliding_window": getattr(first, "sliding_window", None),
            "tokens_per_state": int(getattr(first, "tokens_per_state", 1) or 1),
            "enable_kv_transfer": bool(getattr(group, "enable_kv_transfer", True)),
            "layers": {name: int(specs[name].page_size_bytes) for name in group.layer_names},
            # a state spec's parts (e.g. a GDN layer's conv and recurrent states): their dtypes, as vLLM chose them
            "state_dtypes": [str(d).removeprefix("torch.") for d in getattr(first, "dtypes", ())],
        })
    return out


def hybrid_kv(worker: Any) -> dict[str, dict[str, Any]]:
    """Per layer of a hybrid model: the typed view our allocator cut (AttentionKV or MambaState), its parts' shapes
    and block strides in bytes, and the byte range of its region, to show attention pages and GDN states sharing one
    backing."""
    allocation = getattr(worker.model_runner, "ascend_kv", None)
    if allocation is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, kv in allocation.layers.items():
        parts = kv.tensors if hasattr(kv, "tensors") else [v for v in vars(kv).values() if hasattr(v, "shape")]
        view = allocation.vllm_views[name]
        out[name] = {
            "kind": type(kv).__name__,
            "shapes": [list(p.shape) for p in parts],
            "block_strides": [int(p.stride(0) * p.element_size()) for p in parts],
            "start": int(view.data_ptr()),
            "storage": int(view.untyped_storage().data_ptr()),
            "paged_planes": name in allocation.planar and allocation.planar[name].block_stride is not None,
        }
    return out
