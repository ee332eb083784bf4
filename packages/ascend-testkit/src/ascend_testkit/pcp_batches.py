"""A scheduled step's global `InputBatch`, laid out as MRV2's `prepare_inputs` lays it out, from plain counts.

The PCP manager takes the runner's global batch; code that drives the manager without a scheduler (the two-process
attention check `ascend_testkit.cp_step_driver`, unit tests) builds that batch here from each request's computed and
scheduled token counts, in the given input buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers


def step_input_batch(
    input_buffers: InputBuffers,
    scheduled: Sequence[int],
    computed: Sequence[int] | None = None,
    prompt_lens: Sequence[int] | None = None,
    token_ids: torch.Tensor | None = None,
) -> InputBatch:
    """Global batch of one step: request i computes `scheduled[i]` new tokens after `computed[i]` done ones.

    A request is prefilling while its computed tokens are below its prompt length (`prompt_lens`, default: the
    step finishes the prompt, i.e. every request prefills).
    """
    num_reqs = len(scheduled)
    computed = list(computed) if computed is not None else [0] * num_reqs
    if prompt_lens is None:
        prompt_lens = [c + s for c, s in zip(computed, scheduled, strict=True)]
    prompts = list(prompt_lens)
    if not (len(computed) == len(prompts) == num_reqs) or num_reqs == 0:
        raise ValueError(f"need one computed and prompt length per request, got {computed}, {prompts} for {scheduled}")
    sched = np.asarray(scheduled, dtype=np.int32)
    comp = np.asarray(computed, dtype=np.int32)
    prompt = np.asarray(prompts, dtype=np.int32)
    num_tokens = int(sched.sum())
    if num_tokens > input_buffers.max_num_tokens or num_reqs > input_buffers.max_num_reqs:
        raise ValueError(
            f"step of {num_reqs} requests / {num_tokens} tokens exceeds buffers of "
            f"{input_buffers.max_num_reqs} / {input_buffers.max_num_tokens}"
        )
    dummy = InputBatch.make_dummy(num_reqs, num_tokens, input_buffers, is_padding=False)
    device = input_buffers.device

    qsl_np = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(sched, out=qsl_np[1:])
    positions = np.concatenate([np.arange(c, c + s, dtype=np.int64) for c, s in zip(comp, sched, strict=True)])
    input_buffers.positions[:num_tokens].copy_(torch.from_numpy(positions))
    if token_ids is not None:
        input_buffers.input_ids[:num_tokens].copy_(token_ids[:num_tokens])
    input_buffers.query_start_loc[: num_reqs + 1].copy_(torch.from_numpy(qsl_np))
    input_buffers.query_start_loc[num_reqs + 1 :] = num_tokens
    seq_lens = comp + sched
    input_buffers.seq_lens[:num_reqs].copy_(torch.from_numpy(seq_lens))
    is_prefilling = comp < prompt
    query_start_loc = input_buffers.query_start_loc[: num_reqs + 1]
    return dataclasses.replace(
        dummy,
        num_scheduled_tokens=sched,
        query_start_loc_np=qsl_np,
        query_start_loc=query_start_loc,
        seq_lens=input_buffers.seq_lens[:num_reqs],
        seq_lens_cpu_upper_bound=torch.from_numpy(seq_lens.astype(np.int32)),
        num_computed_tokens_np=comp,
        prefill_len_np=prompt,
        num_computed_prefill_tokens_np=np.minimum(comp, prompt),
        is_prefilling_np=is_prefilling,
        has_prefill=bool(is_prefilling.any()),
        decode_graph_eligible=not bool(is_prefilling.any()),
        logits_indices=query_start_loc[1:] - 1,
        cu_num_logits=torch.arange(num_reqs + 1, dtype=torch.int32, device=device),
        cu_num_logits_np=np.arange(num_reqs + 1, dtype=np.int32),
    )
