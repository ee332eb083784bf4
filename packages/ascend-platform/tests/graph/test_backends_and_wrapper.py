"""The simulated lane's graph pieces: eager "graphs" replay their forward, the static-graph wrapper records capture
and replay under vLLM's forward context and refuses a replay whose inputs moved, and the platform's graph policy."""

from __future__ import annotations

import pytest
import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.forward_context import BatchDescriptor, set_forward_context

from ascend_platform import usage
from ascend_platform.graph import EagerBackend, default_backend
from ascend_platform.graph.policy import capture_sizes_for, graph_mode_for, static_graph_wrapper
from ascend_platform.graph.wrapper import GraphInputMovedError, SimulatedGraphWrapper

P, F, N = CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL, CUDAGraphMode.NONE


def test_eager_graphs_rerun_the_captured_forward():
    runs = []
    graph = EagerBackend().capture(lambda: runs.append(len(runs)))
    assert runs == [0]
    graph.replay()
    graph.replay()
    assert runs == [0, 1, 2]
    assert isinstance(default_backend(simulated=True), EagerBackend)
    with pytest.raises(RuntimeError, match="ACL graphs need torch_npu"):
        default_backend(simulated=False)


@pytest.fixture(scope="module")
def vllm_config():
    return VllmConfig()


def _count(key: str) -> int:
    return usage.snapshot()["counts"].get(key, 0)


def test_wrapper_records_capture_then_replay_and_refuses_moved_inputs(vllm_config):
    calls = []
    wrapper = SimulatedGraphWrapper(lambda x, y=None: calls.append(x.data_ptr()) or x, vllm_config, P)
    ids, other = torch.zeros(24, dtype=torch.int32), torch.zeros(24, dtype=torch.int32)
    desc = BatchDescriptor(num_tokens=24)
    before = (_count("graph.capture.PIECEWISE.24"), _count("graph.replay.PIECEWISE.24"))
    with set_forward_context(None, vllm_config, cudagraph_runtime_mode=P, batch_descriptor=desc):
        wrapper(ids[:24])
        wrapper(ids[:24])
        with pytest.raises(GraphInputMovedError, match=r"\['0'\]"):
            wrapper(other)
    assert (_count("graph.capture.PIECEWISE.24"), _count("graph.replay.PIECEWISE.24")) == (before[0] + 1,
                                                                                          before[1] + 1)
    with set_forward_context(None, vllm_config, cudagraph_runtime_mode=N, batch_descriptor=desc):
        wrapper(other)  # eager steps (and other modes) simply run
    with set_forward_context(None, vllm_config, cudagraph_runtime_mode=F, batch_descriptor=desc):
        wrapper(other)
    assert len(calls) == 4 and _count("graph.replay.PIECEWISE.24") == before[1] + 1
    assert wrapper.unwrap() is wrapper.runnable


@pytest.mark.parametrize(("graph_mode", "simulated", "eager", "mode"), [
    ("auto", True, False, N),  # the simulated lane only captures when a mode is asked for
    ("auto", False, False, P),
    ("auto", False, True, N),
    ("eager", False, False, N),
    ("piecewise", True, True, P),
    ("full", True, False, CUDAGraphMode.FULL_DECODE_ONLY),
    ("full_and_piecewise", True, False, CUDAGraphMode.FULL_AND_PIECEWISE),
])
def test_graph_mode_policy(graph_mode, simulated, eager, mode):
    assert graph_mode_for(graph_mode, simulated=simulated, enforce_eager=eager) == mode


def test_capture_sizes_fit_what_one_graph_holds():
    # FULL decode graphs hold at most max_num_seqs tokens; mixed graphs up to the batch budget.
    assert capture_sizes_for(CUDAGraphMode.FULL_DECODE_ONLY, (2, 4, 76), max_num_seqs=8,
                             max_num_batched_tokens=512) == [2, 4]
    assert capture_sizes_for(CUDAGraphMode.FULL_AND_PIECEWISE, (2, 4, 76, 1024), max_num_seqs=8,
                             max_num_batched_tokens=512) == [2, 4, 76]
    assert capture_sizes_for(P, None, max_num_seqs=8, max_num_batched_tokens=512) == [1, 2, 4, 8]
    assert capture_sizes_for(N, (2, 4), max_num_seqs=8, max_num_batched_tokens=512) == []
    assert static_graph_wrapper(True).endswith("SimulatedGraphWrapper")
    assert static_graph_wrapper(False).endswith("AclGraphWrapper")
