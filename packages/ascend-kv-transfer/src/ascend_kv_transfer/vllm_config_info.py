"""What the connectors read from vLLM's configs: KV geometry, parallel ranks, layer-to-group mapping."""

from __future__ import annotations

import dataclasses
from typing import Any

from ascend_core.upstream import kv_config_layout
from ascend_kv_transfer.p2p.schema import KVGeometry
from ascend_kv_transfer.ranks import RankCoords


def layer_groups(kv_cache_config: Any) -> dict[str, int]:
    """Layer name -> index of its KV cache group, for the layers that own KV memory.

    Only layers named by a `KVCacheTensor` descriptor own memory (a layer sharing another layer's KV has none and
    would alias its pages); descriptor layer names are read through `ascend_core.upstream.kv_tensor_layers`, which
    knows every lane's field name.
    """
    from ascend_core.upstream import kv_tensor_layers

    owned = {name for tensor in kv_cache_config.kv_cache_tensors for name in kv_tensor_layers(tensor)}
    return {name: gid for gid, group in enumerate(kv_cache_config.kv_cache_groups) for name in group.layer_names
            if name in owned or not owned}


def _attention_spec(kv_cache_config: Any) -> Any:
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        specs = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs wraps per-layer specs
        if specs:
            spec = next(iter(specs.values()))
        if hasattr(spec, "num_kv_heads") and hasattr(spec, "head_size"):
            return spec
    raise ValueError("no attention KV cache group with num_kv_heads/head_size in kv_cache_config")


def kv_geometry(vllm_config: Any, kv_cache_config: Any) -> KVGeometry:
    spec = _attention_spec(kv_cache_config)
    parallel = vllm_config.parallel_config
    return KVGeometry(
        block_size=int(vllm_config.cache_config.block_size),
        dtype=str(spec.dtype).removeprefix("torch."),
        num_kv_heads=int(spec.num_kv_heads),
        head_size=int(spec.head_size),
        layout=kv_config_layout(kv_cache_config) or "default",
        tp_size=int(parallel.tensor_parallel_size),
        pp_size=int(parallel.pipeline_parallel_size),
        pcp_size=int(getattr(parallel, "prefill_context_parallel_size", 1) or 1),
        # MLA's latent has no heads to split: every TP rank caches the same bytes, unless decode context parallelism
        # deals the tokens out over the TP ranks.
        tp_replicated=bool(getattr(vllm_config.model_config, "use_mla", False))
        and int(getattr(parallel, "decode_context_parallel_size", 1) or 1) == 1,
    )


def _dp_rank(parallel: Any) -> int:
    if parallel.local_engines_only:
        return int(parallel.data_parallel_rank_local or 0)
    return int(getattr(parallel, "data_parallel_index", 0) or 0)


def engine_ranks(vllm_config: Any) -> RankCoords:
    """The engine's first worker as its scheduler knows it: its DP rank and every parallel size."""
    parallel = vllm_config.parallel_config
    return RankCoords(dp_rank=_dp_rank(parallel), tp_size=int(parallel.tensor_parallel_size),
                      pp_size=int(parallel.pipeline_parallel_size),
                      pcp_size=int(getattr(parallel, "prefill_context_parallel_size", 1) or 1),
                      dcp_size=int(getattr(parallel, "decode_context_parallel_size", 1) or 1))


def worker_ranks(vllm_config: Any) -> RankCoords:
    """This worker's ranks, read from vLLM's initialised process groups."""
    from vllm.distributed.parallel_state import get_dcp_group, get_pcp_group, get_pp_group, get_tp_group

    base = engine_ranks(vllm_config)
    return dataclasses.replace(base, tp_rank=get_tp_group().rank_in_group, pp_rank=get_pp_group().rank_in_group,
                               pcp_rank=get_pcp_group().rank_in_group if base.pcp_size > 1 else 0,
                               dcp_rank=get_dcp_group().rank_in_group if base.dcp_size > 1 else 0)


def bytes_per_block(kv_cache_config: Any) -> int:
    """Bytes one block occupies across every layer (the unit the host tier's byte budget is counted in)."""
    total = 0
    for group in kv_cache_config.kv_cache_groups:
        specs = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        if specs:
            total += sum(specs[name].page_size_bytes for name in group.layer_names)
        else:
            total += group.kv_cache_spec.page_size_bytes * len(group.layer_names)
    return total
