"""Run this package's speculative-decoding glue on vLLM's own CPU platform, without the Ascend platform.

`LLM(..., worker_cls="ascend_specdecode.cpu_worker.SpecDecodeCPUWorker")` gives a vLLM CPU worker whose runner
verifies drafts with `AscendRejectionSampler` (the `ascend_kernels` rejection sampler) on the V1 runner and, on
Model Runner V2, drafts with the speculator `select_speculator` picks. Everything else is the stock CPU worker.
The Ascend platform wires the same pieces into its own runners with `install_speculative_decoding`.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.worker.cpu_worker import CPUWorker

from ascend_specdecode.runner_hooks import install_speculative_decoding, install_verifier


class SpecDecodeCPUWorker(CPUWorker):
    """vLLM's CPU worker with this package's drafter and verifier installed in its model runner."""

    def init_device(self) -> None:
        super().init_device()
        install_speculative_decoding(self.model_runner)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        install_verifier(self.model_runner)
