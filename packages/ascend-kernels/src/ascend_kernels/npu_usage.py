"""What the NPU backend ran: torch_npu calls per op, and the facade ops that fell back to the reference (and why).

Every torch_npu call in `npu_backend` goes through `record_call`; a binding that cannot take what it is given calls
`record_fallback` with the reason, which is logged once per op (principle 9: fall back visibly, never silently).
With `set_facade_counting(True)` the registry also counts every facade op call per backend ("backend:op"), wrapping
each op when it binds the backend (so it costs nothing while off).
"""

from __future__ import annotations

import collections
import logging
import threading

import torch

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()
_CALLS: collections.Counter[str] = collections.Counter()
_FALLBACKS: collections.Counter[str] = collections.Counter()
_REASONS: dict[str, str] = {}
_FACADE: collections.Counter[str] = collections.Counter()  # "backend:op" -> calls, while counting is on
_PAGED_PLANES: collections.Counter[str] = collections.Counter()  # facade op -> calls over a hybrid's paged planes


class _Counting:
    enabled = False


def set_facade_counting(enabled: bool) -> None:
    """Count every facade op call per backend (`snapshot()["facade_ops"]`). Off by default: the count wraps each
    op, so the facade is then two hops instead of one."""
    _Counting.enabled = bool(enabled)
    from ascend_kernels import registry

    registry.rebind()


def facade_counting() -> bool:
    return _Counting.enabled


def facade_counter(backend: str):
    """For the registry's `bind`: op name -> a wrapper counting that op's calls on `backend`."""

    def for_op(op: str):
        key = f"{backend}:{op}"

        def wrap(fn):
            def counted(*args, **kwargs):
                _FACADE[key] += 1  # a Counter increment under the GIL; exact enough for a usage report
                return fn(*args, **kwargs)

            counted.__wrapped__ = fn
            return counted

        return wrap

    return for_op


def record_call(torch_npu_op: str) -> None:
    with _LOCK:
        _CALLS[torch_npu_op] += 1


def record_paged_planes(facade_op: str) -> None:
    """A binding took strided (paged) K/V planes through `npu_paged_planes` rather than the dense path."""
    if torch.compiler.is_compiling():  # counted per eager call only, as torch_npu calls are
        return
    with _LOCK:
        _PAGED_PLANES[facade_op] += 1


_TRACED: list = []  # [the traced-fallback recorder], made when the npu backend loads (`count_traced_fallbacks`)


def record_fallback(facade_op: str, reason: str) -> None:
    if _TRACED and torch.compiler.is_compiling():
        _TRACED[0](facade_op, reason)
        return
    _record_fallback(facade_op, reason)


def count_traced_fallbacks() -> None:
    """A fallback decided while a binding is traced into a compiled graph (its conditions are the trace's static
    shapes and settings) is counted once, when traced: a graph replay runs no Python. The recorder runs at trace time
    (`assume_constant_result`); made when the npu backend loads, since the decorator imports torch's compiler stack
    (and with it Triton), which importing this package must not."""
    if not _TRACED:

        def traced(facade_op: str, reason: str) -> bool:
            _record_fallback(facade_op, reason)
            return True

        _TRACED.append(torch.compiler.assume_constant_result(traced))


def _record_fallback(facade_op: str, reason: str) -> None:
    with _LOCK:
        _FALLBACKS[facade_op] += 1
        first = facade_op not in _REASONS
        _REASONS[facade_op] = reason
    if first:
        logger.warning("ascend_kernels npu backend: %s runs the reference implementation: %s", facade_op, reason)


def snapshot() -> dict:
    with _LOCK:
        return {"npu_ops": dict(_CALLS), "fallbacks": dict(_FALLBACKS), "fallback_reasons": dict(_REASONS),
                "facade_ops": dict(_FACADE), "paged_planes": dict(_PAGED_PLANES)}


def reset() -> None:
    with _LOCK:
        _CALLS.clear()
        _FALLBACKS.clear()
        _REASONS.clear()
        _FACADE.clear()
        _PAGED_PLANES.clear()
