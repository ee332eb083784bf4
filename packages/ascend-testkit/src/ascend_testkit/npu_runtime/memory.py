"""The emulated card's memory: a capacity from the environment, usage from the card's own allocator.

Every `npu` tensor's storage comes from the C++ allocator of `csrc/npu_device.cpp` (host pages counted against the
card's capacity; past it an allocation raises torch's OutOfMemoryError, as on a card), so what torch_npu's caching
allocator reports as allocated is exact here, transient peaks included. There is no cache: reserved equals
allocated and `empty_cache()` frees nothing more. Host tensors (`.cpu()`, `.to("cpu")`, pinned staging buffers) are
never counted: host and device memory are told apart by the device a tensor is on, as on a card.
"""

from __future__ import annotations

import os
import re

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


def capacity_from_env() -> int:
    text = os.environ.get(MEMORY_ENV, "").strip()
    return parse_capacity(text) if text else DEFAULT_CAPACITY


class EmulatedMemory:
    """The memory of one card, read from the device's allocator."""

    def __init__(self, index: int) -> None:
        self.index = index

    def _stats(self) -> list[int]:
        return torch.ops.npu_emu.memory_stats(self.index)  # [allocated, peak, capacity, allocations, frees]

    @property
    def capacity(self) -> int:
        return self._stats()[2]

    def allocated(self) -> int:
        return self._stats()[0]

    def peak(self) -> int:
        return self._stats()[1]

    def reset_peak(self) -> None:
        torch.ops.npu_emu.reset_peak(self.index)

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) as `aclrtGetMemInfo` gives them."""
        allocated, _, capacity, _, _ = self._stats()
        return capacity - allocated, capacity

    def stats(self) -> dict[str, int]:
        allocated, peak, _, allocations, frees = self._stats()
        return {"allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": peak,
                "reserved_bytes.all.current": allocated, "reserved_bytes.all.peak": peak,
                "active_bytes.all.current": allocated, "active_bytes.all.peak": peak,
                "allocation.all.allocated": allocations, "allocation.all.freed": frees, "num_ooms": 0}
