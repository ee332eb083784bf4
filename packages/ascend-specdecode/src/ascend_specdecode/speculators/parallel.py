"""DFlash, DFlash2 and DSpark: block-parallel drafting conditioned on target features (upstream speculators)."""

from __future__ import annotations

from typing import Any

from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator
from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

from ascend_specdecode.speculators.base import AscendSpeculatorMixin


class AscendDFlashSpeculator(AscendSpeculatorMixin, DFlashSpeculator):
    """DFlash: one draft forward proposes a whole block."""


class AscendDFlash2Speculator(AscendSpeculatorMixin, DFlash2Speculator):
    """DFlash2: DFlash plus a candidate head; its draft model is built through the factories in `models.dflash2`.

    Each draft block is scored by the draft's candidate selector and walked by the candidate sampler; DFlash1 (what
    vLLM's V1 proposer would run for the same checkpoint) samples the mask positions' logits directly. The count
    `candidate_walks` shows which ran.
    """

    def _score_candidates(self, *args: Any, **kwargs: Any) -> Any:
        self.ascend_counts["candidate_walks"] += 1
        return super()._score_candidates(*args, **kwargs)


class AscendDSparkSpeculator(AscendSpeculatorMixin, DSparkSpeculator):
    """DSpark (a DFlash subclass upstream, so it is dispatched before DFlash): a parallel block, then the Markov
    head samples it left to right (`markov_blocks` counts those sequential passes)."""

    def _sample_sequential(self, *args: Any, **kwargs: Any) -> Any:
        self.ascend_counts["markov_blocks"] += 1
        return super()._sample_sequential(*args, **kwargs)
