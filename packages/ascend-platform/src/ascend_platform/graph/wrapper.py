"""The static-graph wrappers the platform gives vLLM (`Platform.get_static_graph_wrapper_cls`).

vLLM wraps a runnable with one (`runtime_mode` PIECEWISE for the pieces of a torch.compile'd model; the Ascend graph
manager also wraps the whole model with one where nothing is compiled). At each call the wrapper reads the forward
context: when its `cudagraph_runtime_mode` is the wrapper's, the call is captured the first time its
`batch_descriptor` is seen and replayed after; otherwise the runnable simply runs (vLLM's CUDAGraphWrapper contract).

* `AclGraphWrapper` (device): an ACL graph per batch descriptor through torch_npu's `NPUGraph`; a replay returns the
  output tensors captured. Not exercised here (no NPU).
* `SimulatedGraphWrapper` (simulated lane): runs the runnable eagerly every time and records what it would capture
  and replay (`ascend_platform.graph.trace`). A replay whose input tensors are not the captured ones (another data
  pointer) is an error: a device graph would read the captured addresses and compute on stale inputs.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context, is_forward_context_available

from ascend_platform.graph import trace


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


class _WrapperBase:
    def __init__(self, runnable: Any, vllm_config: Any, runtime_mode: CUDAGraphMode, **kwargs: Any) -> None:
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode

    def __getattr__(self, name: str) -> Any:
        # Model attributes (compute_logits, ...) stay reachable through the wrapper, as through vLLM's.
        if name == "runnable":
            raise AttributeError(name)
        return getattr(self.runnable, name)

    def unwrap(self) -> Any:
        return self.runnable


class SimulatedGraphWrapper(_WrapperBase):
    def __init__(self, runnable: Any, vllm_config: Any, runtime_mode: CUDAGraphMode, **kwargs: Any) -> None:
        super().__init__(runnable, vllm_config, runtime_mode, **kwargs)
        self.captured: dict[Any, tuple[tuple[str, int], ...]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        desc = _active_descriptor(self.runtime_mode)
        if desc is None:
            return self.runnable(*args, **kwargs)
        addresses = _addresses(args, kwargs)
        expected = self.captured.get(desc)
        if expected is None:
            self.captured[desc] = addresses
            trace.captured(self.runtime_mode, desc.num_tokens)
        elif expected != addresses:
            was, now = dict(expected), dict(addresses)
            moved = sorted(n for n in was.keys() | now.keys() if was.get(n) != now.get(n))
            raise GraphInputMovedError(
                f"{self.runtime_mode.name} graph for {desc} replayed with inputs {moved} at other addresses than "
                "at capture; graph inputs must live in persistent buffers")
        else:
            trace.replayed(self.runtime_mode, desc.num_tokens)
        return self.runnable(*args, **kwargs)


class AclGraphWrapper(_WrapperBase):
    def __init__(self, runnable: Any, vllm_config: Any, runtime_mode: CUDAGraphMode, **kwargs: Any) -> None:
        super().__init__(runnable, vllm_config, runtime_mode, **kwargs)
        from vllm.platforms import current_platform

        self.pool = current_platform.get_global_graph_pool()
        self.graphs: dict[Any, tuple[Any, Any]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        desc = _active_descriptor(self.runtime_mode)
        if desc is None:
            return self.runnable(*args, **kwargs)
        entry = self.graphs.get(desc)
        if entry is None:
            graph = torch.npu.NPUGraph()
            with torch.npu.graph(graph, pool=self.pool):
                output = self.runnable(*args, **kwargs)
            self.graphs[desc] = (graph, output)
            trace.captured(self.runtime_mode, desc.num_tokens)
            return output
        graph, output = entry
        graph.replay()
        trace.replayed(self.runtime_mode, desc.num_tokens)
        return output
