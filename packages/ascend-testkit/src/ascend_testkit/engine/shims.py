"""Set-up functions an engine host can run first (`EngineHost(..., setup=["ascend_testkit.engine.shims:<name>"])`).

Only for reference engines that are not ours: our platform needs no shim.
"""

from __future__ import annotations


def cpu_accelerator_index() -> None:
    """vLLM's in-tree MooncakeConnector asks `torch.accelerator.current_device_index()`, which raises on a CPU-only
    torch; the kv_transfer benchmark runs that connector as its baseline on vLLM's CPU platform."""
    import torch

    try:
        torch.accelerator.current_device_index()
    except RuntimeError:
        torch.accelerator.current_device_index = lambda: 0



def without_triton() -> None:
    """Make this process look like a machine without the `triton` package (imports of it fail, as when absent)."""
    import sys

    sys.modules["triton"] = None  # type: ignore[assignment]
