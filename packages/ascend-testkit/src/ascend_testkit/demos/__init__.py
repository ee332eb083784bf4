"""The demos behind `ascend-vllm demo` and `ascend-vllm demo-pd` (development tools: they need the testkit)."""
