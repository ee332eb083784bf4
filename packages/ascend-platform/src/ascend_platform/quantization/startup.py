"""Start-up of a quantized model on the Ascend platform: which method serves it, checked before any weight loads.

`configure_quantization(vllm_config)` (from the platform's `check_and_update_config`) registers the Ascend methods,
detects a ModelSlim checkpoint by its `quant_model_description.json` (ModelSlim removes `quantization_config` from
config.json, so vLLM itself sees a float model), checks that the description and the checkpoint's tensors name the
same tensors, replaces vLLM's compressed-tensors config with the Ascend one, and refuses every other method by name.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ascend_platform.quantization.errors import QuantizationRefusedError, QuantizedCheckpointError

logger = logging.getLogger(__name__)

SUPPORTED_METHODS = ("ascend", "compressed-tensors")
_REGISTERED: list[bool] = []


def register_methods() -> None:
    """Register the "ascend" method and the Ascend compressed-tensors config with vLLM (once per process)."""
    if _REGISTERED:
        return
    from ascend_core.upstream import quantization_api
    from ascend_platform.quantization.compressed_tensors import AscendCompressedTensorsConfig
    from ascend_platform.quantization.modelslim import METHOD, AscendModelSlimConfig

    register = quantization_api().register_quantization_config
    register(METHOD)(AscendModelSlimConfig)
    register("compressed-tensors")(AscendCompressedTensorsConfig)
    _REGISTERED.append(True)


def description_path(model: str) -> Path | None:
    from ascend_platform.quantization.modelslim import DESCRIPTION_FILE

    path = Path(model) / DESCRIPTION_FILE
    return path if path.is_file() else None


def checkpoint_tensor_names(folder: Path) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return names


def check_description_tensors(folder: Path, description: dict) -> None:
    """Raise QuantizedCheckpointError naming the first tensor one side has and the other lacks."""
    from ascend_platform.quantization.modelslim import DESCRIPTION_FILE, tensor_types

    described = set(tensor_types(description))
    stored = checkpoint_tensor_names(folder)
    if not stored:
        return  # not a local safetensors checkpoint: vLLM's loader reports what it cannot find
    missing = sorted(described - stored)
    if missing:
        raise QuantizedCheckpointError(f"ascend quantization: {DESCRIPTION_FILE} names tensor {missing[0]!r}, which "
                                       f"the checkpoint in {folder} lacks ({len(missing)} such tensors)")
    undescribed = sorted(stored - described)
    if undescribed:
        raise QuantizedCheckpointError(f"ascend quantization: the checkpoint has tensor {undescribed[0]!r}, which "
                                       f"{DESCRIPTION_FILE} does not name ({len(undescribed)} such tensors)")


def configure_quantization(vllm_config) -> None:
    """Decide and check the model's quantization (see the module docstring); a no-op for a float model."""
    from ascend_core.upstream import rebuild_quant_config

    model_config = vllm_config.model_config
    if model_config is None:
        return
    described = description_path(model_config.model)
    method = model_config.quantization
    if described is None and method is None:
        return
    if method is not None and method not in SUPPORTED_METHODS:
        raise QuantizationRefusedError(f"quantization method {method!r} is not supported on the Ascend platform; "
                                       f"supported: {', '.join(SUPPORTED_METHODS)}")
    register_methods()
    if described is not None:
        if method not in (None, "ascend"):
            raise QuantizationRefusedError(
                f"{model_config.model} is a ModelSlim checkpoint ({described.name}) but quantization={method!r} "
                "was asked for; use 'ascend' (or leave it unset)")
        check_description_tensors(described.parent, json.loads(described.read_text()))
        model_config.quantization = "ascend"
    logger.info("Ascend quantization: %s (%s)", model_config.quantization, model_config.model)
    vllm_config.quant_config = rebuild_quant_config(vllm_config)
