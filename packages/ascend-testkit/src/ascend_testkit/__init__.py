"""Development-only tooling of the ascend-vllm workspace (never a dependency of a runtime package).

- `ascend_testkit.models`: tiny random checkpoints built offline (the tiny Llama, drafts for each speculative method).
- `ascend_testkit.engine`: the one engine harness: real vLLM engines in child processes, driven over a pipe.
- `ascend_testkit.netns`: a loopback-only network namespace for anything that starts Mooncake.
- `ascend_testkit.compare`: vLLM's `check_logprobs_close` rule.
- `ascend_testkit.cp_step_driver`: the two-rank reference context-parallel step driver.
- `ascend_testkit.demos`: `ascend-vllm demo`, `demo-pd` (registered as `ascend_vllm.commands` entry points).
"""
