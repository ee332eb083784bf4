"""Zeroing the full-attention pages of blocks new to them, for hybrid models, through our allocator's views.

vLLM's scheduler hands a block freed by one cache group to another (a hybrid model's Mamba states and its attention
share one block pool), so a block an attention layer gets may hold state bytes; the runners zero such blocks
(`new_block_ids_to_zero`) before the step. vLLM's zeroers index `layer.kv_cache[block]` (CPU runner) or read the
bound tensor's first dimension as blocks (`KVBlockZeroer`), which for our planar layers (`[2, num_blocks, ...]`) is the
K/V plane index. `AscendBlockZeroer` zeroes each block through the allocation's typed views instead.
"""

from __future__ import annotations

from typing import Any

from ascend_platform import usage


def zeroed_layers(kv_cache_config: Any) -> list[str]:
    """The layers whose new blocks vLLM zeroes: every attention layer (its scheduler records new blocks of attention
    groups only, circular buffers excepted), never a state layer."""
    from vllm.v1 import kv_cache_interface as kvi

    from ascend_core.kv.placement import layer_specs

    skip = tuple(c for c in (getattr(kvi, "CircularBufferSpec", None),) if c is not None)
    return [name for name, (_, spec) in layer_specs(kv_cache_config.kv_cache_groups).items()
            if isinstance(spec, kvi.AttentionSpec) and not isinstance(spec, skip)]


class AscendBlockZeroer:
    """What vLLM's runners call to zero new blocks (`zero_block_ids`, `warmup`), over the runner's allocation."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.layers = zeroed_layers(runner.kv_cache_config)

    def zero_block_ids(self, block_ids: list[int]) -> None:
        allocation = self.runner.ascend_kv
        if allocation is None or not block_ids:
            return
        if allocation.zero_blocks(block_ids, self.layers):
            usage.count("allocator.zeroed_blocks", len(block_ids))

    def warmup(self, num_kv_blocks: int) -> None:
        """Nothing to compile: the views are zeroed with torch ops."""
