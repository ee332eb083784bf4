"""The emulated NPU runtime (dev-only): what the device lane calls on `torch.npu` / `torch.accelerator`, on the CPU.

`ASCEND_TESTKIT_NPU_RUNTIME=emulated` in an engine process's environment (with `ASCEND_VLLM_SIMULATE` unset) makes
`install_if_requested()` (called by the testkit's vLLM general plugin and by an engine host's `--setup`) put in
place: the testkit's schema-faithful torch_npu, `ASCEND_TESTKIT_NPU_COUNT` cards (default 8) of
`ASCEND_TESTKIT_NPU_MEMORY` bytes each (default 1 GiB; '512MiB' works), streams and events, the `hccl` distributed
backend over gloo, and the device seam answering the CPU for the tensors of `npu`. Then vLLM resolves our `ascend`
platform to the device lane (`AscendNPUPlatform`, `NPUWorker`), because torch_npu imports and sees a device.

What it cannot cover (needs a card): NPU kernels and CANN itself, the `npu` tensor device (tensors live on the CPU,
so host/device copies are CPU copies and pinned memory is off), a caching allocator (memory is measured from live
tensors; transient peaks between measurements are not seen), asynchronous streams, ACL graphs (no `NPUGraph`
here), HCCL's own collectives (gloo runs them), triton-ascend (vLLM's Triton kernels have no backend here; Triton's
interpreter, the simulated lane's answer, cannot run vLLM's top-k/top-p sampler kernel without that lane's
overrides).
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

RUNTIME_ENV = "ASCEND_TESTKIT_NPU_RUNTIME"
EMULATED = "emulated"
_SIMULATE_ENV = "ASCEND_VLLM_SIMULATE"


@dataclass
class _Installed:
    cards: EmulatedCards
    saved_accelerator: dict[str, Any] = field(default_factory=dict)
    saved_event: Any = None
    dynamo_disabled: bool = False


_STATE: dict[str, _Installed] = {}


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
    from ascend_testkit.npu_runtime import hccl
    from ascend_testkit.torch_npu import card
    from ascend_testkit.torch_npu_plugin import install_fake_torch_npu

    module = install_fake_torch_npu()
    cards = EmulatedCards(card_count(), card.SOC_NAME)
    for name, function in runtime_functions(cards).items():
        setattr(module.npu, name, function)
    register_npu_device(module.npu)
    state = _Installed(cards, {n: getattr(torch.accelerator, n, None) for n in ACCELERATOR_FUNCTIONS}, torch.Event)
    for name, function in accelerator_functions(cards).items():
        setattr(torch.accelerator, name, function)
    torch.Event = module.npu.Event
    # No compiler targets the emulated card: functions vLLM wraps in torch.compile (the sampler's logprob gather,
    # ...) run eagerly, as they would under TORCHDYNAMO_DISABLE (on a card torch_npu's backend compiles them).
    state.dynamo_disabled = torch._dynamo.config.disable
    torch._dynamo.config.disable = True
    hccl.register()
    device_seam.back_npu_with(torch.device("cpu"))
    _STATE["current"] = state
    return cards


def cards() -> EmulatedCards:
    state = _STATE.get("current")
    if state is None:
        raise RuntimeError(f"the emulated NPU runtime is not installed ({RUNTIME_ENV}={EMULATED} or install())")
    return state.cards


def installed() -> bool:
    return "current" in _STATE


def uninstall() -> None:
    """Restore torch.accelerator, torch.Event and the device seam (PrivateUse1 keeps the name `npu`: torch cannot
    rename it twice)."""
    from ascend_platform import device_seam

    state = _STATE.pop("current", None)
    if state is None:
        return
    for name, function in state.saved_accelerator.items():
        if function is not None:
            setattr(torch.accelerator, name, function)
    torch.Event = state.saved_event
    torch._dynamo.config.disable = state.dynamo_disabled
    device_seam.back_npu_with(None)


__all__ = ["EMULATED", "RUNTIME_ENV", "cards", "install", "install_if_requested", "installed", "requested",
           "uninstall"]
