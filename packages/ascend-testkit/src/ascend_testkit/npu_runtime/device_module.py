"""The `torch.npu` device module of the emulated cards, and the `torch.accelerator` answers torch_npu gives.

torch_npu renames PrivateUse1 to `npu` and registers `torch_npu.npu` as `torch.npu`; its C++ hooks make
`torch.accelerator.*` and `torch.Event` address the card. This runtime does the Python half of that: it adds the
runtime functions the device lane calls to the testkit torch_npu's `torch_npu.npu` module, registers it as
`torch.npu`, and points the `torch.accelerator` memory / device / synchronize functions and `torch.Event` at it.
Tensors are not placed on `npu` (PrivateUse1 has no kernels here: creating one fails loudly); the device lane asks
`ascend_platform.device_seam` for its tensor device, which this runtime answers with the CPU.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from typing import Any

import torch

from ascend_testkit.npu_runtime import streams
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
    """`count` cards of one capacity each; this process drives `current` (set by `set_device`)."""

    def __init__(self, count: int, soc_name: str) -> None:
        self.count = count
        self.soc_name = soc_name
        self.memory = EmulatedMemory.from_env()  # one card per process, as a worker drives one
        self.current = 0
        self.empty_cache_calls = 0
        self.seed: int | None = None

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

    def set_device(self, device: Any) -> None:
        self.current = self.index(device)

    def record_seed(self, seed: int) -> None:
        self.seed = int(seed)

    def empty_cache(self) -> None:
        self.empty_cache_calls += 1

    def properties(self, device: Any = None) -> DeviceProperties:
        self.index(device)
        return DeviceProperties(self.soc_name, self.memory.capacity)


def card_count() -> int:
    text = os.environ.get(COUNT_ENV, "").strip() or "8"
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{COUNT_ENV}={text!r}: give a positive number of emulated cards")
    return int(text)


def runtime_functions(cards: EmulatedCards) -> dict[str, Any]:
    """What torch_npu.npu answers about the device, on the emulated cards."""
    memory = cards.memory
    return {
        "device_count": lambda: cards.count, "is_available": lambda: True,
        "current_device": lambda: cards.current, "set_device": cards.set_device,
        "get_device_name": lambda device=None: cards.properties(device).name,
        "get_device_properties": cards.properties,
        "mem_get_info": lambda device=None: memory.mem_get_info(),
        "memory_stats": lambda device=None: memory.stats(),
        "memory_allocated": lambda device=None: memory.allocated(),
        "max_memory_allocated": lambda device=None: memory.peak(),
        "memory_reserved": lambda device=None: memory.allocated(),
        "max_memory_reserved": lambda device=None: memory.peak(),
        "reset_peak_memory_stats": lambda device=None: memory.reset_peak(),
        "empty_cache": cards.empty_cache,
        # The card's tensors are CPU tensors, drawn from the CPU generator, which torch.manual_seed (the caller of
        # these, for every device module) seeds itself: seeding it again here would recurse.
        "manual_seed": cards.record_seed, "manual_seed_all": cards.record_seed, "initial_seed": torch.initial_seed,
        "_is_in_bad_fork": lambda: False,
        "synchronize": streams.synchronize, "Stream": streams.Stream, "Event": streams.Event,
        "current_stream": streams.current_stream, "default_stream": streams.default_stream,
        "set_stream": streams.set_stream, "stream": streams.stream,
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
    """PrivateUse1 named `npu` and `torch.npu` bound to the module, as `import torch_npu` does."""
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    if getattr(torch, "npu", None) is not npu_module:
        torch._register_device_module("npu", npu_module)
