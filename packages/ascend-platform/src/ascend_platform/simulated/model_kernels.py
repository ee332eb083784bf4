"""Stand-ins for Triton kernels of vLLM's model code that Triton's interpreter computes wrong, each vLLM's own eager
twin of the kernel (what vLLM-CPU, without Triton, runs instead).

`_bilinear_pos_embed_kernel` (Qwen3-VL's vision tower, and Qwen3.5's, which is Qwen3-VL's): the interpreter's
bfloat16 casts of the interpolation weights give values near bfloat16's range (seen: 3.35e38) instead of the
interpolated table, so a bfloat16 vision tower in the simulated lane's MRV2 (where the interpreter is on) saw inf and
NaN position embeddings and the model generated token 0; float32 was right. A device's Triton (triton-ascend)
compiles the kernel and is not concerned.
"""

from __future__ import annotations

BILINEAR_POS_EMBED = "vllm.model_executor.models.qwen3_vl._bilinear_pos_embed_kernel"


def bilinear_pos_embed(embed_ptr, output_ptr, H, W, h_scale, w_scale, NUM_GRID, M_SIZE, HIDDEN_DIM,  # noqa: N803
                       BLOCK_D=None, **_launch):  # noqa: N803
    """The kernel's rows (its grid: one program per output row, `t` frames of H x W patches in spatial-merge order)
    from vLLM's `pos_embed_interpolate_native`: bilinear over the `NUM_GRID`-square table, in the output's dtype."""
    from vllm.model_executor.models.qwen3_vl import pos_embed_interpolate_native

    frames = output_ptr.shape[0] // (H * W)
    output_ptr.copy_(pos_embed_interpolate_native(embed_ptr, frames, H, W, NUM_GRID, M_SIZE, output_ptr.dtype))
