"""What the KV pool reads from vLLM's configs: which groups it can store, their block size, ranks and key namespace.

Both roles derive the same namespace from the same inputs (model, KV geometry, tokens per block, group specs), so a
scheduler's lookup names exactly the keys its workers save. Only full-attention groups are stored: in sliding
window, Mamba or cross-attention groups a block id does not stand for the same tokens' KV in every engine.
"""

from __future__ import annotations

from typing import Any

from ascend_kv_transfer.pool.keys import RankCoords, pool_namespace
from ascend_kv_transfer.vllm_config_info import kv_geometry, layer_groups


def _layer_specs(spec: Any) -> list[Any]:
    inner = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs wraps per-layer specs
    return list(inner.values()) if inner else [spec]


def pool_block_tokens(vllm_config: Any, kv_cache_config: Any) -> int:
    """Tokens one block id stands for; refuses groups the pool cannot store, naming them."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    dcp = int(getattr(vllm_config.parallel_config, "decode_context_parallel_size", 1) or 1)
    sizes = set()
    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        for spec in _layer_specs(group.kv_cache_spec):
            if type(spec) not in (FullAttentionSpec, MLAAttentionSpec):
                raise ValueError(f"AscendStoreConnector stores full-attention KV only; KV cache group {gid} "
                                 f"({group.layer_names[:2]}...) is {type(spec).__name__}")
            sizes.add(int(spec.block_size) * (dcp if getattr(spec, "dcp_sharded", False) else 1))
    if len(sizes) != 1:
        raise ValueError(f"AscendStoreConnector needs one block size across KV cache groups, got {sorted(sizes)}")
    return sizes.pop()


def layer_order(kv_cache_config: Any) -> dict[int, list[str]]:
    """Group index -> the group's layers that own KV memory, in the group's order (the byte order of an object)."""
    owners = layer_groups(kv_cache_config)
    return {gid: [n for n in group.layer_names if owners.get(n) == gid]
            for gid, group in enumerate(kv_cache_config.kv_cache_groups)}


def namespace(vllm_config: Any, kv_cache_config: Any, model_key: str, block_tokens: int) -> str:
    model = model_key or str(vllm_config.model_config.model)
    geometry = kv_geometry(vllm_config, kv_cache_config)
    specs = tuple((type(s).__name__, int(s.page_size_bytes)) for g in kv_cache_config.kv_cache_groups
                  for s in _layer_specs(g.kv_cache_spec)[:1])
    return pool_namespace(model, (repr(geometry), block_tokens, specs))


def engine_rank_sizes(vllm_config: Any) -> RankCoords:
    """Rank 0 of an engine with this config's parallel sizes (`all_ranks()` lists every rank)."""
    parallel = vllm_config.parallel_config
    return RankCoords(tp_size=int(parallel.tensor_parallel_size), pp_size=int(parallel.pipeline_parallel_size),
                      pcp_size=int(getattr(parallel, "prefill_context_parallel_size", 1) or 1),
                      dcp_size=int(getattr(parallel, "decode_context_parallel_size", 1) or 1))


def worker_rank(vllm_config: Any) -> RankCoords:
    """This worker's coordinates, read from vLLM's initialised process groups."""
    from vllm.distributed.parallel_state import get_dcp_group, get_pcp_group, get_pp_group, get_tp_group

    sizes = engine_rank_sizes(vllm_config)
    return RankCoords(tp_rank=get_tp_group().rank_in_group, tp_size=sizes.tp_size,
                      pp_rank=get_pp_group().rank_in_group, pp_size=sizes.pp_size,
                      pcp_rank=get_pcp_group().rank_in_group if sizes.pcp_size > 1 else 0, pcp_size=sizes.pcp_size,
                      dcp_rank=get_dcp_group().rank_in_group if sizes.dcp_size > 1 else 0, dcp_size=sizes.dcp_size)
