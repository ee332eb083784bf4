"""Which model runner the simulated-NPU lane can run, chosen as vLLM chooses it, and one clear error when not.

vLLM 0.32 defaults to Model Runner V2 wherever Triton works (`VllmConfig.use_v2_model_runner`), and an Ascend device
has Triton (triton-ascend), so the simulated lane defaults to MRV2 too; `VLLM_USE_V2_MODEL_RUNNER=0` still selects V1
(and then the process never turns the Triton interpreter on). When MRV2 is asked for explicitly and this process
cannot run it, start-up stops with one `ModelRunnerV2Unavailable` naming what is missing, before vLLM's own
"Model Runner V2 requires Triton."; with the variable unset vLLM falls back to V1 and says so in its log.

Where the installed vLLM lacks what Ascend's MRV2 runner needs (`ascend_core.upstream.mrv2_unavailable_reason`,
e.g. the legacy lane's MRV2 has no allocation context or `bind_kv_cache_to_layers`), the interpreter stays off so
vLLM's default is the V1 runner, and an explicit request for MRV2 is refused at start-up with the probe's reason.
"""

from __future__ import annotations

import os

from vllm.logger import init_logger

from ascend_platform.simulated import triton_interpreter

logger = init_logger(__name__)

RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


class ModelRunnerV2Unavailable(ValueError):
    """MRV2 was requested in the simulated lane, which cannot run it in this process."""


def requested_runner() -> str:
    """'v2' or 'v1' when VLLM_USE_V2_MODEL_RUNNER says so, else 'default' (vLLM decides: MRV2 when Triton works)."""
    import vllm.envs as envs

    flag = envs.VLLM_USE_V2_MODEL_RUNNER
    return "default" if flag is None else ("v2" if flag else "v1")


def prepare_process() -> None:
    """Turn Triton's interpreter on unless the V1 runner is asked for (it needs no Triton, so V1 stays unchanged)."""
    if requested_runner() == "v1":
        return
    from ascend_core.upstream import mrv2_unavailable_reason

    refused = mrv2_unavailable_reason()
    if refused is not None:
        logger.info("simulated lane: Model Runner V2 is off, the V1 runner serves (%s)", refused)
        return
    lane = triton_interpreter.enable()
    if not lane.usable:
        logger.debug("simulated lane: no Triton for Model Runner V2 (%s)", lane.reason)


def why_unavailable() -> str | None:
    """What keeps MRV2 from running in this process, or None when vLLM sees a usable Triton."""
    from ascend_core.upstream import mrv2_unavailable_reason

    refused = mrv2_unavailable_reason()
    if refused is not None:
        return refused
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        return None
    lane = triton_interpreter.status()
    if not lane.usable:
        return lane.reason
    if not triton_interpreter.enabled():
        return ("Triton's interpreter was not enabled in this process (the simulated platform turns it on when "
                f"vLLM resolves it, unless {RUNNER_ENV}=0)")
    return ("vLLM decided HAS_TRITON before the simulated platform was resolved (vllm.triton_utils was imported "
            "too early), so it never saw the interpreter backend")


def check_runner_request(vllm_config: object) -> None:
    """Called from the platform's config hook, before vLLM validates the runner choice."""
    requested = requested_runner()
    if requested == "v1":
        return
    if requested == "default":
        # vLLM forces MRV2 for some configs (PCP, dspark) whatever Triton says: refuse those here too.
        from ascend_core.upstream import mrv2_unavailable_reason

        refused = mrv2_unavailable_reason()
        if refused is not None and getattr(vllm_config, "use_v2_model_runner", False):
            raise ModelRunnerV2Unavailable(
                f"this configuration needs Model Runner V2, which the Ascend plugin cannot run on the installed "
                f"vLLM: {refused}")
        return
    missing = why_unavailable()
    if missing is not None:
        raise ModelRunnerV2Unavailable(
            f"Model Runner V2 was requested ({RUNNER_ENV}={os.environ.get(RUNNER_ENV)!r}) but the simulated-NPU lane "
            f"cannot run it here: {missing}. Unset {RUNNER_ENV} or set it to 0 for the V1 runner.")
