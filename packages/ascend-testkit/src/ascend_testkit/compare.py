"""vLLM's `check_logprobs_close` rule, on the harness's output rows ({token_ids, logprobs: [{token: logprob}]}), and
the stricter greedy comparison of a served completion with one engine's output row."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any


def check_logprobs_close(ours: Sequence[Mapping[str, Any]], theirs: Sequence[Mapping[str, Any]], *,
                         name_0: str = "ours", name_1: str = "reference") -> None:
    """Identical tokens, or at the first divergence each side's token is in the other's top-k logprobs (after
    which the sequences are not compared further), as vLLM's own model tests decide."""
    assert len(ours) == len(theirs), f"{name_0} has {len(ours)} outputs, {name_1} {len(theirs)}"
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for pos, (ta, tb) in enumerate(zip(a["token_ids"], b["token_ids"], strict=False)):
            if ta == tb:
                continue
            top_a, top_b = a["logprobs"][pos], b["logprobs"][pos]
            assert str(ta) in top_b, f"prompt {i} pos {pos}: {name_0} token {ta} not in {name_1} top-k {top_b}"
            assert str(tb) in top_a, f"prompt {i} pos {pos}: {name_1} token {tb} not in {name_0} top-k {top_a}"
            break
        else:
            assert len(a["token_ids"]) == len(b["token_ids"]), f"prompt {i}: lengths differ"


@contextlib.contextmanager
def one_thread():
    """Run a float64 reference on one torch thread: with engine hosts (and other work) on the machine's cores, a
    second OpenMP thread spins at every barrier (a 300-token DeepSeek-V4 forward took ~14 s instead of ~0.6 s)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def greedy_float64(hf, tok, prompts: list[str], max_tokens: int, logprobs: int) -> list[dict]:
    """Greedy generation with a transformers model, recomputing the whole sequence each step (no KV cache to
    differ), in the engine harness's output format (token ids, top-`logprobs` per position), on one thread."""
    import torch

    outputs = []
    with torch.no_grad(), one_thread():
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt").input_ids
            token_ids, tops = [], []
            for _ in range(max_tokens):
                logp = torch.log_softmax(hf(ids, use_cache=False).logits[0, -1], dim=-1)
                top = torch.topk(logp, logprobs)
                nxt = int(top.indices[0])
                token_ids.append(nxt)
                tops.append({str(int(i)): float(v) for i, v in zip(top.indices, top.values, strict=True)})
                ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            outputs.append({"token_ids": token_ids, "logprobs": tops})
    return outputs


def assert_greedy_equals_single(choice, single: dict, max_tokens: int, logprob_tol: float, label) -> float:
    """A greedy completion choice (asked with logprobs=1) holds the single engine's tokens and text, its chosen
    tokens' logprobs within `logprob_tol` of the single engine's; returns the largest logprob difference."""
    assert choice.token_ids == single["token_ids"], label
    assert len(choice.token_ids) == max_tokens, label
    assert choice.text == single["text"], label
    worst = max(abs(ours - step[str(token)]) for ours, step, token in zip(
        choice.logprobs.token_logprobs, single["logprobs"], single["token_ids"], strict=True))
    print(f"{label}: greedy tokens equal, largest logprob difference {worst:.2e}")
    assert worst < logprob_tol, (label, worst)
    return worst
