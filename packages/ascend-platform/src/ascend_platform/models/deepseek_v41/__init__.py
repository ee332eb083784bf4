"""DeepSeek V4.1 (text model) on Ascend: the attention side (`attention`, `compressor`, `indexer`, their cache layers
in `caches` and metadata builders in `backends`) and the model that builds it (`model`).

vLLM's V4.1 implementation is CUDA/ROCm only (streams, events, Triton and FlashMLA everywhere), so unlike the V4
port nothing here subclasses its layers: the modules keep vLLM's parameter names and cache-layer kinds (so its weight
mapper, KV planner and managers apply unchanged) and run every fused step on `ascend_kernels`.
"""
