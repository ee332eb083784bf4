"""Subcommands of `ascend-vllm`, one module each (see ascend_vllm.cli)."""
