"""DFlash, DFlash2 and DSpark: block-parallel drafting conditioned on target features (upstream speculators)."""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import CUDAGraphMode
from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator
from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

from ascend_specdecode.speculators.base import AscendSpeculatorMixin
from ascend_specdecode.speculators.candidate_walk import walk_greedy


class AscendDFlashSpeculator(AscendSpeculatorMixin, DFlashSpeculator):
    """DFlash: one draft forward proposes a whole block."""


class AscendDFlash2Speculator(AscendSpeculatorMixin, DFlash2Speculator):
    """DFlash2: DFlash plus a candidate head; its draft model is built through the factories in `models.dflash2`.

    Each draft block is scored by the draft's candidate selector and walked by the candidate sampler; DFlash1 (what
    vLLM's V1 proposer would run for the same checkpoint) samples the mask positions' logits directly. The count
    `candidate_walks` shows which ran. Greedy drafts score only the candidate edges the walk reads
    (`candidate_walk`); upstream scores all ``top_k**2`` of them per draft position.
    """

    def _score_candidates(self, *args: Any, **kwargs: Any) -> Any:
        self.ascend_counts["candidate_walks"] += 1
        return super()._score_candidates(*args, **kwargs)

    def _generate_draft(self, num_reqs: int, num_tokens_padded: int, attn_metadata: dict[str, Any] | None,
                        slot_mappings: dict[str, torch.Tensor] | None, num_tokens_across_dp: torch.Tensor | None,
                        cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE) -> None:
        """Upstream's draft step, with greedy drafts walked by `walk_greedy` (the edge rows the walk reads, not
        every edge of the block); sampled drafts go through upstream's walk (`full_edge_walks` counts them)."""
        if self.draft_logits is not None:
            self.ascend_counts["full_edge_walks"] += 1
            return super()._generate_draft(num_reqs, num_tokens_padded, attn_metadata, slot_mappings,
                                           num_tokens_across_dp, cudagraph_runtime_mode)
        self.ascend_counts["candidate_walks"] += 1
        self.ascend_counts["walked_rows_only"] += 1
        steps = self.num_speculative_steps
        last_hidden_states = self._run_model(num_tokens_padded, attn_metadata, slot_mappings, num_tokens_across_dp,
                                             cudagraph_runtime_mode)
        num_sample = num_reqs * steps
        hidden_states = last_hidden_states[self.sample_indices[:num_sample]].view(num_reqs, steps, -1)
        candidate_ids, unary_logits = self.model.compute_candidates(hidden_states.flatten(0, 1))
        candidate_ids = candidate_ids.view(num_reqs, steps, self.top_k)
        anchors = self.input_buffers.input_ids[: num_reqs * self.num_query_per_req : self.num_query_per_req]
        tokens, rows = walk_greedy(self.model.model.candidate_selector, candidate_ids,
                                   unary_logits.view_as(candidate_ids), hidden_states, anchors)
        # Rows of padded requests (no request state) keep what they held, as the kernel leaves them.
        live = self.sample_idx_mapping[:num_sample:steps] >= 0
        drafts, realized = self.draft_tokens[:num_reqs], self.candidate_sampler.scores[:num_reqs]
        drafts.copy_(torch.where(live[:, None], tokens.to(drafts.dtype), drafts))
        realized.copy_(torch.where(live[:, None, None], rows.to(realized.dtype), realized))
        if self.enable_adaptive_verification:
            self._maybe_predict_acceptance(realized.flatten(0, 1), self.sample_idx_mapping[:num_sample],
                                           self.sample_col[:num_sample])


class AscendDSparkSpeculator(AscendSpeculatorMixin, DSparkSpeculator):
    """DSpark (a DFlash subclass upstream, so it is dispatched before DFlash): a parallel block, then the Markov
    head samples it left to right (`markov_blocks` counts those sequential passes)."""

    def _sample_sequential(self, *args: Any, **kwargs: Any) -> Any:
        self.ascend_counts["markov_blocks"] += 1
        return super()._sample_sequential(*args, **kwargs)
