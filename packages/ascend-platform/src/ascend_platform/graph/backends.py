"""Device graphs behind one interface: capture a forward once, replay it later, read the captured output.

On an NPU, `AclGraphBackend` records an ACL graph (torch_npu's `NPUGraph`, into the platform's graph pool) and a
replay re-runs the recorded kernels on the tensors captured, refreshing the output captured. In the simulated lane,
`EagerBackend` "captures" by running the forward and replays by running the same forward again: the forward closes
over the capture-time inputs and metadata, which live in persistent buffers the runner refills in place before each
replay, exactly what a replayed device graph reads. So a buffer that moved, or metadata that was not refreshed in
place, gives wrong tokens here too (and on the emulated NPU runtime, whose ACL graph replays also keep the host
values of capture time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

Forward = Callable[[], Any]


class Graph(Protocol):
    output: Any  # what the forward returned at capture; a replay refreshes it

    def replay(self) -> None: ...


class GraphBackend(Protocol):
    name: str

    def capture(self, forward: Forward) -> Graph: ...


class EagerGraph:
    """A "graph" of the simulated lane: the captured forward, run again at each replay."""

    def __init__(self, forward: Forward) -> None:
        self.forward = forward
        self.output = forward()

    def replay(self) -> None:
        self.output = self.forward()


class EagerBackend:
    """The simulated lane's backend: capturing runs the forward once, replaying runs it again."""

    name = "eager"

    def capture(self, forward: Forward) -> Graph:
        return EagerGraph(forward)


class AclGraph:
    """An ACL graph and the output tensors its replays write."""

    def __init__(self, graph: Any, output: Any) -> None:
        self.graph = graph
        self.output = output

    def replay(self) -> None:
        self.graph.replay()


class AclGraphBackend:
    """ACL graphs through torch_npu's `NPUGraph`, captured into `pool` (the platform's global graph pool, which
    vLLM's graph managers and wrappers share); torch_npu is imported when the backend is built."""

    name = "aclgraph"

    def __init__(self, pool: Any = None) -> None:
        import torch

        from ascend_kernels.npu_probe import torch_npu_status

        status = torch_npu_status()  # the kernel facade imports torch_npu, which registers torch.npu
        if not status.usable:
            raise RuntimeError(f"ACL graphs need torch_npu with a device: {status.reason}")
        self._torch = torch
        self.pool = pool

    def capture(self, forward: Forward) -> Graph:
        graph = self._torch.npu.NPUGraph()
        with self._torch.npu.graph(graph, pool=self.pool):
            output = forward()
        return AclGraph(graph, output)


def default_backend(simulated: bool, pool: Any = None) -> GraphBackend:
    """Eager execution in the simulated lane, ACL graphs (into `pool`) on a device."""
    return EagerBackend() if simulated else AclGraphBackend(pool)
