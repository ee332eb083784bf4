"""Probes the NPU-kernel engine tests run in a worker (`EngineHost.rpc("ascend_testkit.torch_npu_probes:<name>")`)."""

from __future__ import annotations

from typing import Any


def fake_calls(worker: Any) -> dict[str, int]:
    """The testkit torch_npu's own per-op call counts in this worker's process ({} when it is not installed there)."""
    from ascend_testkit import torch_npu as fake

    return fake.calls()
