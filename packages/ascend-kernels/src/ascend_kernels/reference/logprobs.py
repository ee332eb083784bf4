"""Log-probabilities of chosen tokens and the rank of a token (reference), without materialising log_softmax.

Both work in float32 from the row's max and log-sum-exp, as the vLLM kernels they stand in for.
"""

from __future__ import annotations

import torch


def gather_logprobs(logits, token_ids):
    scores = logits.float()
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return scores.gather(-1, token_ids.long()) - lse


def token_ranks(logits, token_ids):
    chosen = logits.gather(-1, token_ids.long()[:, None])
    return (logits >= chosen).sum(dim=-1)
