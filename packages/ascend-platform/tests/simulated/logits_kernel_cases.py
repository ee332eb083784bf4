"""Parity cases for MRV2's logits-processor and logprob kernels (logit bias / allowed tokens / min tokens, bad words,
prompt logprobs, explicit logprob token ids), imported by `kernel_parity_driver.py` (each `case_*` runs there twice:
vLLM's kernel in Triton's interpreter, then our stand-in through vLLM's dispatcher)."""

from __future__ import annotations

import torch

VOCAB, MAX_REQS = 300, 8


def _bias_inputs(g, rows: int):
    """Eight requests' logit-bias state: allowed ids for 1 and 5, biases for 2, 5 and 6, stop tokens for 3, 5, 6."""
    idx = torch.tensor([1, 2, 3, 3, 5, 6, 0][:rows])
    logits = torch.randn(rows, VOCAB, generator=g) * 2
    pos = torch.randint(0, 20, (rows,), generator=g)
    width = 16
    num_allowed = torch.zeros(MAX_REQS, dtype=torch.int32)
    allowed = torch.randint(0, VOCAB, (MAX_REQS, width), generator=g, dtype=torch.int32)  # stale past the counts
    num_allowed[1], num_allowed[5] = 4, 6
    num_bias = torch.zeros(MAX_REQS, dtype=torch.int32)
    bias_ids = torch.randint(0, VOCAB, (MAX_REQS, width), generator=g, dtype=torch.int32)
    bias = torch.randn(MAX_REQS, width, generator=g) * 5
    num_bias[2], num_bias[5], num_bias[6] = 3, 2, 5
    bias_ids[5, :2] = allowed[5, :2]  # bias on allowed tokens: both apply
    num_stop = torch.zeros(MAX_REQS, dtype=torch.int32)
    stop = torch.randint(0, VOCAB, (MAX_REQS, 8), generator=g, dtype=torch.int32)
    num_stop[3], num_stop[5], num_stop[6] = 2, 3, 1
    min_lens = torch.full((MAX_REQS,), 10, dtype=torch.int32)
    pos[2], pos[3] = 3, 12  # request 3: one row under min_tokens, one past it
    restore = torch.zeros(MAX_REQS, dtype=torch.int32)
    return logits, idx, pos, num_allowed, allowed, num_bias, bias_ids, bias, min_lens, num_stop, restore, stop


def case_logit_bias(g):
    from vllm.v1.worker.gpu.sample.logit_bias import apply_logit_bias

    args = _bias_inputs(g, 7)
    apply_logit_bias(*args, False)
    return {"logits": args[0]}


def case_logit_bias_restore_all_masked(g):
    """Structured-output requests under min_tokens: a row whose only tokens left are stop tokens gets them back
    (request 5: its allowed ids are its stop ids), a row with other tokens left does not (request 6), and a request
    without the restore flag stays all -inf (request 1)."""
    from vllm.v1.worker.gpu.sample.logit_bias import apply_logit_bias

    logits, idx, pos, num_allowed, allowed, num_bias, bias_ids, bias, min_lens, num_stop, restore, stop = \
        _bias_inputs(g, 7)
    idx = torch.tensor([1, 2, 3, 5, 5, 6, 0])
    pos[:] = 2
    stop[5, :3] = allowed[5, :3]
    num_allowed[5] = 3
    num_stop[1] = 4
    stop[1, :4] = allowed[1, :4]
    restore[5] = restore[6] = 1
    logits[4, int(allowed[5, 1])] = float("-inf")  # an allowed stop token already -inf stays so
    apply_logit_bias(logits, idx, pos, num_allowed, allowed, num_bias, bias_ids, bias, min_lens, num_stop, restore,
                     stop, True)
    return {"logits": logits}


def case_bad_words(g):
    """Bad words of one, two and three tokens; request 4 verifies two drafts (rows 2-4: local positions 0-2), so
    its words may end in the drafts read from input_ids."""
    from vllm.v1.worker.gpu.sample.bad_words import apply_bad_words

    idx = torch.tensor([1, 4, 4, 4, 6, 0])
    local = torch.tensor([0, 0, 1, 2, 0, 0], dtype=torch.int32)
    rows = idx.shape[0]
    logits = torch.randn(rows, VOCAB, generator=g)
    max_len = 64
    history = torch.randint(0, VOCAB, (MAX_REQS, max_len), generator=g, dtype=torch.int32)
    prompt_len = torch.randint(3, 10, (MAX_REQS,), generator=g, dtype=torch.int32)
    total_len = prompt_len + torch.tensor([0, 6, 0, 0, 4, 0, 1, 0], dtype=torch.int32)
    input_ids = torch.randint(0, VOCAB, (rows,), generator=g, dtype=torch.int32)
    words = {1: [[7], [11, 12], [20, 21, 22]], 4: [[30, 31], [40, 41, 42], [41, 50, 99], [60]],
             6: [[70, 71, 72]]}
    # Request 1's output ends in 11, 20, 21: ban 7 (one token: always) and 22, not 12. Request 4's ends in 30, 40 and
    # it drafted 41, 50: its row 2 bans 42 (prefix across output and draft), row 3 bans 99 (prefix all drafts), every
    # row bans 60. Request 6 has one output token: its three-token word cannot match yet.
    p1, p4, p6 = int(prompt_len[1]), int(prompt_len[4]), int(prompt_len[6])
    history[1, p1 + 3 : p1 + 6] = torch.tensor([11, 20, 21], dtype=torch.int32)
    history[4, p4 + 2 : p4 + 4] = torch.tensor([30, 40], dtype=torch.int32)
    input_ids[2:4] = torch.tensor([41, 50], dtype=torch.int32)
    history[6, p6] = 70
    tokens = torch.zeros(MAX_REQS, 32, dtype=torch.int32)
    offsets = torch.zeros(MAX_REQS, 9, dtype=torch.int32)
    num_words = torch.zeros(MAX_REQS, dtype=torch.int32)
    for req, ws in words.items():
        flat_words = [t for w in ws for t in w]
        tokens[req, : len(flat_words)] = torch.tensor(flat_words, dtype=torch.int32)
        offsets[req, : len(ws) + 1] = torch.tensor([0, *torch.tensor([len(w) for w in ws]).cumsum(0).tolist()],
                                                   dtype=torch.int32)
        num_words[req] = len(ws)
    apply_bad_words(logits, idx, tokens, offsets, num_words, history, prompt_len, total_len, input_ids, local,
                    int(num_words.max()))
    return {"logits": logits}


def case_prompt_logprobs_token_ids(g):
    from vllm.v1.worker.gpu.sample.prompt_logprob import get_prompt_logprobs_token_ids

    idx = torch.tensor([3, 0, 6])
    qsl = torch.tensor([0, 5, 6, 14, 14], dtype=torch.int32)  # a padded tail entry past the batch
    computed = torch.randint(0, 30, (MAX_REQS,), generator=g, dtype=torch.int32)
    history = torch.randint(0, VOCAB, (MAX_REQS, 64), generator=g, dtype=torch.int32)
    return {"token_ids": get_prompt_logprobs_token_ids(14, qsl, idx, computed, history)}


def _logprob_token_ids(g, num_logprobs: int):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu.sample.logprob import LogprobTokenIdsState, compute_topk_scores

    state = LogprobTokenIdsState(MAX_REQS, torch.device("cpu"))
    state.add_request(2, SamplingParams(logprob_token_ids=[5, 9, 200]))
    state.add_request(6, SamplingParams(logprob_token_ids=[17]))
    state.add_request(1, SamplingParams())
    state.apply_staged_writes()
    logits = torch.randn(5, VOCAB, generator=g) * 2
    idx = torch.tensor([2, 1, 6, 2, 1])
    sampled = torch.randint(0, VOCAB, (5,), generator=g)
    scores = compute_topk_scores(logits, num_logprobs, sampled, None, state, idx, 3)
    return {"token_ids": scores.logprob_token_ids, "logprobs": scores.logprobs, "ranks": scores.selected_token_ranks}


def case_logprob_token_ids(g):
    return _logprob_token_ids(g, 2)


def case_logprob_token_ids_without_topk(g):
    return _logprob_token_ids(g, 0)
