"""DeepSeek V4 (compressed MLA + DeepSeek sparse attention) in the simulated-NPU lane: where it stands.

A tiny random V4 checkpoint (`ascend_testkit.models.deepseek_v4`: a sliding-window layer and a compressed sparse
layer, ratio 4, with the lightning indexer keeping 4 compressed entries) is built offline in DeepSeek's own tensor
names, which both vLLM's V4 model and transformers' load.

- transformers' DeepseekV4ForCausalLM runs it in float64 (`deepseek_v4_reference`), and the indexer's selection
  decides its output on prompts past 16 tokens: this is the reference the engine tests will use.
- Plain vLLM CPU cannot be the reference here (checked by hand, not in CI: an engine that dies at its first step
  costs a shared host): it starts, then its first step fails building the sliding-window metadata, whose Triton
  kernels have no CPU backend on this machine (`vllm/v1/attention/ops/metadata.py`).
- The simulated lane refuses it at start-up naming ASCEND_DSA, the backend that is not built yet (vLLM's V4 model
  never asks the platform for an attention backend; without the refusal it fails in model construction on CUDA's
  classes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PROMPT_LENGTHS = (5, 16, 17, 40, 65)  # within the window, at and past window + index_topk * ratio = 32 tokens
MAX_TOKENS = 8
LOGPROBS = 5
ENGINE = dict(dtype="bfloat16", max_model_len=256, enforce_eager=True, max_num_seqs=4, seed=0)


@pytest.fixture(scope="module")
def v4_model(cache_root) -> Path:
    from ascend_testkit.models.deepseek_v4 import cached_tiny_deepseek_v4

    return cached_tiny_deepseek_v4(cache_dir=cache_root / "models")


@pytest.fixture(scope="module")
def v4_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


def test_transformers_loads_every_tensor_of_the_deepseek_named_checkpoint(v4_model):
    import torch
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(v4_model, dtype=torch.float64, output_loading_info=True,
                                                   experts_implementation="eager")
    assert not any(info.values()), info
    config = json.loads((v4_model / "config.json").read_text())
    assert config["compress_ratios"] == [0, 4] and config["num_hash_layers"] == 0  # what vLLM's model reads


def test_float64_reference_depends_on_the_indexer_selection(v4_model, v4_prompts):
    from ascend_testkit.models.deepseek_v4_reference import float64_v4_outputs

    sparse = float64_v4_outputs(v4_model, v4_prompts, MAX_TOKENS, LOGPROBS)
    dense = float64_v4_outputs(v4_model, v4_prompts, MAX_TOKENS, LOGPROBS, index_topk=10**6)
    assert all(len(o["token_ids"]) == MAX_TOKENS for o in sparse)
    # Up to 16 tokens the 4 compressed entries of ratio 4 are all there is: sparse equals dense.
    short = [i for i, n in enumerate(PROMPT_LENGTHS) if n + MAX_TOKENS <= 17]
    assert short and all(sparse[i]["token_ids"] == dense[i]["token_ids"] for i in short)
    differs = [i for i, n in enumerate(PROMPT_LENGTHS) if n > 16 and sparse[i]["token_ids"] != dense[i]["token_ids"]]
    assert differs, "dense compressed attention gave the same tokens as the sparse model on every long prompt"


def test_simulated_lane_refuses_deepseek_v4_at_start_up_naming_ascend_dsa(sim_v1_host, v4_model):
    err = sim_v1_host.start_error(v4_model, **(ENGINE | {"dtype": "float32"}))
    assert err is not None, "the simulated lane started a DeepSeek V4 model it has no attention backend for"
    assert "ASCEND_DSA" in err["message"] and "deepseek_v4" in err["message"], err
    assert "CUDA" not in err["message"], err
