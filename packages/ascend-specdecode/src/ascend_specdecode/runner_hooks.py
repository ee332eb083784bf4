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

    V1 keeps upstream's proposer and takes our rejection sampler. MRV2 takes our speculator now and our verifier
    once the model is loaded (`install_verifier`: MRV2 builds its verifier in `load_model`).
    """
    spec = getattr(runner, "speculative_config", None)
    if spec is None:
        return
    from ascend_specdecode.config_check import validate_speculative_config

    validate_speculative_config(spec, runner.vllm_config.model_config)
    if _is_model_runner_v2(runner):
        from ascend_core.upstream import mrv2_unavailable_reason
        from ascend_specdecode.dispatch import build_speculator

        refused = mrv2_unavailable_reason()
        if refused is not None:  # the Ascend MRV2 speculators build on what this vLLM's MRV2 lacks
            raise RuntimeError(f"Ascend Model Runner V2 speculators cannot run here: {refused}")

        if runner.speculator is not None:
            runner.speculator = build_speculator(runner.vllm_config, runner.device,
                                                 getattr(runner, "req_states", None))
        return
    install_verifier(runner)


def install_verifier(runner: Any) -> None:
    """Swap the runner's rejection sampler for the Ascend one (same sampler, config and device); idempotent."""
    current = getattr(runner, "rejection_sampler", None)
    if current is None:
        return
    if _is_model_runner_v2(runner):
        _install_mrv2_verifier(runner, current)
        return
    from ascend_specdecode.verification import AscendRejectionSampler

    if isinstance(current, AscendRejectionSampler):
        return
    runner.rejection_sampler = AscendRejectionSampler.from_upstream(current, runner.speculative_config, runner.device)
    logger.info("Speculative decoding verifies drafts with AscendRejectionSampler (ascend_kernels)")


def _install_mrv2_verifier(runner: Any, current: Any) -> None:
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    from ascend_specdecode.mrv2_verification import AscendMRV2RejectionSampler

    if isinstance(current, AscendMRV2RejectionSampler):
        return
    if type(current) is not RejectionSampler:
        # A model state's own sampler pair (MRV2's `custom_sampler` hook) verifies its own way: leave it.
        logger.info("Speculative decoding keeps %s, the model's own verifier", type(current).__qualname__)
        return
    runner.rejection_sampler = AscendMRV2RejectionSampler.from_upstream(current)
    logger.info("Speculative decoding verifies greedy drafts with AscendMRV2RejectionSampler (ascend_kernels)")
