"""`AscendLogitsProcessor`: the vocab-parallel LM head's logits, gathered over tensor parallelism or left local.

Registered out of tree for vLLM's `LogitsProcessor` (a `PluggableLayer`). Each tensor-parallel rank projects the
hidden states onto its vocab shard; normally the shards are gathered into full-vocab logits here. With batch-sharded
sampling (vLLM 50465, Model Runner V2 with tensor parallelism) the runner asks for `skip_gather=True` and exchanges
the local shards itself (an all-to-all that leaves each rank the full-vocab logits of the requests it samples), so
this layer returns before the gather. The release lane has no `skip_gather`; the upstream adapter
(`ascend_core.upstream.logits_forward_kwargs`) passes it only where it exists.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.logits_processor import LogitsProcessor

from ascend_core.upstream import logits_forward_kwargs
from ascend_platform import usage


class AscendLogitsProcessor(LogitsProcessor):
    def forward(self, lm_head: Any, hidden_states: torch.Tensor, embedding_bias: torch.Tensor | None = None,
                skip_gather: bool = False) -> torch.Tensor | None:
        # Named, not `super()`: vLLM's LoRA wrapper runs this with itself as `self` (`LogitsProcessorWithLoRA.forward`
        # is `type(self.base_layer).forward(self, ...)`), and it is no AscendLogitsProcessor.
        return LogitsProcessor.forward(self, lm_head, hidden_states, embedding_bias,
                                       **logits_forward_kwargs(skip_gather))

    # The trailing default keeps the release lane's call `_get_logits(hidden_states, lm_head, embedding_bias)` valid.
    def _get_logits(self, hidden_states: torch.Tensor, lm_head: Any, embedding_bias: torch.Tensor | None,
                    skip_gather: bool = False) -> torch.Tensor | None:
        logits = self._apply_head(lm_head, hidden_states, embedding_bias)
        if skip_gather:
            # This rank's vocab shard (padding included); the caller owns the exchange and the trim.
            usage.count("logits.local_shard")
            return logits
        if lm_head.tp_size > 1:
            logits = self._gather_logits(logits)
            usage.count("logits.gathered")
        else:
            usage.count("logits.full")
        if logits is not None:
            logits = logits[..., : self.org_vocab_size]
        return logits
