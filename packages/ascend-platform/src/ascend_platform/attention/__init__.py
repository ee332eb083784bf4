"""Attention backends of the Ascend platform (all kernels reached through `ascend_kernels`)."""
