"""Probes the engine harness runs inside each worker (`EngineHost.rpc("ascend_testkit.pcp_probes:<name>")`): what the
MRV2 runner's PCP manager and graph manager did."""

from __future__ import annotations

from typing import Any


def _name(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def pcp_state(worker: Any) -> dict[str, Any]:
    """This rank's PCP manager: its class, rank, buffer addresses at start-up and now, and its logged step plans."""
    runner = worker.model_runner
    manager = getattr(runner, "pcp_manager", None)
    if manager is None:
        return {"manager": None}
    return {
        "manager": _name(manager),
        "rank": manager.pcp_rank,
        "world": manager.pcp_world_size,
        "initial_addresses": manager.initial_addresses,
        "addresses": manager.buffers.addresses(),
        "runner_reads_its_buffers": manager.input_buffers is manager.buffers,
        "steps": [plan.as_dict() for plan in manager.step_log],
    }


def graph_state(worker: Any) -> dict[str, Any]:
    """This rank's graph manager: its class, the plan it follows and the graphs it holds."""
    manager = getattr(worker.model_runner, "cudagraph_manager", None)
    if manager is None:
        return {"manager": None}
    plan = getattr(manager, "plan", None)
    return {
        "manager": _name(manager),
        "mode": manager.cudagraph_mode.name,
        "plan_sizes": list(plan.capture_sizes) if plan is not None else None,
        "full_graphs": sorted([d.num_tokens, d.num_reqs] for d in manager.graphs),
        "piecewise_wrapper": _name(getattr(manager, "breakable_cg_runner", None)),
    }
