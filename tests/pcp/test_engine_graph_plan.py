"""The PCP=2 engine follows `GraphCapturePlan`: the planned sizes are captured, uniform decodes replay FULL graphs,
mixed batches PIECEWISE ones, batches past the largest capture size run eagerly, and both ranks decide alike.

In the simulated lane the graphs run eagerly and record what a device would capture and replay (FULL: the captured
forward re-run over the persistent buffers; PIECEWISE: the platform's static-graph wrapper, which refuses a replay
whose inputs moved). The tokens these steps produce equal the eager PCP=1 engine's (test_engine_pcp.py).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine


def _graph_counts(usage: dict) -> dict[str, int]:
    return {k: v for k, v in usage["counts"].items() if k.startswith("graph.")}


def test_the_planned_graphs_are_captured(pcp_runs, pcp_settings):
    sizes, max_seqs = pcp_settings["capture_sizes"], pcp_settings["max_num_seqs"]
    full = [s for s in sizes if s <= max_seqs]  # a FULL decode graph holds at most max_num_seqs requests
    for usage, state in zip(pcp_runs["pcp2"]["usage"], pcp_runs["pcp2"]["graph"], strict=True):
        assert state["manager"] == "ascend_platform.graph.manager.AscendGraphManager"
        assert state["mode"] == "FULL_AND_PIECEWISE" and state["plan_sizes"] == sizes
        assert state["full_graphs"] == [[s, s] for s in full]
        assert state["piecewise_wrapper"] == "ascend_platform.graph.wrapper.SimulatedGraphWrapper"
        captured = {k for k in usage["counts"] if k.startswith("graph.capture.")}
        assert captured == {f"graph.capture.PIECEWISE.{s}" for s in sizes} | {f"graph.capture.FULL.{s}" for s in full}
        assert all(usage["counts"][k] == 1 for k in captured)


def test_modes_per_batch_kind_and_eager_past_the_largest(pcp_runs, pcp_settings):
    for usage in pcp_runs["pcp2"]["usage"]:
        counts = _graph_counts(usage)
        dispatched = {k for k in counts if k.startswith("graph.dispatch.")}
        # FULL only for uniform decodes; mixed batches PIECEWISE, or eager when past the largest size.
        assert dispatched <= {"graph.dispatch.uniform_decode.FULL", "graph.dispatch.mixed.PIECEWISE",
                              "graph.dispatch.mixed.NONE"}, dispatched
        assert counts["graph.dispatch.uniform_decode.FULL"] > 0 and counts["graph.dispatch.mixed.PIECEWISE"] > 0
        assert counts["graph.dispatch.mixed.NONE"] == counts["graph.eager_past_largest.mixed"] > 0
        # Every replay was of a captured graph, and every graph dispatch replayed one.
        replays = {k: v for k, v in counts.items() if k.startswith("graph.replay.")}
        assert {k.replace("replay", "capture") for k in replays} <= set(counts)
        full = sum(v for k, v in replays.items() if ".FULL." in k)
        piecewise = sum(v for k, v in replays.items() if ".PIECEWISE." in k)
        assert full == counts["graph.dispatch.uniform_decode.FULL"]
        assert piecewise == counts["graph.dispatch.mixed.PIECEWISE"]
    for state in pcp_runs["pcp2"]["pcp"]:
        modes = {step["descriptor_mode"] for step in state["steps"]}
        assert modes == {"FULL", "PIECEWISE", "NONE"}
        # A step runs inside a graph only when its real rank-local tokens fit: padding never cuts a token.
        for step in state["steps"]:
            assert step["local_tokens_after_padding"] >= max(step["real_tokens_per_rank"])
            if step["descriptor_mode"] != "NONE":
                assert step["local_tokens_after_padding"] == step["descriptor_tokens"] <= max(
                    pcp_settings["capture_sizes"])


def test_both_ranks_made_the_same_graph_decisions(pcp_runs):
    rank0, rank1 = (_graph_counts(u) for u in pcp_runs["pcp2"]["usage"])
    assert rank0 == rank1
