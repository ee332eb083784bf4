"""The emulated card's memory: a capacity from the environment, usage measured from the tensors alive on it.

The emulated device backs `npu` with CPU storage, so there is no device allocator to ask. What torch's caching
allocator would report as allocated is measured instead: the bytes of every distinct live tensor storage created
after the runtime was installed (a `gc` walk, done only when vLLM or a test asks: a few times per engine start). A
peak is the highest value seen by a measurement, so transient activation peaks between measurements are not seen.
"""

from __future__ import annotations

import gc
import os
import re
import threading

import torch

MEMORY_ENV = "ASCEND_TESTKIT_NPU_MEMORY"
DEFAULT_CAPACITY = 1 << 30
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_capacity(text: str) -> int:
    """'1073741824', '512MiB', '2G', '1.5GiB' -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"{MEMORY_ENV}={text!r}: give bytes or a size such as '512MiB' or '2GiB'")
    value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value <= 0:
        raise ValueError(f"{MEMORY_ENV}={text!r}: the capacity must be positive")
    return value


def _live_storages() -> dict[int, int]:
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        # type(), not isinstance: some gc-tracked objects warn when their __class__ is read
        if issubclass(type(obj), torch.Tensor) and not obj.is_meta and obj.layout == torch.strided:
            try:
                storage = obj.untyped_storage()
            except (RuntimeError, NotImplementedError):  # tensor subclasses without storage (FakeTensor, ...)
                continue
            if storage.device.type == "cpu" and storage.nbytes():
                storages[storage.data_ptr()] = storage.nbytes()
    return storages


class EmulatedMemory:
    """One card's memory. `allocated()` walks the live tensors; `reset_peak()` starts a new peak window."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._baseline = set(_live_storages())  # what the process held before it had a card is host memory
        self._peak = 0
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> EmulatedMemory:
        text = os.environ.get(MEMORY_ENV, "").strip()
        return cls(parse_capacity(text) if text else DEFAULT_CAPACITY)

    def allocated(self) -> int:
        with self._lock:
            used = sum(n for ptr, n in _live_storages().items() if ptr not in self._baseline)
            self._peak = max(self._peak, used)
            return used

    def peak(self) -> int:
        self.allocated()
        return self._peak

    def reset_peak(self) -> None:
        self._peak = 0
        self.allocated()

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) as `aclrtGetMemInfo` gives them; more allocated than the capacity is an emulated OOM."""
        used = self.allocated()
        if used > self.capacity:
            raise torch.OutOfMemoryError(f"emulated NPU out of memory: {used} bytes live on a {self.capacity}-byte "
                                         f"card ({MEMORY_ENV})")
        return self.capacity - used, self.capacity

    def stats(self) -> dict[str, int]:
        used = self.allocated()
        return {"allocated_bytes.all.current": used, "allocated_bytes.all.peak": self._peak,
                "reserved_bytes.all.current": used, "reserved_bytes.all.peak": self._peak}
