"""The Model Runner V2 verifier: greedy decisions through `ascend_kernels` follow the naive rule, and the sampler
hands sampled batches back to upstream (parity with vLLM's own kernels, which needs the platform: tests/specdecode)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ascend_specdecode.kernel_bridge import greedy_verify_rows


def naive(logits, tokens, cu):
    out = []
    for r in range(len(cu) - 1):
        start, end = int(cu[r]), int(cu[r + 1])
        row = []
        for i in range(end - start - 1):
            target = int(logits[start + i].argmax())
            draft = int(tokens[start + i + 1])
            row.append(draft if draft == target else target)
            if draft != target:
                break
        else:
            row.append(int(logits[end - 1].argmax()))
        out.append(row)
    return out


def test_greedy_rows_accept_the_argmax_prefix_then_the_target_token():
    logits = torch.zeros(7, 10)
    # request 0: 3 drafts (rows 0-2) + bonus row 3; request 1: prefill row 4; request 2: 1 draft (row 5) + bonus 6
    for row, best in enumerate([4, 5, 6, 7, 8, 1, 2]):
        logits[row, best] = 1.0
    # request 0 rejects draft 2; request 2's draft is a placeholder
    tokens = torch.tensor([0, 4, 5, 9, 0, 0, -1], dtype=torch.int32)
    cu = torch.tensor([0, 4, 5, 7])
    sampled, counts = greedy_verify_rows(logits, tokens, cu, 3)
    got = [sampled[r, :c].tolist() for r, c in enumerate(counts.tolist())]
    assert got == naive(logits, tokens, cu) == [[4, 5, 6], [8], [1]]
    assert counts.dtype == torch.int32 and sampled.dtype == torch.int64


def test_random_batches_match_the_naive_rule():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        counts = torch.randint(1, 5, (6,), generator=g)
        cu = torch.zeros(7, dtype=torch.int64)
        cu[1:] = torch.cumsum(counts, 0)
        logits = torch.randn(int(cu[-1]), 30, generator=g)
        tokens = torch.where(
            torch.rand(int(cu[-1]), generator=g) < 0.6,
            torch.roll(logits.argmax(-1), 1),
            torch.randint(0, 30, (int(cu[-1]),), generator=g),
        )
        sampled, num = greedy_verify_rows(logits, tokens, cu, 3)
        assert [sampled[r, :c].tolist() for r, c in enumerate(num.tolist())] == naive(logits, tokens, cu)


class _Upstream:
    """Stands in for vLLM's verifier state: the sampler's temperatures and seeds and the speculative settings."""

    def __init__(self, temperatures):
        n = len(temperatures)
        states = SimpleNamespace(
            temperature=SimpleNamespace(np=np.array(temperatures, dtype=np.float32)),
            seeds=SimpleNamespace(np=np.arange(n, dtype=np.int64) + 11),
            seeds_set=np.array([True] + [False] * (n - 1)),
        )
        self.sampler = SimpleNamespace(sampling_states=states, apply_sampling_params=lambda logits, *a: logits)
        self.num_speculative_steps = 3
        self.synthetic_conditional_rates = None
        self.use_block_verification = False
        self.watermark_key = None


@pytest.mark.parametrize(
    ("temperatures", "draft_logits", "path"),
    [
        ([0.0, 0.0], None, "greedy_verifications"),
        ([0.0, 0.7], None, "sampled_verifications"),
        ([0.0, 0.7], torch.zeros(2, 3, 4), "upstream_verifications"),
    ],
)
def test_verification_paths(monkeypatch, temperatures, draft_logits, path):
    """Greedy and sampled batches are decided by `ascend_kernels`; probabilistic drafts (a draft distribution
    q) stay on upstream's kernels."""
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    from ascend_specdecode.mrv2_verification import AscendMRV2RejectionSampler

    verifier = AscendMRV2RejectionSampler.from_upstream(_Upstream(temperatures))  # type: ignore[arg-type]
    monkeypatch.setattr(RejectionSampler, "_verify", lambda self, *a: ("upstream", None, None))
    logits = torch.eye(4) * 50  # each row is (as good as) one-hot: sampling it gives its argmax
    cu = torch.tensor([0, 2, 4])
    tokens = torch.tensor([0, 0, 0, 2], dtype=torch.int32)
    pos = torch.tensor([5, 6, 9, 10])
    result = verifier._verify(logits, draft_logits, tokens, pos, cu, None, np.array([0, 1]), None, None, None, tokens)
    assert verifier.ascend_counts[path] == 1
    if path != "upstream_verifications":
        assert result[2].tolist() == [2, 2]  # each request accepts its draft (the row's argmax) plus a bonus
        assert result[1][:, :2].tolist() == [[0, 1], [2, 3]]
    if path == "sampled_verifications":
        assert verifier.ascend_counts["seeded_rows"] == 1
