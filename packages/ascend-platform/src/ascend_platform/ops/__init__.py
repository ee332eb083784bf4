"""vLLM custom ops replaced by `ascend_kernels` ops (registered out of tree, once per process)."""
