"""The executor captures the plan's descriptors and runs steps by them; the simulated lane does so eagerly."""

from __future__ import annotations

import torch
from vllm.config import CUDAGraphMode
from vllm.v1.worker.gpu.input_batch import InputBuffers

from ascend_platform.graph import EagerBackend, GraphCapturePlan, GraphExecutor, default_backend
from ascend_platform.pcp import AscendPCPManager
from ascend_platform.pcp.step_batch import step_input_batch

CPU = torch.device("cpu")


def test_simulated_lane_backend_is_eager():
    assert isinstance(default_backend(), EagerBackend)


def test_capture_and_run_through_the_pcp_manager_on_persistent_buffers():
    plan = GraphCapturePlan(mode=CUDAGraphMode.FULL_AND_PIECEWISE, capture_sizes=(2, 4, 8, 16, 32, 64), max_num_reqs=4)
    manager = AscendPCPManager(2, 0, CPU, max_num_reqs=4, max_num_tokens=256, max_num_blocks_per_group=[8])
    addresses = manager.buffers.addresses()
    calls: list[tuple[str, int]] = []

    def stage(desc):
        staged = manager.stage_capture_batch(desc.num_tokens, desc.num_reqs)
        assert staged.batch.num_tokens_after_padding == desc.num_tokens
        return lambda: calls.append(("capture", int(staged.batch.input_ids.numel())))

    executor = GraphExecutor(plan, EagerBackend())
    captured = executor.capture_all(stage)
    P, F = CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL
    # FULL decode graphs stop at max_num_reqs=4 decodes; at equal size the FULL graph is captured first.
    assert [(d.cg_mode, d.num_tokens) for d in captured] == [
        (P, 64),
        (P, 32),
        (P, 16),
        (P, 8),
        (F, 4),
        (P, 4),
        (F, 2),
        (P, 2),
    ]
    assert calls == [("capture", d.num_tokens) for d in captured]  # the eager "capture" ran each forward once
    assert manager.buffers.addresses() == addresses

    buffers = InputBuffers(4, 256, CPU)
    # PCP=2: [20, 9] puts 10 + 6 tokens on rank 1 (a 16-token graph); [150] puts 76 there, past the 64 graph.
    for lens, expected in (([20, 9], "replay"), ([150], "eager")):
        batch = step_input_batch(buffers, lens)
        tokens = manager.num_tokens_for_dispatch(batch.num_scheduled_tokens, batch.is_prefilling_np)
        desc = plan.descriptor_for(len(lens), tokens, decode_only=False)
        local = manager.partition_batch(batch, desc)
        ran = executor.run(manager.effective_descriptor(batch, desc), lambda n=local.num_tokens_after_padding: None)
        assert ran == expected
        assert local.num_tokens_after_padding == (desc.num_tokens if expected == "replay" else 76)
        assert manager.buffers.addresses() == addresses
