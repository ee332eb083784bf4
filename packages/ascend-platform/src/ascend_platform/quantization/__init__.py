"""Quantized models on the Ascend platform: ModelSlim's "ascend" format and compressed-tensors int8 W8A8.

- `startup`: `configure_quantization(vllm_config)`, the platform's start-up step (detect, check, refuse).
- `modelslim` / `modelslim_schemes`: the "ascend" method and its W8A8, W8A8_DYNAMIC, W8A16 linear schemes.
- `compressed_tensors`: vLLM's compressed-tensors parsing with the int8 W8A8 linears on our kernels.
- `int8_matmuls`: the three quantized linear forms both formats reduce to (through `ascend_kernels`).
- `moe_schemes`: int8 / int4 routed experts with dynamic per-token activations (both formats' MoE layers).
"""

from ascend_platform.quantization.errors import QuantizationRefusedError, QuantizedCheckpointError
from ascend_platform.quantization.startup import SUPPORTED_METHODS, configure_quantization

__all__ = ["SUPPORTED_METHODS", "QuantizationRefusedError", "QuantizedCheckpointError", "configure_quantization"]
