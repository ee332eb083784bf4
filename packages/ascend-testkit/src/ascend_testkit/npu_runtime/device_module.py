"""The `torch.npu` device module of the emulated cards, and the `torch.accelerator` answers torch_npu gives.

torch_npu renames PrivateUse1 to `npu`, registers its C++ device (allocator, guard, hooks, kernels) and makes
`torch_npu.npu` the module `torch.npu`. Here the C++ half is `csrc/npu_device.cpp` (loaded by `extension`), and this
module adds what the device lane calls on `torch.npu` to the testkit torch_npu's `torch_npu.npu`, registers it as
`torch.npu`, and points the `torch.accelerator` memory / device / synchronize functions and `torch.Event` at it.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from typing import Any

import torch

from ascend_testkit.npu_runtime import graphs, streams
from ascend_testkit.npu_runtime.memory import EmulatedMemory

COUNT_ENV = "ASCEND_TESTKIT_NPU_COUNT"
ACCELERATOR_FUNCTIONS = ("device_count", "is_available", "current_accelerator", "set_device_index",
                         "current_device_index", "synchronize", "empty_cache", "memory_stats", "memory_allocated",
                         "max_memory_allocated", "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
                         "get_memory_info")


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    total_memory: int
    multi_processor_count: int = 24  # AI cores of a 910B1


class EmulatedCards:
    """`count` cards of `capacity` bytes each; this process drives `current` (set by `set_device`)."""

    def __init__(self, count: int, capacity: int, soc_name: str) -> None:
        torch.ops.npu_emu.configure(count, capacity)
        self.count = count
        self.soc_name = soc_name
        self.empty_cache_calls = 0
        self.seed: int | None = None

    @property
    def current(self) -> int:
        return torch.ops.npu_emu.current_device()

    def index(self, device: Any = None) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            index = device
        else:
            device = torch.device(device)
            index = self.current if device.index is None else device.index
        if not 0 <= index < self.count:
            raise RuntimeError(f"emulated NPU device {device!r}: index {index} outside 0..{self.count - 1} "
                               f"({COUNT_ENV}={self.count})")
        return index

    def memory(self, device: Any = None) -> EmulatedMemory:
        return EmulatedMemory(self.index(device))

    def set_device(self, device: Any) -> None:
        torch.ops.npu_emu.set_device(self.index(device))

    def record_seed(self, seed: int) -> None:
        self.seed = int(seed)

    def empty_cache(self) -> None:
        self.empty_cache_calls += 1  # nothing is cached: freed blocks went back at once

    def properties(self, device: Any = None) -> DeviceProperties:
        return DeviceProperties(self.soc_name, self.memory(device).capacity)


def card_count() -> int:
    text = os.environ.get(COUNT_ENV, "").strip() or "8"
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{COUNT_ENV}={text!r}: give a positive number of emulated cards")
    return int(text)


def runtime_functions(cards: EmulatedCards) -> dict[str, Any]:
    """What torch_npu.npu answers about the device, on the emulated cards."""
    return {
        "device_count": lambda: cards.count, "is_available": lambda: True,
        "current_device": lambda: cards.current, "set_device": cards.set_device,
        "get_device_name": lambda device=None: cards.properties(device).name,
        "get_device_properties": cards.properties,
        "mem_get_info": lambda device=None: cards.memory(device).mem_get_info(),
        "memory_stats": lambda device=None: cards.memory(device).stats(),
        "memory_allocated": lambda device=None: cards.memory(device).allocated(),
        "max_memory_allocated": lambda device=None: cards.memory(device).peak(),
        "memory_reserved": lambda device=None: cards.memory(device).allocated(),
        "max_memory_reserved": lambda device=None: cards.memory(device).peak(),
        "reset_peak_memory_stats": lambda device=None: cards.memory(device).reset_peak(),
        "empty_cache": cards.empty_cache,
        # Kernels on the card are the host's and draw from the CPU generator, which torch.manual_seed (the caller of
        # these, for every device module) seeds itself: seeding it again here would recurse.
        "manual_seed": cards.record_seed, "manual_seed_all": cards.record_seed, "initial_seed": torch.initial_seed,
        "_is_in_bad_fork": lambda: False, "_lazy_init": lambda: None, "is_initialized": lambda: True,
        "synchronize": streams.synchronize, "Stream": streams.Stream, "Event": streams.Event,
        "current_stream": streams.current_stream, "default_stream": streams.default_stream,
        "set_stream": streams.set_stream, "stream": streams.stream,
        **graphs.runtime_functions(),
    }


def accelerator_functions(cards: EmulatedCards) -> dict[str, Any]:
    npu = runtime_functions(cards)
    return {
        "device_count": npu["device_count"], "is_available": npu["is_available"],
        "current_accelerator": lambda check_available=False: torch.device("npu"),
        "set_device_index": cards.set_device, "current_device_index": npu["current_device"],
        "synchronize": npu["synchronize"], "empty_cache": npu["empty_cache"],
        "memory_stats": npu["memory_stats"], "memory_allocated": npu["memory_allocated"],
        "max_memory_allocated": npu["max_memory_allocated"], "memory_reserved": npu["memory_reserved"],
        "max_memory_reserved": npu["max_memory_reserved"], "reset_peak_memory_stats": npu["reset_peak_memory_stats"],
        "get_memory_info": npu["mem_get_info"],
    }


def register_npu_device(npu_module: types.ModuleType) -> None:
    """PrivateUse1 named `npu`, `torch.npu` bound to the module and the `Tensor.npu()` / `is_npu` methods, as
    `import torch_npu` does (the C++ device was registered when the extension loaded)."""
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    if getattr(torch, "npu", None) is not npu_module:
        torch._register_device_module("npu", npu_module)
    if not hasattr(torch.Tensor, "is_npu"):
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
