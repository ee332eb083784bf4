"""Decode throughput of a started engine host, measured the same way by every benchmark that compares engines.

A warm-up generation first (compilation, first-touch allocations), then a one-token generation to time the prefill,
then the measured generation: decode tokens per second exclude the prefill step that produced each first token.
On the simulated lane the host's per-kernel seconds over the measured generation come with it.
"""

from __future__ import annotations

from typing import Any

from ascend_testkit.models.tiny_llama import prompt_of_length


def measure_decode(host: Any, max_tokens: int, num_prompts: int = 4, prompt_len: int = 8, **sampling: Any) -> dict:
    """Run the three generations on `host` (an EngineHost already started) and return the figures; `sampling`
    (e.g. temperature, seed) applies to all three (greedy without)."""
    prompts = [prompt_of_length(prompt_len, offset=13 * i) for i in range(num_prompts)]
    host.generate(prompts, max_tokens=4, ignore_eos=True, **sampling)
    prefill_s = host.generate(prompts, max_tokens=1, ignore_eos=True, **sampling)["seconds"]
    before = host.usage()[0] if host.lane == "simulated" else None
    gen = host.generate(prompts, max_tokens=max_tokens, ignore_eos=True, **sampling)
    tokens = sum(len(o["token_ids"]) for o in gen["outputs"])
    decode_tokens = tokens - len(prompts)  # each prompt's first token comes from the prefill step
    result: dict = {"generate_s": gen["seconds"], "output_tokens": tokens,
                    "decode_tok_s": decode_tokens / max(gen["seconds"] - prefill_s, 1e-9),
                    "end_to_end_tok_s": tokens / gen["seconds"]}
    if before is not None:
        after = host.usage()[0]
        seconds = {k: after["seconds"].get(k, 0.0) - before["seconds"].get(k, 0.0) for k in after["seconds"]}
        result["our_kernels_s"] = {k: round(v, 4) for k, v in sorted(seconds.items())}
        result["our_kernels_share_of_generate"] = round(sum(seconds.values()) / gen["seconds"], 3)
        result["facts"] = after["facts"]
    return result
