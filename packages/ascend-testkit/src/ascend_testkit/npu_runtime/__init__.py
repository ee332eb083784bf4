"""The emulated NPU runtime (dev-only): an `npu` torch device with host memory behind it, and what the device lane
calls on `torch.npu` / `torch.accelerator`.

`ASCEND_TESTKIT_NPU_RUNTIME=emulated` in an engine process's environment (with `ASCEND_VLLM_SIMULATE` unset) makes
`install_if_requested()` (called at start-up by every Python process of an environment made with `process_env()`,
through its `startup/sitecustomize.py`, as well as by the testkit's vLLM general plugin and an engine host's
`--setup`) put in place: the testkit's schema-faithful torch_npu; `ASCEND_TESTKIT_NPU_COUNT` cards (default 8) of
`ASCEND_TESTKIT_NPU_MEMORY` bytes each (default 1 GiB; '512MiB' works) as PrivateUse1 named `npu`
(`csrc/npu_device.cpp`: allocator, device guard, hooks, pinned host memory, kernels = the CPU's through a boxed
fallback); streams and events; ACL graphs (`graphs`: capture records the dispatched ops, replay re-runs them on the
captured tensors); the `hccl` distributed backend over gloo; Triton's interpreter in triton-ascend's place. Then vLLM
resolves our `ascend` platform to the device lane (`AscendNPUPlatform`, `NPUWorker`), because torch_npu imports and
sees a device, and the device lane runs on `npu:<rank>` tensors as on a card.

What it cannot cover (needs a card): CANN and the NPU kernels themselves (the kernels are the CPU's and the
reference / schema-faithful torch_npu ops), asynchronous streams and events (work is synchronous, so a missing wait
cannot show), a caching allocator's fragmentation and reserve (allocated = reserved here), graph memory shared
within a pool (each graph keeps its own tensors, so graphs take more here than on a card), graph-parameter updates,
HCCL's own collectives and their in-graph capture (gloo runs them, re-run at each replay), triton-ascend's
compiler, a per-thread current device (one process-wide current device here), torch.compile's inductor for NPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ascend_testkit.npu_runtime.device_module import (
    ACCELERATOR_FUNCTIONS,
    EmulatedCards,
    accelerator_functions,
    card_count,
    register_npu_device,
    runtime_functions,
)
from ascend_testkit.npu_runtime.memory import capacity_from_env

RUNTIME_ENV = "ASCEND_TESTKIT_NPU_RUNTIME"
EMULATED = "emulated"
_SIMULATE_ENV = "ASCEND_VLLM_SIMULATE"


@dataclass
class _Installed:
    cards: EmulatedCards
    saved_accelerator: dict[str, Any] = field(default_factory=dict)
    saved_event: Any = None
    triton: str = ""


_STATE: dict[str, _Installed] = {}


def process_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the emulated runtime in place in every process started
    with it: the variable, and the start-up hook (`startup/sitecustomize.py`) first on PYTHONPATH."""
    from pathlib import Path

    env = dict(os.environ if base is None else base)
    env.pop(_SIMULATE_ENV, None)
    env[RUNTIME_ENV] = EMULATED
    startup = str(Path(__file__).with_name("startup"))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != startup]
    env["PYTHONPATH"] = os.pathsep.join([startup, *paths])
    return env


def requested() -> bool:
    value = os.environ.get(RUNTIME_ENV, "").strip()
    if value not in ("", EMULATED):
        raise ValueError(f"{RUNTIME_ENV}={value!r}: use {EMULATED!r} or leave it unset")
    if value == EMULATED and os.environ.get(_SIMULATE_ENV, "").strip() == "1":
        raise ValueError(f"{RUNTIME_ENV}={EMULATED} runs the device lane; unset {_SIMULATE_ENV}=1 (the simulated lane)")
    return value == EMULATED


def install_if_requested() -> None:
    if requested():
        install()


def install() -> EmulatedCards:
    """Idempotent. The torch_npu fake is installed first (its `torch_npu.npu` module becomes `torch.npu`)."""
    if "current" in _STATE:
        return _STATE["current"].cards
    from ascend_platform import device_seam
    from ascend_testkit.npu_runtime import extension, hccl, triton
    from ascend_testkit.torch_npu import card
    from ascend_testkit.torch_npu_plugin import install_fake_torch_npu

    extension.load()
    module = install_fake_torch_npu()
    cards = EmulatedCards(card_count(), capacity_from_env(), card.SOC_NAME)
    for name, function in runtime_functions(cards).items():
        setattr(module.npu, name, function)
    register_npu_device(module.npu)
    state = _Installed(cards, {n: getattr(torch.accelerator, n, None) for n in ACCELERATOR_FUNCTIONS}, torch.Event)
    for name, function in accelerator_functions(cards).items():
        setattr(torch.accelerator, name, function)
    torch.Event = module.npu.Event
    hccl.register()
    state.triton = triton.install()
    # The card's kernels are the host's and it has no Triton device: vLLM's Triton kernels run the host's way.
    device_seam.back_npu_with(torch.device("cpu"))
    _STATE["current"] = state
    return cards


def cards() -> EmulatedCards:
    state = _STATE.get("current")
    if state is None:
        raise RuntimeError(f"the emulated NPU runtime is not installed ({RUNTIME_ENV}={EMULATED} or install())")
    return state.cards


def card_report(device: Any = None) -> dict[str, Any]:
    """This process's card as a test reads it: memory (bytes) and what the graphs and streams were asked to do."""
    from ascend_testkit.npu_runtime import graphs, streams

    memory = cards().memory(device)
    return {"allocated": memory.allocated(), "peak": memory.peak(), "capacity": memory.capacity,
            "graphs": dict(graphs.COUNTS), "streams": dict(streams.COUNTS)}


def installed() -> bool:
    return "current" in _STATE


def uninstall() -> None:
    """Restore torch.accelerator, torch.Event and the device seam (PrivateUse1 keeps the name `npu` and its C++
    device: torch can neither rename it twice nor unload a library)."""
    from ascend_platform import device_seam

    state = _STATE.pop("current", None)
    if state is None:
        return
    for name, function in state.saved_accelerator.items():
        if function is not None:
            setattr(torch.accelerator, name, function)
    torch.Event = state.saved_event
    device_seam.back_npu_with(None)


__all__ = ["EMULATED", "RUNTIME_ENV", "card_report", "cards", "install", "install_if_requested", "installed",
           "process_env", "requested", "uninstall"]
