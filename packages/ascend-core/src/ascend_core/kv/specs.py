"""Ascend KV-cache specs: MLA with scale parts, the sparse indexer cache, and sliding-window MLA.

They subclass the installed vLLM's specs so its planner groups and sizes them like its own; the compression ratio
goes through `ascend_core.upstream` (`tokens_per_state` now, `compress_ratio` on the legacy lane). A page holds
`storage_block_size` states per head, each `head_size` elements of `dtype` followed by `scale_dim` elements of
`scale_dtype`. Registration with vLLM's spec registry is explicit (`register_ascend_kv_specs()`), never at import.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec

from ascend_core.kv.errors import KVSpecMergeError
from ascend_core.upstream import capabilities, mla_ratio, mla_ratio_field, mla_ratio_kwargs

logger = init_logger(__name__)

# Fields a merged group takes as "any layer has it" instead of requiring equality (vLLM merges them the same way).
_OR_MERGED_FIELDS = frozenset({"non_causal", "non_causal_multi_token_decode"})


def _dtype_size(dtype: torch.dtype) -> int:
    return dtype.itemsize


def merge_identical_specs(specs: list[Any]) -> Any:
    """Merge specs that must agree field by field; the error names the first field that differs and its values."""
    if not specs:
        raise KVSpecMergeError("cannot merge an empty list of KV cache specs")
    first = specs[0]
    for i, spec in enumerate(specs[1:], start=1):
        if type(spec) is not type(first):
            raise KVSpecMergeError(f"{type(first).__name__}.merge: spec type differs between layers: "
                             f"{type(first).__name__} (spec 0) vs {type(spec).__name__} (spec {i})")
        for f in dataclasses.fields(first):
            if f.name in _OR_MERGED_FIELDS:
                continue
            a, b = getattr(first, f.name), getattr(spec, f.name)
            if a != b:
                raise KVSpecMergeError(f"{type(first).__name__}.merge: field {f.name!r} differs between layers: "
                                 f"{a!r} (spec 0) vs {b!r} (spec {i})")
    merged = copy.deepcopy(first)
    for name in _OR_MERGED_FIELDS & {f.name for f in dataclasses.fields(first)}:
        object.__setattr__(merged, name, any(getattr(s, name) for s in specs))
    return merged


@dataclass(frozen=True, kw_only=True)
class _AscendPageParts:
    """Fields and page arithmetic shared by the Ascend MLA-family specs (a mixin placed before vLLM's spec)."""

    rope_head_dim: int = 0
    """Trailing elements of `head_size` that hold the rotary part (MLA: latent = head_size - rope_head_dim)."""
    scale_dim: int = 0
    """Elements of `scale_dtype` stored after each state (quantisation scales); 0 = none."""
    scale_dtype: torch.dtype | None = None
    sparse_c8: bool = False
    """Sparse attention over an int8 (C8) latent cache; needs scales."""
    host_resident: bool = False
    """The cache lives in host memory (offloaded sparse KV), not on the device."""

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        if self.scale_dim < 0 or self.rope_head_dim < 0:
            raise ValueError(f"{name}: scale_dim={self.scale_dim} and rope_head_dim={self.rope_head_dim} "
                             f"must be >= 0")
        if self.scale_dim and self.scale_dtype is None:
            raise ValueError(f"{name}: scale_dim={self.scale_dim} needs a scale_dtype")
        if self.rope_head_dim > self.head_size:
            raise ValueError(f"{name}: rope_head_dim={self.rope_head_dim} exceeds head_size={self.head_size}")
        if self.sparse_c8 and (self.dtype != torch.int8 or not self.scale_dim):
            raise ValueError(f"{name}: sparse_c8 needs dtype=torch.int8 and scale_dim > 0 "
                             f"(got dtype={self.dtype}, scale_dim={self.scale_dim})")
        if self.block_size % self.ratio:
            raise ValueError(f"{name}: block_size={self.block_size} is not a multiple of the ratio {self.ratio}")

    @classmethod
    def create(cls, *, ratio: int = 1, **kwargs: Any):
        """Build the spec with its compression `ratio` set through whichever field the installed vLLM has."""
        return cls(**mla_ratio_kwargs(ratio, cls), **kwargs)

    @property
    def ratio(self) -> int:
        """Tokens per stored state (1 = uncompressed)."""
        return mla_ratio(self)

    @property
    def storage_block_size(self) -> int:
        """States stored per block: `block_size // ratio`."""
        return self.block_size // self.ratio

    @property
    def scale_bytes(self) -> int:
        return self.scale_dim * _dtype_size(self.scale_dtype) if self.scale_dim else 0

    @property
    def state_content_size_bytes(self) -> int:
        explicit = getattr(self, "state_content_bytes", None)
        if explicit is not None:
            return explicit
        return self.head_size * _dtype_size(self.dtype) + self.scale_bytes

    @property
    def page_size_bytes(self) -> int:
        padded = getattr(self, "page_size_padded", None)
        heads = getattr(self, "num_head_slots", None) or self.num_kv_heads
        real = self.storage_block_size * heads * self.state_content_size_bytes
        if padded is not None:
            if padded < real:
                raise ValueError(f"{type(self).__name__}: page_size_padded={padded} < page {real}")
            return padded
        return real

    @classmethod
    def merge(cls, specs: list[Any]) -> Any:
        return merge_identical_specs(specs)


@dataclass(frozen=True, kw_only=True)
class AscendMLAAttentionSpec(_AscendPageParts, MLAAttentionSpec):
    """MLA latent cache with optional scales (C8), a host-resident flag and a compression ratio."""


@dataclass(frozen=True, kw_only=True)
class AscendSparseIndexerSpec(_AscendPageParts, MLAAttentionSpec):
    """The sparse-attention indexer cache: per state, `head_size` index-key elements then `scale_dim` scales."""


@dataclass(frozen=True, kw_only=True)
class AscendSlidingWindowMLASpec(_AscendPageParts, SlidingWindowMLASpec):
    """Sliding-window MLA (compressed sliding window layers) with the same page parts as the full MLA spec."""


def ascend_mla_spec(spec: Any, *, rope_head_dim: int, ratio: int | None = None) -> AscendMLAAttentionSpec:
    """vLLM's MLA spec of a layer as our `AscendMLAAttentionSpec` (same page; the rotary width said explicitly).

    The compression ratio is `ratio` when given, else the spec's own (through the `mla_ratio` adapter).
    """
    if isinstance(spec, AscendMLAAttentionSpec) and ratio is None and spec.rope_head_dim == rope_head_dim:
        return spec
    field = mla_ratio_field(spec)
    kwargs = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.init and f.name != field}
    kwargs["rope_head_dim"] = rope_head_dim
    return AscendMLAAttentionSpec.create(ratio=mla_ratio(spec) if ratio is None else ratio, **kwargs)


ASCEND_KV_SPECS = (AscendMLAAttentionSpec, AscendSparseIndexerSpec, AscendSlidingWindowMLASpec)


def register_ascend_kv_specs() -> bool:
    """Register the Ascend specs with vLLM's KV spec registry; safe to call any number of times.

    Returns False when the installed vLLM has no registry (its planner then treats specs by their base class).
    """
    if not capabilities().has_kv_spec_registry:
        return False
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, SlidingWindowManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry, register_kv_cache_spec

    # The registry fills in vLLM's built-in specs only while it is empty: let it do so before adding ours.
    KVCacheSpecRegistry.check_kv_cache_spec_registry({})
    plan = ((AscendMLAAttentionSpec, FullAttentionManager, FullAttentionSpec),
            (AscendSparseIndexerSpec, FullAttentionManager, FullAttentionSpec),
            (AscendSlidingWindowMLASpec, SlidingWindowManager, SlidingWindowMLASpec))
    for spec_cls, manager, base in plan:
        register_kv_cache_spec(manager_class=manager, uniform_type_base_spec=base)(spec_cls)
    logger.debug("registered Ascend KV specs: %s", [c.__name__ for c, _, _ in plan])
    return True
