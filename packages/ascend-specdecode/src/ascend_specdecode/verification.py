"""Draft verification through the `ascend_kernels` rejection sampler, for vLLM's V1 model runner.

The upstream samplers stay in charge of everything around verification (logits processors, penalties, bonus tokens,
logprobs). The accept/reject decision moves to `ascend_kernels.ops.rejection_sample`, the op that has an NPU kernel
on Ascend and a pure-torch reference elsewhere: that decision is what makes speculation lossless, so it is the part
the Ascend build must own. The sampling constraints on the target rows (temperature, then top-k/top-p through
`ascend_kernels.ops.top_k_top_p`) are applied here too (`apply_sampling_constraints` says why).

Model Runner V2's verifier is `mrv2_verification`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample import rejection_sampler as v1_rs

from ascend_specdecode.kernel_bridge import greedy_verify, verify

logger = init_logger(__name__)


def apply_sampling_constraints(
    logits: torch.Tensor, num_draft_tokens: list[int], sampling_metadata: Any
) -> torch.Tensor:
    """Upstream's `apply_sampling_constraints` (temperature in place, then top-k / top-p) with each request's values
    repeated over its draft rows by torch and the filter taken by `ascend_kernels.ops.top_k_top_p`.

    Upstream expands the per-request values with its `expand_kernel`, whose C++ fallback on vLLM's CPU build (0.32:
    `cpu_triton_utils._expand_kernel_impl`) writes into an int64 copy of a float output: the temperatures it hands
    back are uninitialised memory, and sampled speculation on that build draws from garbage (tokens collapse to id
    0). Nothing here depends on Triton or its fallbacks.
    """
    if sampling_metadata.all_greedy:
        return logits
    from ascend_kernels.ops import top_k_top_p

    counts = torch.tensor(num_draft_tokens, device=logits.device)
    temperature = sampling_metadata.temperature
    temperature = torch.where(temperature == v1_rs.GREEDY_TEMPERATURE, 1.0, temperature)  # greedy rows: unscaled
    logits.div_(temperature.repeat_interleave(counts, output_size=logits.shape[0]).unsqueeze(-1).to(logits.dtype))
    top_k, top_p = sampling_metadata.top_k, sampling_metadata.top_p
    if top_k is None and top_p is None:
        return logits
    return top_k_top_p(
        logits,
        None if top_k is None else top_k.repeat_interleave(counts, output_size=logits.shape[0]),
        None if top_p is None else top_p.repeat_interleave(counts, output_size=logits.shape[0]),
    )


class AscendRejectionSampler(v1_rs.RejectionSampler):
    """The V1 rejection sampler with the accept/reject step done by `ascend_kernels`."""

    @classmethod
    def from_upstream(cls, upstream: v1_rs.RejectionSampler, spec_config: Any, device: Any) -> AscendRejectionSampler:
        return cls(upstream.sampler, spec_config, device)

    @property
    def ascend_counts(self) -> Counter[str]:
        """Which path each verification took: ``greedy_verifications`` / ``sampled_verifications`` (the
        `ascend_kernels` decision; ``seeded_rows`` counts requests verified with their own generator) or
        ``upstream_verifications`` (synthetic mode)."""
        return self.__dict__.setdefault("_ascend_counts", Counter())

    def forward(
        self,
        metadata: Any,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        sampling_metadata: Any,
    ) -> SamplerOutput:
        # Mirrors upstream RejectionSampler.forward (vLLM 0.32) up to the verification call.
        assert metadata.max_spec_len <= v1_rs.MAX_SPEC_LEN
        bonus_logits = logits[metadata.bonus_logits_indices]
        bonus_sampler_output = self.sampler(
            logits=bonus_logits,
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override="processed_logits" if self.is_processed_logprobs_mode else "raw_logits",
        )
        bonus_token_ids = bonus_sampler_output.sampled_token_ids
        raw_target_logits = logits[metadata.target_logits_indices].to(torch.float32)
        target_logits = raw_target_logits
        if not self.is_processed_logprobs_mode:
            target_logits = target_logits.clone()
        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)
        target_logits = apply_sampling_constraints(target_logits, metadata.num_draft_tokens, sampling_metadata)

        output_token_ids = self.verify(
            metadata.draft_token_ids,
            metadata.num_draft_tokens,
            metadata.max_spec_len,
            metadata.cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            sampling_metadata,
        )

        logprobs_tensors = None
        if sampling_metadata.max_num_logprobs is not None:
            logprobs_tensors = self._get_logprobs_tensors(
                sampling_metadata.max_num_logprobs,
                metadata,
                logits,
                target_logits if self.is_processed_logprobs_mode else raw_target_logits,
                bonus_sampler_output.logprobs_tensors.logprobs,
                output_token_ids,
            )
        return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)

    def verify(
        self,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: list[int],
        max_spec_len: int,
        cu_num_draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_logits: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        sampling_metadata: Any,
    ) -> torch.Tensor:
        """``[batch, max_spec_len + 1]`` output tokens, -1 after the first rejection (upstream's layout).

        The decision is `ascend_kernels`'s for every row except in the synthetic benchmarking mode, which fakes the
        decision and stays on upstream's path. A request with its own seed (`sampling_metadata.generators`) draws
        its acceptance and recovery noise from its own generator in a kernel call of its own, so its tokens repeat
        whatever else is in the batch (they are not upstream's tokens for that seed: the draws differ, their
        distribution does not).
        """
        if self.synthetic_mode:
            self.ascend_counts["upstream_verifications"] += 1
            return v1_rs.rejection_sample(
                draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
                bonus_token_ids, sampling_metadata, synthetic_mode=self.synthetic_mode,
                synthetic_conditional_rates=self.synthetic_conditional_rates, use_fp64_gumbel=self.use_fp64_gumbel,
            )  # fmt: skip
        if sampling_metadata.all_greedy:
            self.ascend_counts["greedy_verifications"] += 1
            return greedy_verify(draft_token_ids, target_logits, cu_num_draft_tokens, bonus_token_ids, max_spec_len)
        # Upstream already applied temperature, top-k and top-p to target_logits: softmax gives the final p.
        probs = target_logits.softmax(dim=-1, dtype=torch.float32)
        self.ascend_counts["sampled_verifications"] += 1
        self.ascend_counts["seeded_rows"] += len(sampling_metadata.generators)
        return verify(
            draft_token_ids,
            cu_num_draft_tokens,
            max_spec_len,
            draft_probs,
            probs,
            bonus_token_ids,
            temperature=sampling_metadata.temperature,
            target_is_probs=True,
            generators=sampling_metadata.generators,
        )
