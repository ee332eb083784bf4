"""The start-up errors of quantized models: each names the method, layer or tensor that cannot be served."""

from __future__ import annotations


class QuantizationRefusedError(ValueError):
    """A quantization method, scheme or layer type this platform does not serve (the message names it)."""


class QuantizedCheckpointError(ValueError):
    """A quantized checkpoint whose description and tensors disagree (the message names the tensor)."""
