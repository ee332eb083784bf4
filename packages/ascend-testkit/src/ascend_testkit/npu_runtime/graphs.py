"""ACL graphs on the emulated card: `torch.npu.NPUGraph`, `torch.npu.graph`, `graph_pool_handle`,
`is_current_stream_capturing`, with torch_npu's surface (which mirrors torch.cuda's).

A card records the kernels a capture launches, with their arguments as they were at capture: device addresses, and
host values (shapes, lengths, Python scalars) frozen into the graph. A replay launches the same kernels again on the
same addresses; nothing on the host runs. This emulation does the same one level up: capture records every op the
captured code dispatches (a `TorchDispatchMode`: the op and its arguments, Python values frozen as they were),
keeping the capture's outputs alive as the graph's memory (its pool); `replay()` re-runs the recorded ops on the
recorded tensors, writing each fresh result into the tensor captured for it, so later ops read it where the graph
does. Views need no replay (they alias captured memory); in-place and out= ops re-run on their captured targets.

So a replay computes on whatever the persistent input tensors hold now, and on the host values of capture time: a
caller that refreshed a host-side length instead of a device tensor gets a stale answer here as on a card (re-running
the captured Python instead would recompute the host values and hide that fault). A tensor whose memory moved since
the capture (a parameter given new storage, a buffer re-allocated) is refused at replay: a card's graph would read the
captured address. What a card refuses during a
capture is refused here: reading a device value on the host (`.item()`, `.tolist()`, `.cpu()`), ops whose output
shape depends on device data (`nonzero`, boolean masks), synchronising.

Not emulated: memory sharing between graphs of one pool (each graph keeps its own tensors here, so several graphs
take more than on a card), graph parameter updates (`graph_task_update_*`), capture error modes.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import itertools
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COUNTS: collections.Counter[str] = collections.Counter()
aten = torch.ops.aten

# Ops whose answer lands on the host or whose output shape depends on device data: a card refuses them in a capture.
_HOST_READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
               aten.argwhere.default, aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
               aten.repeat_interleave.Tensor}
_ALLOCATIONS = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                aten.new_empty.default, aten.new_empty_strided.default}
_pool_ids = itertools.count(1)


class GraphCaptureError(RuntimeError):
    """Something a card does not allow while a stream is capturing."""


def _is_npu(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "npu"


@dataclasses.dataclass
class _Op:
    func: Any
    args: tuple
    kwargs: dict
    fresh: list[tuple[int, torch.Tensor]]  # (output position, captured tensor) of outputs the op allocated
    addresses: list[tuple[torch.Tensor, int]]  # every tensor argument and its data pointer at capture


def _addresses(args: tuple, kwargs: dict) -> list[tuple[torch.Tensor, int]]:
    out = []
    for value in list(args) + list(kwargs.values()):
        values = value if isinstance(value, (tuple, list)) else (value,)
        out.extend((v, v.data_ptr()) for v in values if isinstance(v, torch.Tensor) and v.device.type == "npu")
    return out


def _storages(values: Any) -> set[int]:
    flat = values if isinstance(values, (tuple, list)) else (values,)
    out = set()
    for value in flat:
        if isinstance(value, torch.Tensor):
            out.add(value.untyped_storage().data_ptr())
        elif isinstance(value, (tuple, list)):
            out |= _storages(value)
    return out


def _fresh_outputs(func: Any, args: tuple, kwargs: dict, out: Any) -> list[tuple[int, torch.Tensor]] | None:
    """Outputs to refresh at replay, or None when the op needs no replay: a view of its inputs, an allocation
    (`empty`: a card's graph computes nothing for it), a host answer. Freshness is read from the storages (a schema's
    alias annotation says "may alias": `to` returns its input or a new tensor)."""
    if func in _ALLOCATIONS:
        return None
    inputs = _storages(list(args) + list(kwargs.values()))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    fresh = [(i, value) for i, value in enumerate(outs)
             if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in inputs]
    mutates = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
    # A custom op launched device work whatever its schema says (vLLM's all_reduce is declared out of place and
    # the base device communicator reduces in place, returning its input): a card's graph recorded those kernels.
    launched = func.namespace != "aten"
    if not fresh and not mutates and not launched:
        return None
    return fresh


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: NPUGraph) -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._refuse_host_reads(func, args, kwargs)
        out = func(*args, **kwargs)
        fresh = _fresh_outputs(func, args, kwargs, out)
        if fresh is not None:
            self.graph._ops.append(_Op(func, args, kwargs, fresh, _addresses(args, kwargs)))
        self.graph._keep.append(out)  # the graph's pool: capture-time tensors stay where the graph reads them
        return out

    @staticmethod
    def _refuse_host_reads(func: Any, args: tuple, kwargs: dict) -> None:
        if func in _HOST_READS:
            raise GraphCaptureError(f"{func} is not permitted while the NPU stream is capturing: it reads device data "
                                    "on the host (emulated ACL graph)")
        if func in (aten._to_copy.default, aten.copy_.default):
            target = kwargs.get("device") if func is aten._to_copy.default else args[0].device
            source = args[0] if func is aten._to_copy.default else args[1]
            if target is not None and torch.device(target).type == "cpu" and _is_npu(source):
                raise GraphCaptureError(f"{func}: copying a device tensor to the host is not permitted while the NPU "
                                        "stream is capturing (emulated ACL graph)")


_CAPTURING: list[NPUGraph] = []


class NPUGraph:
    """torch_npu's `NPUGraph`: capture_begin/capture_end around the work, then replay()."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._ops: list[_Op] = []
        self._keep: list[Any] = []
        self._recorder: _Recorder | None = None
        self._pool: Any = None
        self.captured = False

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        if self._recorder is not None or self.captured:
            raise GraphCaptureError("NPUGraph.capture_begin on a graph that is capturing or captured (reset() first)")
        self._pool = pool if pool is not None else graph_pool_handle()
        self._recorder = _Recorder(self)
        self._recorder.__enter__()
        _CAPTURING.append(self)

    def capture_end(self) -> None:
        if self._recorder is None:
            raise GraphCaptureError("NPUGraph.capture_end without capture_begin")
        _CAPTURING.remove(self)
        self._recorder.__exit__(None, None, None)
        self._recorder = None
        self.captured = True
        COUNTS["capture"] += 1
        COUNTS["captured_ops"] += len(self._ops)

    def abort_capture(self) -> None:
        """A capture that raised: the graph is invalidated, as a card's capture is."""
        if self._recorder is not None:
            _CAPTURING.remove(self)
            self._recorder.__exit__(None, None, None)
            self._recorder = None
        self.reset()

    def replay(self) -> None:
        if not self.captured:
            raise GraphCaptureError("NPUGraph.replay before a capture")
        for op in self._ops:
            for tensor, address in op.addresses:
                if tensor.data_ptr() != address:
                    raise GraphCaptureError(
                        f"NPUGraph.replay: {op.func} reads a {tuple(tensor.shape)} tensor that moved since the capture "
                        f"({address:#x} -> {tensor.data_ptr():#x}); a card's graph reads the captured address, which "
                        "no longer holds it (emulated ACL graph)")
            out = op.func(*op.args, **op.kwargs)
            if op.fresh:
                flat = out if isinstance(out, (tuple, list)) else (out,)
                for position, captured in op.fresh:
                    if op.func.namespace == "_c10d_functional":
                        # A functional collective's result lands asynchronously; on a card it lands in the captured
                        # buffer itself, so wait for it before handing it there.
                        torch.ops._c10d_functional.wait_tensor(flat[position])
                    captured.copy_(flat[position])
        COUNTS["replay"] += 1

    def reset(self) -> None:
        self._ops.clear()
        self._keep.clear()
        self.captured = False

    def pool(self) -> Any:
        return self._pool

    def enable_debug_mode(self) -> None:
        """torch_npu keeps the graph for debug_dump; the emulation always has its op list."""

    def debug_dump(self, path: str) -> None:
        with open(path, "w") as out:
            out.writelines(f"{op.func}\n" for op in self._ops)


def graph_pool_handle() -> tuple[int, int]:
    """An id graphs captured into share (torch.cuda's is a (0, id) tuple too)."""
    return (0, next(_pool_ids))


def is_current_stream_capturing() -> bool:
    return bool(_CAPTURING)


def refuse_while_capturing(what: str) -> None:
    if _CAPTURING:
        raise GraphCaptureError(f"{what} is not permitted while the NPU stream is capturing (emulated ACL graph)")


class graph(contextlib.ContextDecorator):  # noqa: N801 - torch_npu's name
    """`torch.npu.graph(npu_graph, pool=None, stream=None, capture_error_mode="global")`, as torch.cuda.graph."""

    def __init__(self, npu_graph: NPUGraph, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global") -> None:
        self.npu_graph = npu_graph
        self.pool = pool
        self.stream = stream
        self.capture_error_mode = capture_error_mode
        self._stream_context: Any = None

    def __enter__(self) -> None:
        torch.npu.synchronize()
        gc.collect()
        torch.npu.empty_cache()
        self._stream_context = torch.npu.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        self._stream_context.__enter__()
        self.npu_graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                self.npu_graph.capture_end()
            else:
                self.npu_graph.abort_capture()
        finally:
            self._stream_context.__exit__(*exc)


def runtime_functions() -> dict[str, Any]:
    return {"NPUGraph": NPUGraph, "graph": graph, "graph_pool_handle": graph_pool_handle,
            "is_current_stream_capturing": is_current_stream_capturing}
