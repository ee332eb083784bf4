"""Prefill context parallel (PCP) for Ascend's MRV2 runner.

API for the runner (wiring: return `AscendPCPManager` from the runner's `pcp_manager_cls`, or build it directly):

* `AscendPCPManager(pcp_world_size, pcp_rank, device, shard_decode_requests=False, max_num_reqs=..,
  max_num_tokens=.., block_tables=None, *, max_num_blocks_per_group=None)`: vLLM's `PCPManager` on persistent
  `PCPInputBuffers` (`manager.buffers`). Per step: `num_tokens_for_dispatch(num_scheduled, is_prefilling)` (plan
  the graph descriptor for it), then `partition_batch(global_batch, batch_desc)` -> this rank's local `InputBatch`
  padded to the descriptor but never below its real tokens (`manager.last_plan` says what happened; a too-small
  descriptor becomes eager at the real count, see `effective_descriptor`). After the forward,
  `restore_for_sampling(hidden, aux)` all-gathers over vLLM's PCP group and returns the global batch.
  Capture: `stage_capture_batch(num_tokens, num_reqs)` / `prepare_inputs_to_capture`, `get_dummy_block_tables`,
  `get_dummy_slot_mappings`, all views of the persistent buffers.
* `validate_pcp_config(vllm_config, supports_mm_inputs)`: `PCPConfigError` naming each conflict (DCP, pipeline
  parallel, encoder-decoder, multimodal, LoRA, FULL graphs for prefills).
* `partition`: the head-and-tail split as plain numbers; `layout`: where each prefill chunk finds its keys in the
  all-gathered K/V (`manager.attention_layout`, per step); `attention`: the K/V all-gather into every rank's cache
  replica and chunk attention (cached context + gathered step keys, merged by log-sum-exp through `ascend_kernels`),
  which `AscendAttentionImpl` runs.
"""

from ascend_platform.pcp.buffers import PCPInputBuffers
from ascend_platform.pcp.manager import AscendPCPManager, CaptureInputs, PCPStepPlan
from ascend_platform.pcp.partition import head_tail_chunks, local_tokens_after_padding, rank_token_counts
from ascend_platform.pcp.validation import PCPConfigError, pcp_conflicts, validate_pcp_config

__all__ = [
    "AscendPCPManager",
    "CaptureInputs",
    "PCPConfigError",
    "PCPInputBuffers",
    "PCPStepPlan",
    "head_tail_chunks",
    "local_tokens_after_padding",
    "pcp_conflicts",
    "rank_token_counts",
    "validate_pcp_config",
]
