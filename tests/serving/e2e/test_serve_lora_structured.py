"""Structured output and LoRA as users send them: the `openai` client against one `ascend-vllm serve` (simulated-NPU
lane) of the tiny Llama whose tokenizer spells characters (a grammar needs tokens that are real strings), started
with `--enable-lora --lora-modules a1=<adapter>` and runtime adapter updates allowed.

* a JSON-schema request (`response_format` json_schema) returns text that parses and validates against the schema;
* `model="a1"` picks the adapter given at start-up; its tokens are plain vLLM CPU's for that adapter (the LoRA
  suite's anchor: the same engine settings, each adapter in a batch of its own) and not the base model's;
* `/v1/load_lora_adapter` adds adapter a2 while the server runs; a request to it gives plain vLLM CPU's a2 tokens,
  and a base request then still gives the base model's; `/v1/unload_lora_adapter` removes a2 again (listed, then
  not, in `/v1/models`; a request to it then fails);
* the worker's usage counters show the LoRA terms ran on our punica wrapper's ops.

One server for all of these; plain vLLM CPU computes its anchors while the server starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

pytestmark = pytest.mark.engine

PORT = 8300  # inside the package's namespace, beside the PD servers' ports
MAX_TOKENS = 10
LOGPROBS = 5
PROMPTS = ("ab", 'x = {"key": [1, 2, 3]} and y')
MAX_LORA_RANK = 8
MAX_MODEL_LEN = 256
# The server's engine settings that decide the tokens, given to the plain vLLM CPU anchor as they are.
ENGINE = dict(
    dtype="float32",
    max_model_len=MAX_MODEL_LEN,
    enforce_eager=True,
    max_num_seqs=8,
    seed=0,
    enable_lora=True,
    max_loras=2,
    max_lora_rank=MAX_LORA_RANK,
)
ADAPTER_SEEDS = {"a1": 1, "a2": 2}
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "count", "ok"],
    "additionalProperties": False,
}
# Token ids and their top-k back from the completions API, in the harness's row format.
TOKENS = {
    "max_tokens": MAX_TOKENS,
    "temperature": 0,
    "logprobs": LOGPROBS,
    "extra_body": {"ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True},
}


@dataclass
class Served:
    server: object
    adapters: dict[str, str]  # name -> folder
    anchor: dict[str, list[dict]]  # "base" / adapter name -> plain vLLM CPU's rows for PROMPTS

    def client(self, timeout: float = 120.0):
        return self.server.openai_client(timeout)

    def post(self, path: str, body: dict) -> tuple[int, str]:
        import httpx

        resp = httpx.post(self.server.url + path, json=body, timeout=60.0)
        return resp.status_code, resp.text

    def rows(self, model: str) -> list[dict]:
        """Greedy completions of PROMPTS by `model`, one request each, as harness rows."""
        rows = []
        for prompt in PROMPTS:
            choice = self.client().completions.create(model=model, prompt=prompt, **TOKENS).choices[0]
            tops = [{k.removeprefix("token_id:"): v for k, v in top.items()} for top in choice.logprobs.top_logprobs]
            rows.append({"token_ids": list(choice.token_ids), "logprobs": tops})
        return rows


@pytest.fixture(scope="module")
def served(tmp_path_factory, cache_root, serving_netns, cpu_host):
    from ascend_testkit.models.char_tokenizer import VOCAB_SIZE
    from ascend_testkit.models.lora_adapter import LoraSpec, cached_lora_adapter
    from ascend_testkit.models.tiny_llama import TinyModelSpec, cached_char_llama
    from ascend_testkit.servers import inside, start_serve, tiny_serve_args

    base = TinyModelSpec(vocab_size=VOCAB_SIZE)
    model = str(cached_char_llama(base, cache_dir=cache_root / "models"))
    adapters = {
        name: str(cached_lora_adapter(LoraSpec(base=base, seed=seed), cache_root / "models", model))
        for name, seed in ADAPTER_SEEDS.items()
    }
    args = [
        *tiny_serve_args(max_model_len=MAX_MODEL_LEN, max_num_seqs=ENGINE["max_num_seqs"]),
        "--enable-lora",
        "--max-loras",
        str(ENGINE["max_loras"]),
        "--max-lora-rank",
        str(MAX_LORA_RANK),
        "--lora-modules",
        f"a1={adapters['a1']}",
        # No free whitespace between JSON tokens: a random model would otherwise spend its budget on blanks.
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
    ]
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_SERVER_DEV_MODE": "1"}
    server = start_serve(
        "features",
        model,
        PORT,
        log_dir=tmp_path_factory.mktemp("serve-features"),
        cpu=0,
        netns=serving_netns,
        args=args,
        env_extra=env,
    )
    try:
        cpu_host.start(model, **ENGINE)
        try:
            anchor = {
                name: cpu_host.generate(
                    list(PROMPTS),
                    max_tokens=MAX_TOKENS,
                    logprobs=LOGPROBS,
                    ignore_eos=True,
                    lora=None if name == "base" else {"name": name, "id": i, "path": adapters[name]},
                )["outputs"]
                for i, name in enumerate(("base", *ADAPTER_SEEDS))
            }
        finally:
            cpu_host.stop()
        server.wait_healthy()
        with inside(serving_netns):
            yield Served(server, adapters, anchor)
    finally:
        server.close()
    assert not server.alive


def _models(served: Served) -> set[str]:
    return {m.id for m in served.client().models.list().data}


def test_json_schema_output_validates(served):
    import jsonschema

    out = served.client().chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Give JSON: "}],
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "item", "schema": JSON_SCHEMA}},
    )
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice  # the grammar ended the text, not max_tokens
    jsonschema.validate(json.loads(choice.message.content), JSON_SCHEMA)


def test_unconstrained_output_is_not_json(served):
    """The same request without the schema: the model alone does not write JSON, so the valid output above came
    from the grammar."""
    out = served.client().chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Give JSON: "}],
        max_tokens=40,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    with pytest.raises(ValueError):
        json.loads(out.choices[0].message.content)


def test_adapter_from_the_command_line_is_plain_vllm_cpus(served):
    from ascend_testkit.compare import check_logprobs_close

    assert {"tiny", "a1"} <= _models(served)
    a1, base = served.rows("a1"), served.rows("tiny")
    check_logprobs_close(base, served.anchor["base"], name_0="served base", name_1="cpu base")
    check_logprobs_close(a1, served.anchor["a1"], name_0="served a1", name_1="cpu a1")
    for i in range(len(PROMPTS)):
        assert a1[i]["token_ids"] != base[i]["token_ids"], f"prompt {i}: adapter a1 did not change the output"


def test_adapter_loaded_at_run_time_then_unloaded(served):
    from ascend_testkit.compare import check_logprobs_close

    assert "a2" not in _models(served)
    status, body = served.post("/v1/load_lora_adapter", {"lora_name": "a2", "lora_path": served.adapters["a2"]})
    assert status == 200, body
    assert "a2" in _models(served)
    a2 = served.rows("a2")
    check_logprobs_close(a2, served.anchor["a2"], name_0="served a2", name_1="cpu a2")
    assert [r["token_ids"] for r in a2] != [r["token_ids"] for r in served.anchor["a1"]]
    # Both slots now hold an adapter (max_loras 2): a base request still gets no LoRA term (vLLM's CPU punica ops
    # would give it the last slot's adapter).
    check_logprobs_close(served.rows("tiny"), served.anchor["base"], name_0="served base", name_1="cpu base")

    status, body = served.post("/v1/unload_lora_adapter", {"lora_name": "a2"})
    assert status == 200, body
    assert "a2" not in _models(served)
    import openai

    with pytest.raises(openai.NotFoundError):
        served.client().completions.create(model="a2", prompt=PROMPTS[0], max_tokens=2)
    # The adapter given at start-up still serves after the other one left.
    check_logprobs_close(served.rows("a1")[:1], served.anchor["a1"][:1], name_0="served a1", name_1="cpu a1")


def test_the_server_ran_lora_on_our_punica_ops(served):
    """Ask the server's worker (vLLM's development `collective_rpc` endpoint) what ran the LoRA terms above."""
    status, body = served.post("/collective_rpc", {"method": "ascend_usage"})
    assert status == 200, body
    usage = json.loads(body)["results"][0]
    assert usage["facts"]["runner_class"].startswith("ascend_platform.worker.")
    steps = ("kernels.sgmv_shrink", "kernels.sgmv_expand", "kernels.bgmv_shrink", "kernels.bgmv_expand")
    assert all(usage["counts"].get(step) for step in steps), usage["counts"]
