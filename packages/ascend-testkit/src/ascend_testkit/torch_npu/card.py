"""The card and software stack the fake torch_npu stands for, where torch_npu's own code asks about them.

torch_npu's meta functions branch on the SoC version (`get_soc_version() < 260`: before Ascend 950) and the CANN
version; the fake answers as an Atlas A2 (Ascend 910B) with CANN 8.5.0, the pairing torch_npu 2.13 documents.
"""

from __future__ import annotations

from packaging.version import Version

SOC_VERSION = 220  # Ascend910B1: the A2 generation, below torch_npu's _ASCEND950_SOC_VERSION (260)
SOC_NAME = "Ascend910B1"
CANN_VERSION = "8.5.0"
DEVICE_COUNT = 1


def get_soc_version() -> int:
    return SOC_VERSION


def get_cann_version(module: str = "CANN") -> str:
    return CANN_VERSION


def is_gte_cann_version(version: str, module: str = "CANN") -> bool:
    return Version(CANN_VERSION) >= Version(version)
