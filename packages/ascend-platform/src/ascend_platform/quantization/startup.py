"""Start-up of a quantized model on the Ascend platform: which method serves it, checked before any weight loads.

`configure_quantization(vllm_config)` (from the platform's `check_and_update_config`) registers the Ascend methods,
detects a ModelSlim checkpoint by its `quant_model_description.json` (ModelSlim removes `quantization_config` from
config.json, so vLLM itself sees a float model), checks that the description and the checkpoint's tensors name the
same tensors, replaces vLLM's compressed-tensors config with the Ascend one, and refuses every other method by name.
A C8 (int8 KV cache) checkpoint is refused here, before any layer is built, where its KV cache cannot be served: an
MLA model, a KV cache dtype asked for explicitly, prefill context parallel (its K/V gather writes float caches) and
KV connectors (their transfers, offloads and pool keys have not been run over int8 pages and their scales).
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


def refuse_unserved_kv_cache(vllm_config, description: dict) -> None:
    """Refuse, naming what conflicts, a C8 checkpoint on an engine whose KV cache C8 cannot be (module docstring)."""
    from ascend_platform.quantization.modelslim import kv_cache_type

    kind = kv_cache_type(description)
    if kind is None:
        return
    model_config, parallel = vllm_config.model_config, vllm_config.parallel_config
    cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
    reason = None
    if model_config.use_mla:
        reason = "an MLA model (C8 runs on dense MHA / GQA attention; the latent cache stays float)"
    elif cache_dtype != "auto":
        reason = f"kv_cache_dtype={cache_dtype!r} (C8 makes the KV cache int8 itself: leave it 'auto')"
    elif getattr(parallel, "prefill_context_parallel_size", 1) > 1:
        reason = "prefill context parallel (its gathered keys and values are written to float caches)"
    elif vllm_config.kv_transfer_config is not None:
        reason = "a KV connector (transfers and offloads of int8 pages are not tested yet)"
    if reason is not None:
        raise QuantizationRefusedError(f"ascend quantization: kv_cache_type {kind!r} (int8 KV cache) of "
                                       f"{model_config.model} is not supported with {reason}")


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
        description = json.loads(described.read_text())
        check_description_tensors(described.parent, description)
        refuse_unserved_kv_cache(vllm_config, description)
        model_config.quantization = "ascend"
    logger.info("Ascend quantization: %s (%s)", model_config.quantization, model_config.model)
    vllm_config.quant_config = rebuild_quant_config(vllm_config)
