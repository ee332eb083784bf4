"""Ascend KV cache: specs registered with vLLM (`specs`), layouts (`layout`), placements checked against the
planner's descriptors (`placement`), per-layer views (`views`) and the allocator (`allocator`).

Import the submodules directly; this package imports nothing heavy and registers nothing by itself.
"""
