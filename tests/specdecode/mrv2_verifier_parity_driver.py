"""Greedy verification in Model Runner V2's layout: vLLM's `rejection_sample` (Triton kernels in the interpreter) and
`kernel_bridge.greedy_verify_rows` (`ascend_kernels`) on the same random batches; prints one JSON line
{case: {"tokens": mismatching entries within each request's count, "counts": mismatching requests}}.

A script (vLLM picks its platform once per process): run with ASCEND_VLLM_SIMULATE=1 and TRITON_INTERPRET=1.
"""

from __future__ import annotations

import json
import sys

import torch

VOCAB, K, MAX_REQS = 50, 3, 8


def batch(seed: int, num_reqs: int, placeholder_rate: float, accept_rate: float) -> dict:
    """Requests with 0..K drafts (0: a prefill row), drafts copied from the target's argmax at `accept_rate`."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, K + 2, (num_reqs,), generator=g)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(counts, 0)
    n = int(cu[-1])
    logits = torch.randn(n, VOCAB, generator=g) * 3
    argmax = logits.argmax(-1)
    tokens = torch.randint(0, VOCAB, (n,), generator=g)
    for r in range(num_reqs):
        for i in range(int(counts[r]) - 1):  # draft i is the input token of row start + i + 1
            row = int(cu[r]) + i
            if float(torch.rand((), generator=g)) < accept_rate:
                tokens[row + 1] = argmax[row]
            if float(torch.rand((), generator=g)) < placeholder_rate:
                tokens[row + 1] = -1
    idx = torch.randperm(MAX_REQS, generator=g)[:num_reqs].to(torch.int64)
    return {"logits": logits, "tokens": tokens.to(torch.int32), "cu": cu, "idx": idx, "counts": counts}


def upstream(b: dict):
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample

    n = b["logits"].shape[0]
    expanded = torch.repeat_interleave(b["idx"], b["counts"])
    local = torch.cat([torch.arange(int(c)) for c in b["counts"]]).to(torch.int32)
    temperature = torch.zeros(MAX_REQS)
    seeds = torch.arange(MAX_REQS, dtype=torch.int64)
    return rejection_sample(b["logits"], None, b["tokens"], b["cu"], torch.arange(n, dtype=torch.int64), b["idx"],
                            expanded, local, temperature, seeds, K)


def ours(b: dict):
    from ascend_specdecode.kernel_bridge import greedy_verify_rows

    return greedy_verify_rows(b["logits"], b["tokens"], b["cu"], K)


def main() -> int:
    from vllm.platforms import current_platform  # resolves the simulated platform: Triton's interpreter goes on

    assert type(current_platform).__name__ == "SimulatedNPUPlatform", type(current_platform)
    cases = {"mostly_accepted": (1, 6, 0.0, 0.9), "mostly_rejected": (2, 6, 0.0, 0.1),
             "placeholders": (3, 8, 0.3, 0.8), "one_request": (4, 1, 0.0, 1.0), "mixed": (5, 7, 0.1, 0.5)}
    report = {}
    for name, args in cases.items():
        b = batch(*args)
        (up_tokens, up_counts), (our_tokens, our_counts) = upstream(b), ours(b)
        count_diff = int((up_counts.long() != our_counts.long()).sum())
        token_diff = sum(int((up_tokens[r, :c] != our_tokens[r, :c]).sum())
                         for r, c in enumerate(up_counts.tolist()))
        report[name] = {"counts": count_diff, "tokens": token_diff, "requests": len(up_counts),
                        "accepted_drafts": int(up_counts.sum()) - len(up_counts)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
