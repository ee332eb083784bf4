"""EAGLE and MTP: autoregressive drafting from the target's hidden states (upstream `TargetDependentARSpeculator`)."""

from __future__ import annotations

from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator
from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import TargetDependentARSpeculator

from ascend_specdecode.speculators.base import AscendSpeculatorMixin


class AscendAutoregressiveSpeculator(AscendSpeculatorMixin, TargetDependentARSpeculator):
    """Base of the Ascend EAGLE and MTP speculators (abstract: the subclass loads its draft model)."""


class AscendEagleSpeculator(AscendAutoregressiveSpeculator, EagleSpeculator):
    """EAGLE / EAGLE-3."""


class AscendMTPSpeculator(AscendAutoregressiveSpeculator, MTPSpeculator):
    """Multi-token prediction layers shipped inside the target checkpoint."""
