"""When a layer's KV is really in memory: the marker a layerwise push waits for before it sends the layer's pages.

vLLM calls `save_kv_layer` right after the attention op that writes the layer's cache, but on a device that write is
only queued on the current stream when the call returns. `kv_written_on(device)` records an event there; the push
thread waits for it (bounded) before the transfer reads the pages, so the forward pass never waits and the transfer
never reads a page the device has not finished writing. Host memory (vLLM's CPU build, the simulated-NPU lane) is
written synchronously: its marker is complete from the start. The event is torch's device-generic `torch.Event`,
which every accelerator backend (CUDA, torch_npu's PrivateUse1, XPU) implements.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

# Pause between polls of a device event on the push thread (never on the engine's thread).
_POLL_S = 50e-6


class KVWritten(Protocol):
    def wait(self, timeout_s: float) -> bool:
        """True once the writes queued before the marker are done; False if `timeout_s` passed first."""


class _AlreadyWritten:
    def wait(self, timeout_s: float) -> bool:
        return True


WRITTEN = _AlreadyWritten()
"""The marker of memory that is written by the time the caller returns (host memory; earlier, synchronised steps)."""


class _DeviceEvent:
    def __init__(self, device: torch.device):
        self.event = torch.Event(device=device)
        self.event.record()  # on the device's current stream: after the cache write the forward just queued

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.event.query():
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL_S)
        return True


def kv_written_on(device: torch.device | None) -> KVWritten:
    """A marker for the KV writes queued so far on `device`'s current stream (None or host: already written)."""
    if device is None or device.type == "cpu":
        return WRITTEN
    return _DeviceEvent(device)
