"""What the NPU backend ran: torch_npu calls per op, and the facade ops that fell back to the reference (and why).

Every torch_npu call in `npu_backend` goes through `record_call`; a binding that cannot take what it is given calls
`record_fallback` with the reason, which is logged once per op (principle 9: fall back visibly, never silently).
"""

from __future__ import annotations

import collections
import logging
import threading

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()
_CALLS: collections.Counter[str] = collections.Counter()
_FALLBACKS: collections.Counter[str] = collections.Counter()
_REASONS: dict[str, str] = {}


def record_call(torch_npu_op: str) -> None:
    with _LOCK:
        _CALLS[torch_npu_op] += 1


def record_fallback(facade_op: str, reason: str) -> None:
    with _LOCK:
        _FALLBACKS[facade_op] += 1
        first = facade_op not in _REASONS
        _REASONS[facade_op] = reason
    if first:
        logger.warning("ascend_kernels npu backend: %s runs the reference implementation: %s", facade_op, reason)


def snapshot() -> dict:
    with _LOCK:
        return {"npu_ops": dict(_CALLS), "fallbacks": dict(_FALLBACKS), "fallback_reasons": dict(_REASONS)}


def reset() -> None:
    with _LOCK:
        _CALLS.clear()
        _FALLBACKS.clear()
        _REASONS.clear()
