"""Draft verification for vLLM's Model Runner V2 through the `ascend_kernels` rejection sampler.

MRV2's verifier (`vllm.v1.worker.gpu.spec_decode.rejection_sampler.RejectionSampler`) gathers each logits row's draft
token, applies the requests' sampling parameters to the target logits, then decides acceptance with Triton kernels.
`AscendMRV2RejectionSampler` keeps all of that around the decision (chunking, logits processing, logprobs, the
sampled/rejected counts) and takes the decision to `ascend_kernels.ops.rejection_sample` (via `kernel_bridge`), the
op with an NPU kernel: for greedy requests a draft is accepted while it is the target's argmax, then the argmax (or
the bonus token) follows; for sampled requests (temperature > 0) a draft x is accepted with probability p(x) (MRV2
drafts greedily, so q is one-hot), the first rejected one replaced by a draw from p without x, which keeps the
output distributed exactly as the target's. A seeded request draws from a generator keyed by its seed and position
(`kernel_bridge.sampled_verify_rows`), so it repeats whatever else is in its batch; its tokens are not MRV2's own
(MRV2 draws with a counter-based Triton stream), only distributed the same.

Upstream's kernels keep what this decision does not model: probabilistic drafting (`draft_sample_method=
"probabilistic"`: q is the draft's distribution, cached by upstream's speculator), block verification,
watermarking, and synthetic acceptance (a benchmarking mode that fakes the decision). `ascend_counts` records which
path each verification took.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

from ascend_specdecode.kernel_bridge import greedy_verify_rows, sampled_verify_rows


class AscendMRV2RejectionSampler(RejectionSampler):
    """MRV2's verifier with the accept/reject decision taken by `ascend_kernels`."""

    @classmethod
    def from_upstream(cls, upstream: RejectionSampler) -> AscendMRV2RejectionSampler:
        """The same verifier state (sampler, speculative settings, watermark key), with our decision."""
        ours = cls.__new__(cls)
        ours.__dict__.update(upstream.__dict__)
        return ours

    @property
    def ascend_counts(self) -> Counter[str]:
        return self.__dict__.setdefault("_ascend_counts", Counter())

    def _all_greedy(self, idx_mapping_np: Any) -> bool:
        # numpy arrays (MRV2's host-side state), used through their own methods: no numpy import needed here
        temperature = self.sampler.sampling_states.temperature.np[idx_mapping_np]
        return bool((temperature == 0.0).all())

    def _verify(
        self,
        logits: torch.Tensor,
        draft_logits: torch.Tensor | None,
        draft_sampled: torch.Tensor,
        pos: torch.Tensor,
        cu_num_logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        idx_mapping_np: Any,
        expanded_idx_mapping: torch.Tensor,
        expanded_local_pos: torch.Tensor,
        seq_lens_upper_bound_np: Any,
        verify_draft_sampled: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._upstream_decides(draft_logits):
            self.ascend_counts["upstream_verifications"] += 1
            return super()._verify(
                logits,
                draft_logits,
                draft_sampled,
                pos,
                cu_num_logits,
                idx_mapping,
                idx_mapping_np,
                expanded_idx_mapping,
                expanded_local_pos,
                seq_lens_upper_bound_np,
                verify_draft_sampled,
            )
        processed: Any = self.sampler.apply_sampling_params(
            logits,
            expanded_idx_mapping,
            idx_mapping,
            idx_mapping_np,
            pos,
            draft_sampled,
            expanded_local_pos,
            seq_lens_upper_bound_np,
        )
        rows = int(cu_num_logits.shape[0] - 1)
        if self._all_greedy(idx_mapping_np):
            sampled, num_sampled = greedy_verify_rows(
                processed, verify_draft_sampled, cu_num_logits, self.num_speculative_steps
            )
            self.ascend_counts["greedy_verifications"] += 1
            self.ascend_counts["greedy_rows"] += rows
            return processed, sampled, num_sampled
        states = self.sampler.sampling_states
        explicit = [bool(s) for s in states.seeds_set[idx_mapping_np]]
        sampled, num_sampled = sampled_verify_rows(
            processed,
            verify_draft_sampled,
            cu_num_logits,
            pos,
            self.num_speculative_steps,
            temperature=torch.from_numpy(states.temperature.np[idx_mapping_np]),
            seeds=torch.from_numpy(states.seeds.np[idx_mapping_np]),
            explicit_seed=explicit,
        )
        self.ascend_counts["sampled_verifications"] += 1
        self.ascend_counts["sampled_rows"] += rows
        self.ascend_counts["seeded_rows"] += sum(explicit)
        return processed, sampled, num_sampled

    def _upstream_decides(self, draft_logits: torch.Tensor | None) -> bool:
        return (
            self.synthetic_conditional_rates is not None
            or draft_logits is not None
            or self.use_block_verification
            or self.watermark_key is not None
        )
