"""The testkit's `vllm.general_plugins` entry point: the schema-faithful torch_npu in an engine process, on request.

`ASCEND_TESTKIT_TORCH_NPU=1` in an engine's environment puts `ascend_testkit.torch_npu` in `sys.modules` as
`torch_npu`, so `additional_config={"kernel_backend": "npu"}` runs `ascend_kernels`' torch_npu bindings in the
simulated lane. vLLM calls general plugins in every process it builds an engine in, each before its first engine
config (`EngineArgs.__post_init__`), engine core (`EngineCore.__init__`) or worker (`WorkerWrapperBase.init_worker`):
the engine host, `ascend-vllm serve`'s EngineCore process and multi-rank workers alike, with no `.pth` hook. The
platform plugin that runs earlier (`ascend_platform.registration.register`) does not probe torch_npu in the simulated
lane, so nothing has asked `ascend_kernels.npu_probe.torch_npu_status` (a cached answer) by then; if something did
and got "no", the install stops the process instead of leaving that stale answer in force.
"""

from __future__ import annotations

import os
import types

FAKE_ENV = "ASCEND_TESTKIT_TORCH_NPU"
_ON, _OFF = "1", ("", "0")


def requested() -> bool:
    value = os.environ.get(FAKE_ENV, "").strip()
    if value != _ON and value not in _OFF:
        raise ValueError(f"{FAKE_ENV}={value!r}: use '1' (the testkit's torch_npu) or '0' / unset (none)")
    return value == _ON


def install_if_requested() -> None:
    """Install the fake when `ASCEND_TESTKIT_TORCH_NPU=1`, and the emulated NPU runtime (with the fake) when
    `ASCEND_TESTKIT_NPU_RUNTIME=emulated` (idempotent: vLLM may call this more than once)."""
    from ascend_testkit import npu_runtime

    if npu_runtime.requested():
        npu_runtime.install()
    elif requested():
        install_fake_torch_npu()


def install_fake_torch_npu() -> types.ModuleType:
    """The testkit's torch_npu in `sys.modules`, refusing a process that already cached a "no torch_npu" answer."""
    from ascend_kernels.npu_probe import torch_npu_status
    from ascend_testkit import torch_npu as fake

    if torch_npu_status.cache_info().currsize and not torch_npu_status().usable:
        raise RuntimeError(f"{FAKE_ENV}=1 but this process asked for torch_npu before vLLM loaded the testkit's "
                           f"plugin, and keeps that answer: {torch_npu_status().reason}")
    module = fake.install()
    status = torch_npu_status()
    if not status.usable:
        raise RuntimeError(f"{FAKE_ENV}=1: the testkit's torch_npu is installed but the probe refuses it: "
                           f"{status.reason}")
    return module
