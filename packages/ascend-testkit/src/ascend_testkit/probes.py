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
