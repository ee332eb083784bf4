"""The model runner V2 state for DeepSeek V4.1: the default state plus the engram's lookback window.

MRV2 asks the model for its state class (`get_model_state_cls`). vLLM's V4.1 one gathers the window with a Triton
kernel and adds CUDA-graph/SWA-replay machinery; ours only gathers, per scheduled request, the `depth` token ids
before its chunk from the runner's on-device token history (exact for prompt and generated tokens alike) into
`lookback_token_ids` (column j = position start - 1 - j, -1 before position 0).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker.gpu.model_states.default import DefaultModelState

from ascend_platform import usage


class AscendDeepseekV41ModelState(DefaultModelState):
    def __init__(self, vllm_config: Any, model: torch.nn.Module, encoder_cache: Any, device: torch.device) -> None:
        super().__init__(vllm_config, model, encoder_cache, device)
        depth = int(getattr(model, "token_lookback_depth", 0))
        self.lookback_token_ids: torch.Tensor | None = None
        if depth > 0:
            self.lookback_token_ids = torch.full((self.max_num_reqs, depth), -1, dtype=torch.int32, device=device)

    def prepare_inputs(self, input_batch: Any, req_states: Any) -> dict[str, Any]:
        model_inputs = super().prepare_inputs(input_batch, req_states)
        window = self.lookback_token_ids
        if window is None:
            return model_inputs
        num_reqs = input_batch.idx_mapping.shape[0]
        depth = window.shape[1]
        window.fill_(-1)
        if num_reqs:
            req = input_batch.idx_mapping.to(torch.long)
            start = req_states.num_computed_tokens.gpu[req].to(torch.long)
            pos = start[:, None] - 1 - torch.arange(depth, device=window.device)[None, :]
            history = req_states.all_token_ids.gpu
            ids = history[req[:, None], pos.clamp(min=0)]
            window[:num_reqs] = torch.where(pos >= 0, ids, torch.full_like(ids, -1)).to(window.dtype)
        usage.count("dsv41.lookback_windows")
        model_inputs["lookback_token_ids"] = window
        return model_inputs

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, Any]:
        model_inputs = super().prepare_dummy_inputs(num_reqs, num_tokens)
        if self.lookback_token_ids is not None:
            self.lookback_token_ids.fill_(-1)
            model_inputs["lookback_token_ids"] = self.lookback_token_ids
        return model_inputs
