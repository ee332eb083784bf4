"""N-gram (prompt lookup) drafting for Model Runner V2 with torch tensor ops instead of upstream's Triton scan.

Upstream's `NgramGPUSpeculator` finds, for each request, the longest suffix n-gram (``prompt_lookup_min`` ..
``prompt_lookup_max`` tokens) that occurred earlier in the request's tokens, rightmost occurrence first, and drafts the
tokens that followed it; slots with nothing to copy (no match, or the match too close to the end) repeat the last
sampled token and are verified like any draft. It does so with two Triton kernels that reduce (`tl.max`, `tl.sum`),
which need a Triton device backend. `ngram_drafts` computes the same drafts with a handful of comparisons over the
requests' token rows (`RequestState.all_token_ids`, dense on the device for n-gram runs), on whatever device holds
them: no kernel of its own, no host synchronisation. The runner then verifies the drafts with its verifier, the
Ascend one once the platform installed it.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker.gpu.spec_decode.ngram.speculator import NgramGPUSpeculator

from ascend_specdecode.speculators.base import AscendSpeculatorMixin


def ngram_drafts(token_ids: torch.Tensor, idx_mapping: torch.Tensor, total_len: torch.Tensor,
                 num_sampled: torch.Tensor, last_sampled: torch.Tensor, min_n: int, max_n: int,
                 k: int) -> torch.Tensor:
    """``[num_reqs, k]`` int64 drafts, as `_ngram_scan_kernel` + `_ngram_finalize_kernel` write them.

    `token_ids` is ``[max_num_reqs, L]`` (each request's tokens, `total_len` of them valid), `idx_mapping` maps batch
    rows to request rows (negative: a padded row, drafted as its clamped row and ignored by the runner), `num_sampled`
    is per batch row (a row that sampled nothing this step gets no match), `last_sampled` per request.
    """
    reqs = idx_mapping.long().clamp(min=0)
    rows = token_ids[reqs]
    num_rows, length = rows.shape
    seq_len = total_len[reqs].long()
    eligible = (num_sampled[:num_rows] > 0) & (seq_len >= min_n) & (idx_mapping >= 0)
    best = torch.zeros(num_rows, dtype=torch.int64, device=rows.device)
    for n in range(min_n, max_n + 1):
        starts = length - n  # candidate positions 0 .. length - n - 1: a match is followed by at least one token
        if starts <= 0:
            break
        pos = torch.arange(starts, device=rows.device)
        match = (pos[None, :] <= (seq_len - n - 1)[:, None]) & eligible[:, None]
        for j in range(n):
            suffix = rows.gather(1, (seq_len - n + j).clamp(0, length - 1)[:, None])
            match &= rows[:, j:j + starts] == suffix
        # Longest n first, then the rightmost position: one max over n * (L + 1) + pos + 1 (0 = no match).
        score = torch.where(match, n * (length + 1) + pos[None, :] + 1, 0)
        best = torch.maximum(best, score.amax(dim=1))
    found = best > 0
    best_n = torch.where(found, (best - 1) // (length + 1), 0)
    best_pos = torch.where(found, best - 1 - best_n * (length + 1), 0)
    draft_start = best_pos + best_n
    slots = torch.arange(k, device=rows.device)
    copied = rows.gather(1, (draft_start[:, None] + slots[None, :]).clamp(max=length - 1)).long()
    valid = found[:, None] & (slots[None, :] < (seq_len - draft_start)[:, None])
    return torch.where(valid, copied, last_sampled.view(-1)[reqs][:, None].long())


class _TorchNgramSpeculator(NgramGPUSpeculator):
    """Upstream's n-gram speculator (configuration, buffers, no draft model or graphs) drafting through torch ops."""

    @torch.inference_mode()
    def propose(self, input_batch: Any, attn_metadata: Any, slot_mappings: Any, last_hidden_states: Any,
                aux_hidden_states: Any, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                last_sampled: torch.Tensor, next_prefill_tokens: Any, temperature: Any, seeds: Any,
                dummy_run: bool = False, **_unused: Any) -> torch.Tensor:
        num_reqs = input_batch.num_reqs
        if dummy_run:
            return self.drafts[:num_reqs]
        req_states = self.req_states
        drafts = ngram_drafts(req_states.all_token_ids.gpu, input_batch.idx_mapping[:num_reqs],
                              req_states.total_len.gpu, num_sampled, last_sampled, self.min_n, self.max_n,
                              self.num_speculative_steps)
        self.drafts[:num_reqs] = drafts
        self.ascend_counts["ngram_scans"] += 1  # type: ignore[attr-defined]
        return self.drafts[:num_reqs]


class AscendNgramSpeculator(AscendSpeculatorMixin, _TorchNgramSpeculator):
    """N-gram drafts for Model Runner V2 (``method="ngram"``); built with the runner's request states."""
