"""The `openai` client against `ascend-vllm serve` (vLLM's OpenAI server on our platform, simulated-NPU lane):
completions and chat completions, streamed and not, and the worker that served them is ours."""

from __future__ import annotations

import json
import urllib.request

import pytest

from ascend_testkit.models.tiny_llama import prompt_of_length

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

MAX_TOKENS = 32
# Greedy; a random model may pick EOS early, and token counts are asserted.
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0, "extra_body": {"ignore_eos": True}}
CHAT = [{"role": "user", "content": prompt_of_length(20, offset=3)}]


def test_completion(serving):
    out = serving.client(serving.prefill).completions.create(
        model="tiny", prompt=prompt_of_length(40, offset=1), **GREEDY)
    assert out.model == "tiny" and out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == 40 and out.usage.completion_tokens == MAX_TOKENS
    assert out.choices[0].text.strip()


def test_chat_completion(serving):
    out = serving.client(serving.prefill).chat.completions.create(
        model="tiny", messages=CHAT, **GREEDY)
    assert out.choices[0].message.role == "assistant"
    assert out.usage.completion_tokens == MAX_TOKENS and out.choices[0].message.content.strip()


def test_streamed_completion_equals_the_whole_answer(serving):
    client = serving.client(serving.prefill)
    prompt = prompt_of_length(33, offset=2)
    whole = client.completions.create(model="tiny", prompt=prompt, **GREEDY)
    chunks = [c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=prompt, stream=True, **GREEDY) if c.choices and c.choices[0].text]
    assert len(chunks) > 1  # streamed (vLLM may put several tokens in a chunk when its output handler lags)
    assert "".join(chunks) == whole.choices[0].text


def test_streamed_chat_equals_the_whole_answer(serving):
    client = serving.client(serving.prefill)
    whole = client.chat.completions.create(model="tiny", messages=CHAT, **GREEDY)
    deltas = [c.choices[0].delta.content for c in client.chat.completions.create(
        model="tiny", messages=CHAT, stream=True, **GREEDY) if c.choices and c.choices[0].delta.content]
    assert len(deltas) > 1
    assert "".join(deltas) == whole.choices[0].message.content


def test_the_server_runs_our_platform_and_attention(serving):
    """Ask the server's worker (vLLM's development `collective_rpc` endpoint) what served the requests above."""
    req = urllib.request.Request(serving.prefill.url + "/collective_rpc", method="POST",
                                 data=json.dumps({"method": "ascend_usage"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        usage = json.loads(resp.read())["results"][0]
    assert usage["attention_impls"] == ["AscendAttentionImpl"]
    assert usage["facts"]["runner_class"].startswith("ascend_platform.worker.")
    assert usage["facts"]["kernel_backend"] == "reference"
    assert usage["counts"]["attention.ascend.bound_layers"] == 2
