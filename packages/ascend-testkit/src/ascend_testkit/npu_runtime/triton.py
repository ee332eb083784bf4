"""triton-ascend's place on the emulated card: Triton's interpreter, as the simulated lane runs it.

On an Ascend host triton-ascend compiles vLLM's Triton kernels, so vLLM sees Triton (`HAS_TRITON`) and defaults to
Model Runner V2. The emulated card has no Triton device; the kernels run the way the simulated lane runs them:
Triton's interpreter announced as Triton's "cpu" backend (`ascend_platform.simulated.triton_interpreter`), the
per-step kernels replaced by the stand-ins `AscendNPUPlatform.register_triton_kernel_overrides` registers on a
host-backed card, and the MRV2 runner's block tables through the same stand-in (`AscendRunnerV2Mixin`). Both lanes
then run MRV2 with the same kernels and differ only by the device runtime.

Turned on at install, before vLLM decides `HAS_TRITON` (`vllm.triton_utils` is imported when the first engine
config is built), unless `VLLM_USE_V2_MODEL_RUNNER=0` asks for the V1 runner, which needs no Triton (as on a card
without triton-ascend: vLLM then serves V1).
"""

from __future__ import annotations

import os
import sys

RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def wanted() -> bool:
    return os.environ.get(RUNNER_ENV, "").strip().lower() not in ("0", "false")


def install() -> str:
    """'interpreter' when vLLM will see Triton here, else why not ('v1 asked for', or the interpreter's reason)."""
    if not wanted():
        return f"off ({RUNNER_ENV}=0)"
    from ascend_platform.simulated import triton_interpreter

    if "vllm.triton_utils.importing" in sys.modules and not triton_interpreter.enabled():
        # vLLM has decided HAS_TRITON already: turning the interpreter on now would leave MRV2 refused anyway.
        return "off (vllm.triton_utils was imported before the emulated runtime was installed)"
    lane = triton_interpreter.enable()
    return lane.mode if lane.usable else f"off ({lane.reason})"
