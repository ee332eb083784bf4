"""Device graphs behind one interface: capture a forward once, replay it later.

On an NPU, `AclGraphBackend` records an ACL graph (torch_npu's `NPUGraph`, imported only there) and a replay re-runs
the recorded kernels on the tensors captured. In the simulated lane, `EagerBackend` "captures" by running the
forward and replays by running the same forward again: the forward closes over the capture-time inputs and
metadata, which live in persistent buffers the runner refills in place before each replay, exactly what a replayed
device graph reads. So a buffer that moved, or metadata that was not refreshed in place, gives wrong tokens here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

Forward = Callable[[], Any]


class Graph(Protocol):
    def replay(self) -> None: ...


class GraphBackend(Protocol):
    name: str

    def capture(self, forward: Forward) -> Graph: ...


class EagerGraph:
    """A "graph" of the simulated lane: the captured forward, run again at each replay."""

    def __init__(self, forward: Forward) -> None:
        self.forward = forward

    def replay(self) -> None:
        self.forward()


class EagerBackend:
    """The simulated lane's backend: capturing runs the forward once, replaying runs it again."""

    name = "eager"

    def capture(self, forward: Forward) -> Graph:
        forward()
        return EagerGraph(forward)


class AclGraphBackend:
    """ACL graphs through torch_npu's `NPUGraph`; torch_npu is imported when the backend is built."""

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
            forward()
        return graph


def default_backend(simulated: bool) -> GraphBackend:
    """Eager execution in the simulated lane, ACL graphs on a device."""
    return EagerBackend() if simulated else AclGraphBackend()
