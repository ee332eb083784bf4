"""Which `ascend_kernels` backend each lane's workers select from `additional_config["kernel_backend"]`."""

from __future__ import annotations

import pytest

from ascend_platform.npu_platform import AscendNPUPlatform
from ascend_platform.plugin_config import AscendConfigError, parse_ascend_config
from ascend_platform.simulated_platform import SimulatedNPUPlatform


def test_the_simulated_lane_defaults_to_the_reference_kernels():
    assert SimulatedNPUPlatform.kernel_backend(parse_ascend_config({})) == "reference"
    assert SimulatedNPUPlatform.kernel_backend(parse_ascend_config({"kernel_backend": "reference"})) == "reference"


def test_npu_kernels_without_a_torch_npu_stop_start_up_with_the_backends_reason():
    with pytest.raises(AscendConfigError) as err:
        SimulatedNPUPlatform.kernel_backend(parse_ascend_config({"kernel_backend": "npu"}))
    message = str(err.value)
    assert "bad value 'npu' for key 'kernel_backend'" in message
    assert "kernel backend 'npu' is unavailable: torch_npu is not installed" in message
    assert message.endswith("allowed: 'auto', 'reference')")


def test_a_device_runs_npu_kernels_unless_told_otherwise():
    assert AscendNPUPlatform.kernel_backend(parse_ascend_config({})) == "npu"
    assert AscendNPUPlatform.kernel_backend(parse_ascend_config({"kernel_backend": "reference"})) == "reference"


def test_an_unknown_backend_names_the_key_and_the_allowed_values():
    with pytest.raises(AscendConfigError, match="bad value 'triton' for key 'kernel_backend' "
                                                "\\(allowed: 'auto', 'reference', 'npu'\\)"):
        parse_ascend_config({"kernel_backend": "triton"})
