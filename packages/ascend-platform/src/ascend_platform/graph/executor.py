"""Runs a `GraphCapturePlan`: captures each planned descriptor and runs each step by its descriptor.

One executor, two backends. On an NPU `AclGraphBackend` records an ACL graph per descriptor (torch_npu, imported
only there) and replays it; in the simulated lane `EagerBackend` runs the same forward eagerly at capture and at
replay, so the planning, the staging of capture inputs in persistent buffers and the descriptor lookups all run
here exactly as they do on a device. A step whose descriptor was not captured (NONE, or larger than every graph)
runs eagerly on both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from vllm.config import CUDAGraphMode
from vllm.logger import init_logger

from ascend_platform.graph.plan import GraphCapturePlan

logger = init_logger(__name__)

Forward = Callable[[], Any]


class GraphBackend(Protocol):
    name: str

    def capture(self, forward: Forward) -> Any: ...

    def replay(self, handle: Any, forward: Forward) -> None: ...


class EagerBackend:
    """The simulated lane's backend: "capturing" runs the forward once, "replaying" runs it again."""

    name = "eager"

    def capture(self, forward: Forward) -> Any:
        forward()
        return forward

    def replay(self, handle: Any, forward: Forward) -> None:
        forward()


class AclGraphBackend:
    """ACL graphs through torch_npu's `NPUGraph`; torch_npu is imported when the backend is built."""

    name = "aclgraph"

    def __init__(self) -> None:
        import torch

        from ascend_kernels.npu_probe import torch_npu_status

        status = torch_npu_status()  # the kernel facade imports torch_npu, which registers torch.npu
        if not status.usable:
            raise RuntimeError(f"ACL graphs need torch_npu with a device: {status.reason}")
        self._torch = torch

    def capture(self, forward: Forward) -> Any:
        graph = self._torch.npu.NPUGraph()
        with self._torch.npu.graph(graph):
            forward()
        return graph

    def replay(self, handle: Any, forward: Forward) -> None:
        handle.replay()


def default_backend() -> GraphBackend:
    """ACL graphs where torch_npu drives a device, eager execution otherwise (the simulated lane)."""
    from ascend_kernels.npu_probe import torch_npu_status

    return AclGraphBackend() if torch_npu_status().usable else EagerBackend()


class GraphExecutor:
    """Captures the plan's descriptors and dispatches steps to the captured graphs."""

    def __init__(self, plan: GraphCapturePlan, backend: GraphBackend | None = None):
        self.plan = plan
        self.backend = backend if backend is not None else default_backend()
        self.graphs: dict[Any, Any] = {}

    def capture_all(self, stage: Callable[[Any], Forward]) -> list[Any]:
        """Capture every planned descriptor; `stage(desc)` writes its inputs in place and returns the forward."""
        captured = []
        for desc in self.plan.capture_descriptors():
            self.graphs[desc] = self.backend.capture(stage(desc))
            captured.append(desc)
        logger.info("captured %d graphs (%s backend)", len(captured), self.backend.name)
        return captured

    def run(self, desc: Any, forward: Forward) -> str:
        """Run one step by its descriptor; returns how it ran: "replay" or "eager"."""
        handle = self.graphs.get(desc) if desc.cg_mode != CUDAGraphMode.NONE else None
        if handle is None:
            forward()
            return "eager"
        self.backend.replay(handle, forward)
        return "replay"
