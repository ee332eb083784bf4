"""Sleep mode for the Ascend runners: "weights" and "kv_cache" tags, levels 1 and 2.

Level 1 moves the weights to host memory and drops the KV cache; level 2 drops both (weights must be reloaded
after waking). `wake_up(tags)` restores the weights from the host copies and allocates a fresh KV cache through
our allocator. In the simulated lane the "device" is the CPU too, so the memory saved is nil, but the device
tensors really are released and rebuilt, which is what the generation-unchanged check exercises; on the device
lane (a card, or the emulated NPU runtime) the card's memory is given back, asserted from its memory stats.

Waking gives the weights and the KV cache new memory, at other addresses, so captured graphs (which read the
addresses of capture time) are dropped when going to sleep and captured again once everything is awake (runners
with `release_graphs` / `recapture_graphs`); replaying them would read freed memory on a card (the emulated NPU
runtime refuses such a replay, which is how this was found).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.logger import init_logger

from ascend_platform import usage

logger = init_logger(__name__)

TAGS = ("weights", "kv_cache")


class SleepController:
    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.host_weights: dict[str, torch.Tensor] = {}
        self.shapes: dict[str, torch.Size] = {}
        self.sleeping: set[str] = set()
        self.level = 0
        self.graphs_released = False

    def _tensors(self) -> dict[str, torch.Tensor]:
        model = self.runner.get_model()
        named = dict(model.named_parameters())
        named.update(model.named_buffers())
        return named

    def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self.sleeping:
            logger.warning("Ascend worker is already asleep (%s)", sorted(self.sleeping))
            return
        released = 0
        buffers = {name for name, _ in self.runner.get_model().named_buffers()}
        for name, tensor in self._tensors().items():
            self.shapes[name] = tensor.shape
            if level == 1 or name in buffers:
                self.host_weights[name] = tensor.data.to("cpu", copy=True)
            released += tensor.data.numel() * tensor.data.element_size()
            tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        kv_bytes = getattr(self.runner.ascend_kv, "nbytes", 0)
        self.runner.release_kv_cache()
        release_graphs = getattr(self.runner, "release_graphs", None)
        self.graphs_released = bool(release_graphs and release_graphs())
        self.sleeping = set(TAGS)
        self.level = level
        usage.count(f"sleep.level{level}")
        logger.info("Ascend sleep level %d: released %.1f MiB of weights, %.1f MiB of KV cache", level,
                    released / 2**20, kv_bytes / 2**20)

    def wake_up(self, tags: list[str] | None = None) -> None:
        wanted = set(tags) if tags else set(TAGS)
        unknown = wanted - set(TAGS)
        if unknown:
            raise ValueError(f"unknown wake_up tag(s) {sorted(unknown)}; allowed: {list(TAGS)}")
        device = self.runner.device
        if "weights" in wanted & self.sleeping:
            for name, tensor in self._tensors().items():
                if name in self.host_weights:
                    tensor.data = self.host_weights.pop(name).to(device)
                else:  # level 2: storage comes back uninitialised until weights are reloaded
                    tensor.data = torch.empty(self.shapes[name], dtype=tensor.dtype, device=device)
            self.sleeping.discard("weights")
            usage.count("wake.weights")
        if "kv_cache" in wanted & self.sleeping:
            self.runner.reallocate_kv_cache()
            self.sleeping.discard("kv_cache")
            usage.count("wake.kv_cache")
        if not self.sleeping:
            self.level = 0
            if self.graphs_released:
                self.runner.recapture_graphs()
                self.graphs_released = False

    def state(self) -> dict[str, Any]:
        return {"sleeping": sorted(self.sleeping), "level": self.level,
                "weights_numel": sum(t.numel() for t in self._tensors().values()),
                "kv_bound": self.runner.ascend_kv is not None}
