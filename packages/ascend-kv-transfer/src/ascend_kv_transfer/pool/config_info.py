"""What the KV pool reads from vLLM's configs: which groups it can store, their block size, ranks and key namespace.

Both roles derive the same namespace from the same inputs (model, KV geometry, tokens per block, group specs), so a
scheduler's lookup names exactly the keys its workers save. Only full-attention groups are stored: in sliding
window, Mamba or cross-attention groups a block id does not stand for the same tokens' KV in every engine.

Where every TP rank caches the same bytes (MLA's latent, `KVGeometry.tp_replicated`), the pool keeps one object per
block for all of them: keys and namespace leave the TP coordinates out, TP rank 0 alone saves, every rank loads the
same object, and engines of any TP size share the objects.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from ascend_core.upstream import mla_ratio
from ascend_kv_transfer.pool.keys import pool_namespace
from ascend_kv_transfer.ranks import RankCoords
from ascend_kv_transfer.vllm_config_info import engine_ranks, kv_geometry, layer_groups, worker_ranks


def _layer_specs(spec: Any) -> list[Any]:
    inner = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs wraps per-layer specs
    return list(inner.values()) if inner else [spec]


def _not_storable(spec: Any) -> str | None:
    """Why a block of this spec does not stand for the same tokens' KV in every engine (None: it does).

    Full attention and its refinements (MLA's latent, a platform's subclasses such as Ascend's MLA and indexer specs)
    qualify; a full-attention spec that evicts blocks (R-SWA's `rswa_window`) or holds one state per several tokens
    (compressed MLA) does not.
    """
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    if not isinstance(spec, FullAttentionSpec):
        return type(spec).__name__
    if getattr(spec, "rswa_window", None) is not None:
        return f"{type(spec).__name__} (evicts blocks outside its window)"
    try:
        ratio = mla_ratio(spec)
    except TypeError:  # a lane whose full-attention specs carry no ratio field: one state per token
        ratio = 1
    if ratio > 1:
        return f"{type(spec).__name__} (compressed: one state per {ratio} tokens)"
    return None


def pool_block_tokens(vllm_config: Any, kv_cache_config: Any) -> int:
    """Tokens one block id stands for; refuses groups the pool cannot store, naming them."""
    dcp = int(getattr(vllm_config.parallel_config, "decode_context_parallel_size", 1) or 1)
    sizes = set()
    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        for spec in _layer_specs(group.kv_cache_spec):
            refused = _not_storable(spec)
            if refused is not None:
                raise ValueError(f"AscendStoreConnector stores full-attention KV only; KV cache group {gid} "
                                 f"({group.layer_names[:2]}...) is {refused}")
            sizes.add(int(spec.block_size) * (dcp if getattr(spec, "dcp_sharded", False) else 1))
    if len(sizes) != 1:
        raise ValueError(f"AscendStoreConnector needs one block size across KV cache groups, got {sorted(sizes)}")
    return sizes.pop()


def layer_order(kv_cache_config: Any) -> dict[int, list[str]]:
    """Group index -> the group's layers that own KV memory, in the group's order (the byte order of an object)."""
    owners = layer_groups(kv_cache_config)
    return {gid: [n for n in group.layer_names if owners.get(n) == gid]
            for gid, group in enumerate(kv_cache_config.kv_cache_groups)}


def tp_replicated(vllm_config: Any, kv_cache_config: Any) -> bool:
    """Every TP rank holds the same KV bytes (then one object per block serves them all)."""
    return kv_geometry(vllm_config, kv_cache_config).tp_replicated


def namespace(vllm_config: Any, kv_cache_config: Any, model_key: str, block_tokens: int) -> str:
    model = model_key or str(vllm_config.model_config.model)
    geometry = kv_geometry(vllm_config, kv_cache_config)
    if geometry.tp_replicated:  # the bytes do not depend on the TP size: engines of any TP size share objects
        geometry = msgspec.structs.replace(geometry, tp_size=1)
    specs = tuple((type(s).__name__, int(s.page_size_bytes)) for g in kv_cache_config.kv_cache_groups
                  for s in _layer_specs(g.kv_cache_spec)[:1])
    return pool_namespace(model, (repr(geometry), block_tokens, specs))


def engine_rank_sizes(vllm_config: Any, *, replicated: bool = False) -> RankCoords:
    """Rank 0 of an engine with this config's parallel sizes (`all_ranks()` lists every rank whose objects a block
    needs); with TP-replicated KV the TP ranks count as one. No DP rank: DP engines share the pool's objects."""
    sizes = dataclasses.replace(engine_ranks(vllm_config), dp_rank=0)
    return sizes.tp_collapsed() if replicated else sizes


def worker_rank(vllm_config: Any, *, replicated: bool = False) -> RankCoords:
    """This worker's coordinates in the keys, read from vLLM's initialised process groups (TP rank 0 of 1 for every
    TP rank when the KV is TP-replicated)."""
    rank = dataclasses.replace(worker_ranks(vllm_config), dp_rank=0)
    return rank.tp_collapsed() if replicated else rank


def saves_objects(replicated: bool) -> bool:
    """Whether this worker puts objects: with TP-replicated KV only TP rank 0 does (the others hold the same bytes)."""
    from vllm.distributed.parallel_state import get_tp_group

    return not replicated or get_tp_group().rank_in_group == 0
