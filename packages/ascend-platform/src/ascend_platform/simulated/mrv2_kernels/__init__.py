"""Torch stand-ins for the Triton kernels Model Runner V2 launches on every step (simulated-NPU lane).

Each function takes its vLLM kernel's parameters in the kernel's order (tensors where the kernel takes pointers,
plus the kernel's constexprs and launch options as keywords) and does what the whole launch grid would do; vLLM's
kernel dispatcher (`vllm.triton_utils.dispatcher.register_kernels`, called from the platform's
`register_triton_kernel_overrides`) routes launches here. `ascend_platform.simulated.kernel_overrides` lists them.
"""
