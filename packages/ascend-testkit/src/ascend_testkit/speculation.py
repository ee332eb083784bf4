"""Run one speculative-decoding engine over a fixed greedy workload on an engine host and report what it did.

Used by the engine tests and `benchmarks/specdecode.py`: generated token ids, the acceptance report read from vLLM's
spec-decode metrics, target forward passes (vLLM's `iteration_tokens_total` histogram: one observation per engine
step, and every step runs the target once), the generation's wall time, and the classes the worker ran. Requests go
one at a time by default, so passes per generated token is a per-request figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ascend_testkit.engine import EngineHost


def measure(host: EngineHost, model: str, spec: Mapping[str, Any] | None, prompts: Sequence[str], max_tokens: int,
            *, sequential: bool = True, **engine: Any) -> dict[str, Any]:
    host.start(model, speculative_config=dict(spec) if spec else None, disable_log_stats=False, **engine)
    try:
        host.generate(prompts[:1], max_tokens=4, ignore_eos=True)  # warm-up
        host.metrics_mark()
        gen = host.generate(prompts, max_tokens=max_tokens, ignore_eos=True, sequential=sequential)
        token_ids = [o["token_ids"] for o in gen["outputs"]]
        return {
            "token_ids": token_ids,
            "acceptance": host.acceptance(spec["num_speculative_tokens"]) if spec else None,
            "target_passes": host.engine_steps(),
            "generated_tokens": sum(len(t) for t in token_ids),
            "seconds": gen["seconds"],
            "parts": host.rpc("ascend_testkit.probes:speculative_parts")[0],
        }
    finally:
        host.stop()
