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


def full_attention_layers(kv_cache_config: Any) -> list[str]:
    """The layers of the full-attention groups: the ones vLLM zeroes new blocks of."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return [name for group in kv_cache_config.kv_cache_groups if isinstance(group.kv_cache_spec, FullAttentionSpec)
            for name in group.layer_names]


class AscendBlockZeroer:
    """What vLLM's runners call to zero new blocks (`zero_block_ids`, `warmup`), over the runner's allocation."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.layers = full_attention_layers(runner.kv_cache_config)

    def zero_block_ids(self, block_ids: list[int]) -> None:
        allocation = self.runner.ascend_kv
        if allocation is None or not block_ids:
            return
        if allocation.zero_blocks(block_ids, self.layers):
            usage.count("allocator.zeroed_blocks", len(block_ids))

    def warmup(self, num_kv_blocks: int) -> None:
        """Nothing to compile: the views are zeroed with torch ops."""
