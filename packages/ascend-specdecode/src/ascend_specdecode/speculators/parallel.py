"""DFlash, DFlash2 and DSpark: block-parallel drafting conditioned on target features (upstream speculators)."""

from __future__ import annotations

from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator
from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

from ascend_specdecode.speculators.base import AscendSpeculatorMixin


class AscendDFlashSpeculator(AscendSpeculatorMixin, DFlashSpeculator):
    """DFlash: one draft forward proposes a whole block."""


class AscendDFlash2Speculator(AscendSpeculatorMixin, DFlash2Speculator):
    """DFlash2: DFlash plus a candidate head; its draft model is built through the factories in `models.dflash2`."""


class AscendDSparkSpeculator(AscendSpeculatorMixin, DSparkSpeculator):
    """DSpark (a DFlash subclass upstream, so it is dispatched before DFlash)."""
