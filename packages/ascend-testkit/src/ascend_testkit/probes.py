"""Functions the engine harness runs inside every worker (`EngineHost.rpc("ascend_testkit.probes:<name>")`)."""

from __future__ import annotations

from typing import Any


def _name(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def speculative_parts(worker: Any) -> dict[str, str | None]:
    """Class names of the runner, drafter (V1) or speculator (MRV2) and verifier this worker runs."""
    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
    return {"runner": _name(runner), "drafter": _name(drafter),
            "verifier": _name(getattr(runner, "rejection_sampler", None))}


def kv_storages(worker: Any) -> list[list[int]]:
    """The Ascend allocator's registration spans of this worker's KV cache now, as [address, bytes] (what a KV
    connector must have registered); [] when the cache is released (asleep) or not ours (vLLM's CPU platform)."""
    allocation = getattr(worker.model_runner, "ascend_kv", None)
    return [] if allocation is None else [[s.data_ptr, s.nbytes] for s in allocation.storages]


def reload_weights(worker: Any) -> None:
    """Load the checkpoint's weights again in place (what a user does after waking from sleep level 2)."""
    worker.reload_weights()
