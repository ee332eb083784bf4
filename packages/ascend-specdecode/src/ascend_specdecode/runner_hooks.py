"""Hooks a model runner calls to get this package's drafter and verifier (used by the Ascend platform's runners
and by `cpu_worker` on vLLM's own CPU platform). They replace attributes of one runner instance, explicitly, after
it is built; nothing is patched globally.
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger

logger = init_logger(__name__)


def _is_model_runner_v2(runner: Any) -> bool:
    return hasattr(runner, "speculator")


def install_speculative_decoding(runner: Any) -> None:
    """Give a freshly built model runner (V1 or MRV2, before `load_model`) the Ascend drafter and verifier.

    V1 keeps upstream's proposer and takes our rejection sampler. MRV2 takes our speculator (and keeps upstream's
    verifier, see `verification`).
    """
    spec = getattr(runner, "speculative_config", None)
    if spec is None:
        return
    from ascend_specdecode.config_check import validate_speculative_config

    validate_speculative_config(spec, runner.vllm_config.model_config)
    if _is_model_runner_v2(runner):
        from ascend_specdecode.dispatch import build_speculator

        if runner.speculator is not None:
            runner.speculator = build_speculator(runner.vllm_config, runner.device)
        return
    install_verifier(runner)


def install_verifier(runner: Any) -> None:
    """Swap the runner's rejection sampler for the Ascend one (same sampler, config and device)."""
    current = getattr(runner, "rejection_sampler", None)
    if current is None:
        return
    if _is_model_runner_v2(runner):
        return  # MRV2 keeps upstream's Triton verifier (see `verification`)
    from ascend_specdecode.verification import AscendRejectionSampler

    if isinstance(current, AscendRejectionSampler):
        return
    runner.rejection_sampler = AscendRejectionSampler.from_upstream(current, runner.speculative_config, runner.device)
    logger.info("Speculative decoding verifies drafts with AscendRejectionSampler (ascend_kernels)")
