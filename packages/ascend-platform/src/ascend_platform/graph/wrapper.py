"""The static-graph wrappers the platform gives vLLM (`Platform.get_static_graph_wrapper_cls`).

vLLM wraps a runnable with one (`runtime_mode` PIECEWISE for the pieces of a torch.compile'd model; in the simulated
lane the Ascend graph manager also wraps the whole model with one, as nothing is compiled there). At each call the
wrapper reads the forward context: when its `cudagraph_runtime_mode` is the wrapper's, the call is captured the first
time its `batch_descriptor` is seen and replayed after; otherwise the runnable simply runs (vLLM's CUDAGraphWrapper
contract). A replay returns the outputs the graph refreshed.

The two lanes' wrappers differ only by their graph backend (`ascend_platform.graph.backends`): `AclGraphWrapper`
captures ACL graphs into the platform's graph pool, `SimulatedGraphWrapper` eager "graphs" (the captured call, run
again). Both record what they capture and replay (`ascend_platform.graph.trace`), and both refuse a replay whose
input tensors are not the captured ones (another data pointer): a device graph would read the captured addresses and
compute on stale inputs.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context, is_forward_context_available

from ascend_platform.graph import trace
from ascend_platform.graph.backends import AclGraphBackend, EagerBackend, Graph, GraphBackend


class GraphInputMovedError(RuntimeError):
    """A replay's inputs live elsewhere than the captured graph's: a device graph would read stale memory."""


def _addresses(args: tuple, kwargs: dict) -> tuple[tuple[str, int], ...]:
    named = [(str(i), a) for i, a in enumerate(args)] + sorted(kwargs.items())
    return tuple((name, t.data_ptr()) for name, t in named if isinstance(t, torch.Tensor))


def _active_descriptor(runtime_mode: CUDAGraphMode) -> Any:
    """The forward context's batch descriptor when this call is to be captured or replayed, else None."""
    if not is_forward_context_available():
        return None
    context = get_forward_context()
    mode = context.cudagraph_runtime_mode
    if mode == CUDAGraphMode.NONE or mode != runtime_mode:
        return None
    return context.batch_descriptor


_INSTANCES: weakref.WeakSet = weakref.WeakSet()


def release_static_graphs() -> int:
    """Drop every wrapper's graphs (their memory goes back to the pool); the next call per descriptor captures
    again. Returns how many graphs were dropped."""
    dropped = 0
    for wrapper in list(_INSTANCES):
        dropped += len(wrapper.graphs)
        wrapper.graphs.clear()
    return dropped


class _StaticGraphWrapper:
    def __init__(self, runnable: Any, vllm_config: Any, runtime_mode: CUDAGraphMode, **kwargs: Any) -> None:
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.graphs: dict[Any, tuple[Graph, tuple[tuple[str, int], ...]]] = {}
        _INSTANCES.add(self)

    def _backend(self) -> GraphBackend:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        # Model attributes (compute_logits, ...) stay reachable through the wrapper, as through vLLM's.
        if name == "runnable":
            raise AttributeError(name)
        return getattr(self.runnable, name)

    def unwrap(self) -> Any:
        return self.runnable

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        desc = _active_descriptor(self.runtime_mode)
        if desc is None:
            return self.runnable(*args, **kwargs)
        addresses = _addresses(args, kwargs)
        entry = self.graphs.get(desc)
        if entry is None:
            graph = self._backend().capture(lambda: self.runnable(*args, **kwargs))
            self.graphs[desc] = (graph, addresses)
            trace.captured(self.runtime_mode, desc.num_tokens)
            return graph.output
        graph, expected = entry
        if expected != addresses:
            was, now = dict(expected), dict(addresses)
            moved = sorted(n for n in was.keys() | now.keys() if was.get(n) != now.get(n))
            raise GraphInputMovedError(
                f"{self.runtime_mode.name} graph for {desc} replayed with inputs {moved} at other addresses than "
                "at capture; graph inputs must live in persistent buffers")
        graph.replay()
        trace.replayed(self.runtime_mode, desc.num_tokens)
        return graph.output


class SimulatedGraphWrapper(_StaticGraphWrapper):
    """Eager "graphs": the captured call, run again at each replay."""

    def _backend(self) -> GraphBackend:
        return EagerBackend()


class AclGraphWrapper(_StaticGraphWrapper):
    """ACL graphs, captured into the platform's global graph pool (shared with the graph manager's)."""

    def __init__(self, runnable: Any, vllm_config: Any, runtime_mode: CUDAGraphMode, **kwargs: Any) -> None:
        super().__init__(runnable, vllm_config, runtime_mode, **kwargs)
        from vllm.platforms import current_platform

        self.pool = current_platform.get_global_graph_pool()

    def _backend(self) -> GraphBackend:
        return AclGraphBackend(self.pool)
