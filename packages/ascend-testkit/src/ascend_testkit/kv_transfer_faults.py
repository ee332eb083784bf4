"""Fault injection in a P2P KV consumer (`EngineHost.rpc("ascend_testkit.kv_transfer_faults:<name>", ...)`): pulls
that leave chosen layers behind, so a test can show the decode engine's output depends on what those layers carry.

Runs in the engine's worker process, where the connector's agent plans its reads: the agent builds its read entries
through `ascend_kv_transfer.p2p.plan.build_entries`, which this wraps.
"""

from __future__ import annotations

import re
from typing import Any

_ORIGINAL = "_ascend_testkit_original_build_entries"


def skip_layers_in_pulls(worker: Any, patterns: list[str]) -> list[str]:
    """From now on, pulls read no layer whose whole name matches one of the regular expressions `patterns` (empty:
    read every layer again); returns this worker's KV layers that match, so a test can check it hit what it meant."""
    from ascend_kv_transfer.p2p import plan

    original = getattr(plan, _ORIGINAL, plan.build_entries)
    setattr(plan, _ORIGINAL, original)

    def skip(name: str) -> bool:
        return any(re.fullmatch(p, name) for p in patterns)

    def build_entries(pairs, runs):
        return original([(mine, theirs) for mine, theirs in pairs if not skip(mine.name)], runs)

    plan.build_entries = build_entries if patterns else original
    layers = [n for g in worker.model_runner.kv_cache_config.kv_cache_groups for n in g.layer_names]
    return [n for n in layers if skip(n)] if patterns else []
