"""Adapter for the logits processor's `skip_gather` (batch-sharded sampling, vLLM 50465; absent in the release lane).

On the current lane Model Runner V2's batch-sharded sampling asks the model for vocab-parallel *local* logits
(`compute_logits_local` -> `LogitsProcessor(..., skip_gather=True)`) and exchanges them itself; the release lane
never passes the argument. `logits_forward_kwargs` is what an override hands back to the upstream forward.
"""

from __future__ import annotations

from ascend_core.upstream.lane import capabilities


def logits_skip_gather_supported() -> bool:
    """Whether the installed vLLM's `LogitsProcessor.forward` takes `skip_gather` (probed by signature)."""
    return capabilities().logits_skip_gather


def logits_forward_kwargs(skip_gather: bool) -> dict[str, bool]:
    """Keywords for upstream `LogitsProcessor.forward`: `skip_gather` where it exists; asking to skip the gather
    where it does not is an error (nothing in that lane can consume vocab-parallel logits)."""
    if logits_skip_gather_supported():
        return {"skip_gather": skip_gather}
    if skip_gather:
        raise TypeError("this vLLM's LogitsProcessor has no skip_gather (batch-sharded sampling needs vLLM >= 0.29)")
    return {}
