"""Graph capture across an NPU worker's distributed groups (vLLM's `graph_capture(device)` context).

vLLM's `GroupCoordinator.graph_capture` enters the CUDA / XPU custom all-reduce capture contexts and asserts that the
group's device communicator is one of theirs; with TP > 1 an NPU group has vLLM's base communicator, so V1's
`capture_model` stopped at the assertion (found by the emulated NPU runtime). On an NPU the groups' collectives run
through HCCL, which an ACL graph captures as it is; what remains of vLLM's context is the capture stream. The NPU
worker puts this one in place for the life of its process (registered patch `worker.npu_group_graph_capture`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ascend_platform.patches import REGISTRY, AppliedPatch
from ascend_platform.patches.catalogue import NPU_GROUP_GRAPH_CAPTURE


@contextmanager
def npu_group_graph_capture(group: Any, graph_capture_context: Any = None) -> Iterator[Any]:
    from vllm.distributed.parallel_state import GraphCaptureContext

    if graph_capture_context is None:
        graph_capture_context = GraphCaptureContext(torch.npu.Stream())
    stream = graph_capture_context.stream
    current = torch.npu.current_stream()
    if current != stream:
        stream.wait_stream(current)  # what the groups set up before the capture is done first
    with torch.npu.stream(stream):
        yield graph_capture_context


def capture_groups_on_npu_streams() -> AppliedPatch:
    return REGISTRY.apply(NPU_GROUP_GRAPH_CAPTURE.name, npu_group_graph_capture)
