"""What serving users send, on three engines: the simulated lane with Model Runner V2 ("mrv2", the lane's default)
and with the V1 runner ("v1"), and plain vLLM CPU ("cpu", V1, no plugin: the anchor), on one tiny Llama whose
tokenizer spells characters (`ascend_testkit.models.char_tokenizer`: structured output needs tokens that are real
strings). Each engine serves every workload once per session (`ServedRuns`); the tests compare what came back.

The V1 runner's seeded draws depend on the platform's sampler: plain vLLM CPU samples with `forward_cpu`
(SplitMix64 Gumbel noise from a seed it draws from the request's generator, `torch.ops._C.fused_gumbel_argmax`), an
out-of-tree platform with `forward_native` (the exponential race: noise drawn from the request's generator itself);
MRV2 draws counter-based Gumbel noise of (seed, position, token). With `use_fp64_gumbel` plain vLLM CPU takes the
exponential race too, so the V1 lanes also run a "-fp64" engine whose seeded tokens must be equal to ours
(test_seeded_sampling.py); plain vLLM CPU's default draws are compared by distribution (test_sampling_draws.py).

Seeded requests on the V1 runner never have their prompt prefilled in chunks: vLLM 0.32's V1 runner rewinds a
chunked prompt's generator offset, which a CPU generator does not have ("CPU Generator does not use offset", plain
vLLM CPU too). Every seeded prompt there is at most SEEDED_PROMPT_MAX tokens, and max_num_seqs of them fit the token
budget; MRV2 (no generator: its noise is a function of the position) also serves one after a chunked prefill.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from ascend_testkit.models.char_tokenizer import VOCAB_SIZE

EOS = 2
MAX_NUM_SEQS = 16
TOKEN_BUDGET = 128
SEEDED_PROMPT_MAX = TOKEN_BUDGET // MAX_NUM_SEQS
ENGINE = dict(dtype="float32", max_model_len=320, enforce_eager=True, max_num_seqs=MAX_NUM_SEQS, block_size=32,
              max_num_batched_tokens=TOKEN_BUDGET, enable_chunked_prefill=True, enable_prefix_caching=False, seed=0,
              max_logprobs=VOCAB_SIZE,
              # No free whitespace between JSON tokens: a random model would otherwise spend its budget on blanks.
              structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True})
FP64 = {"use_fp64_gumbel": True}

# Greedy prompts: inside one block, across the 32-token block edge, and one prefilled in chunks (budget 128).
GREEDY_PROMPTS = ["ab", 'x = {"key": [1, 2, 3]} and y', "The quick brown fox jumps over the lazy dog; ok", "Zz" * 90]
KNOB_PROMPT = "x=1;"
MAX_TOKENS = 16
DRAW_PROMPT = '{"a":'
PENALTY_PROMPT = '36{"a":'
DRAWS = 400  # seeded one-token requests per sampling configuration and engine
DRAW_CONFIGS: dict[str, dict[str, Any]] = {
    "temperature": {"temperature": 1.5},
    "top_k": {"temperature": 1.5, "top_k": 4},
    "top_p": {"temperature": 1.5, "top_p": 0.8},
    "min_p": {"temperature": 1.5, "min_p": 0.05},
    "top_k_top_p_min_p": {"temperature": 2.0, "top_k": 6, "top_p": 0.9, "min_p": 0.05},
    # The penalty acts on the prompt's tokens at the first step: a prompt whose next token is often one of its own.
    "repetition_penalty": {"temperature": 1.5, "repetition_penalty": 1.15, "prompt": PENALTY_PROMPT},
    "repetition_baseline": {"temperature": 1.5, "prompt": PENALTY_PROMPT},  # the same seeds, no penalty
}
SEEDED_PROMPTS = ["ab", "Zz", "x=1;", '{"a":']  # each at most SEEDED_PROMPT_MAX tokens
CHUNKED_PROMPT = "The quick brown fox; " * 10  # 210 tokens: two chunks under the 128-token budget
PROMPT_LOGPROB_PROMPTS = ["ab{}", 'x = {"key": [1, 2, 3]} and y = [4, 5]; z', CHUNKED_PROMPT]
N_SEED = 7
JOIN_TOKENS = 12
JOIN_AFTER_STEPS = 4
JOIN_LONG = {"id": "join_long", "prompt": GREEDY_PROMPTS[1],
             "sampling": {"temperature": 0.0, "max_tokens": 240, "ignore_eos": True}}
LOGPROB_TOKEN_IDS = [5, 9, 40]
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tag": {"type": "string", "pattern": "^[a-z]{1,4}$"},
    },
    "required": ["color", "count", "ok", "tag"],
    "additionalProperties": False,
}
CHOICES = ["alpha", "beta", "gamma"]
REGEX = "[a-c]{3}-[0-9]{2}"
STRUCTURED_MAX_TOKENS = 80


@dataclass
class Plan:
    """Knob values chosen from plain vLLM CPU's greedy output of KNOB_PROMPT, so each visibly changes it."""

    baseline: list[int]
    banned: int  # the baseline's most frequent token: logit bias -100
    boosted: int  # a token the baseline never emits: logit bias +6
    bad_words: list[str]  # a two-token word the baseline contains and one token it emits
    allowed: list[int]  # the baseline's first three tokens and seven letters


class ServedRuns:
    """Each engine's answers to every workload, served on first use and kept for the session."""

    def __init__(self, hosts: dict[str, Any], model: str, tokenizer: Any) -> None:
        self.hosts, self.model, self.tok = hosts, model, tokenizer
        self.results: dict[str, dict[str, Any]] = {}
        self._plan: Plan | None = None

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self.results:
            lane, _, variant = name.partition("-")
            serve = {"": self._serve, "fp64": self._serve_fp64, "replay": self._serve_replay}[variant]
            self.results[name] = serve(lane)
        return self.results[name]

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            self["cpu"]
        assert self._plan is not None
        return self._plan

    def _start(self, lane: str, **extra: Any) -> Any:
        host = self.hosts[lane]
        host.start(self.model, **(ENGINE | extra))
        return host

    def _usage(self, host: Any) -> dict[str, Any]:
        return host.usage()[0] if host.lane == "simulated" else {}

    def _serve(self, lane: str) -> dict[str, Any]:
        if lane != "cpu":
            self.plan  # noqa: B018 - plain vLLM CPU chooses the knob values, before anything else serves them
        host = self._start(lane)
        out: dict[str, Any] = {"usage_before": self._usage(host), "seconds": {}}

        def timed(name: str, work: Any) -> None:
            t0 = time.perf_counter()
            out[name] = work()
            out["seconds"][name] = round(time.perf_counter() - t0, 2)

        try:
            timed("greedy", lambda: host.generate(GREEDY_PROMPTS, max_tokens=MAX_TOKENS, logprobs=5)["outputs"])
            if self._plan is None:
                self._plan = self._make_plan(run(host, self.knob_requests(only="none"))[0]["token_ids"])
            timed("knobs", lambda: run(host, self.knob_requests()))
            timed("prompt_logprobs", lambda: host.generate(PROMPT_LOGPROB_PROMPTS, max_tokens=2, prompt_logprobs=5,
                                                           logprobs=5)["outputs"])
            timed("max_logprobs", lambda: self._max_logprobs(host))
            timed("draws", lambda: {name: [o["token_ids"][0] for o in run(host, draw_requests(name), timeout=600)]
                                    for name in DRAW_CONFIGS})
            timed("seeded", lambda: run(host, seeded_requests(chunked=lane == "mrv2")))
            timed("seeded_reversed", lambda: run(host, seeded_requests(chunked=lane == "mrv2")[::-1])[::-1])
            timed("n4", lambda: self._n4(host))
            timed("joining", lambda: self._joining(host))
            timed("structured", lambda: run(host, structured_requests()))
            timed("structured_free_alone",
                  lambda: run(host, [r for r in structured_requests() if r["id"].startswith("free")]))
            out["usage"] = self._usage(host)
        finally:
            host.stop()
        return out

    def _serve_fp64(self, lane: str) -> dict[str, Any]:
        host = self._start(lane, **FP64)
        try:
            return {"seeded": run(host, seeded_requests()), "n4": self._n4(host),
                    "structured": run(host, structured_requests(seeded=True))}
        finally:
            host.stop()

    def _serve_replay(self, lane: str) -> dict[str, Any]:
        """Plain vLLM CPU's full next-token distributions along MRV2's seeded trajectories (every position's
        prompt logprobs over the whole vocabulary, and the last one's sample logprobs)."""
        trajectories = [r["prompt_token_ids"] + r["token_ids"][:-1] for r in self["mrv2"]["seeded"]]
        host = self._start(lane)
        try:
            return {"distributions": host.generate(prompt_token_ids=trajectories, max_tokens=1, logprobs=VOCAB_SIZE,
                                                   prompt_logprobs=VOCAB_SIZE)["outputs"]}
        finally:
            host.stop()

    def _make_plan(self, baseline: list[int]) -> Plan:
        """Knob values that change the greedy output of KNOB_PROMPT (chosen from plain vLLM CPU's)."""
        from collections import Counter

        printable = set(range(4, VOCAB_SIZE))  # not the specials, not newline
        counts = Counter(t for t in baseline if t in printable)
        banned = counts.most_common(1)[0][0]
        letters = [self.tok.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"]
        boosted = next(t for t in letters if t not in counts)
        i = next(i for i in range(len(baseline) - 1) if {baseline[i], baseline[i + 1]} <= printable)
        pair = baseline[i : i + 2]
        single = next(t for t in baseline[i + 2 :] if t in printable and t not in pair)
        words = [self.tok.decode(pair), self.tok.decode([single])]
        allowed = sorted({*baseline[:3], *letters[:7]} & printable)
        return Plan(baseline, banned, boosted, words, allowed)

    def knob_requests(self, only: str | None = None) -> list[dict[str, Any]]:
        """One greedy request per deterministic knob, all in one batch (rows with different knobs side by side)."""
        plan = self._plan
        knobs = {"none": {}} if only else {
            "none": {}, "repetition_penalty": {"repetition_penalty": 1.5},
            "frequency_penalty": {"frequency_penalty": 2.0}, "presence_penalty": {"presence_penalty": 1.5},
            "logit_bias": {"logit_bias": {plan.banned: -100.0, plan.boosted: 6.0}},
            "bad_words": {"bad_words": plan.bad_words}, "allowed_token_ids": {"allowed_token_ids": plan.allowed},
            # EOS pushed up by a bias: the request ends at once unless min_tokens holds the stop token back.
            "min_tokens": {"logit_bias": {EOS: 30.0}, "min_tokens": 5, "ignore_eos": False},
            "eos_bias": {"logit_bias": {EOS: 30.0}, "ignore_eos": False},
        }
        return [{"id": name, "prompt": KNOB_PROMPT, "sampling": {"max_tokens": 24, "temperature": 0.0, **k}}
                for name, k in knobs.items() if only in (None, name)]

    def _max_logprobs(self, host: Any) -> dict[str, Any]:
        """At max_logprobs (the vocabulary here): every token's logprob; one past it: vLLM's refusal."""
        from ascend_testkit.engine import EngineError

        full = host.generate([DRAW_PROMPT, KNOB_PROMPT], max_tokens=3, logprobs=VOCAB_SIZE,
                             prompt_logprobs=VOCAB_SIZE)["outputs"]
        # Explicit token ids instead of the top k (vLLM's generative scoring): MRV2's _fill_logprob_token_ids_kernel.
        chosen = host.generate([KNOB_PROMPT, DRAW_PROMPT], max_tokens=3, logprob_token_ids=LOGPROB_TOKEN_IDS)
        refused = {}
        for key in ("logprobs", "prompt_logprobs"):
            try:
                host.generate([KNOB_PROMPT], max_tokens=1, **{key: VOCAB_SIZE + 1})
                refused[key] = None
            except EngineError as exc:
                refused[key] = str(exc).splitlines()[0]
        return {"full": full, "chosen": chosen["outputs"], "refused": refused}

    def _n4(self, host: Any) -> dict[str, Any]:
        """n=4 with one seed, and the four children as vLLM makes them (seed, seed + 1, ...) sent one by one."""
        params = {"temperature": 1.0, "max_tokens": 12, "seed": N_SEED, "ignore_eos": True}
        fan = host.generate([SEEDED_PROMPTS[1]], n=4, **params)["outputs"][0]["completions"]
        singles = run(host, [{"id": f"child{i}", "prompt": SEEDED_PROMPTS[1],
                              "sampling": {**params, "seed": N_SEED + i}} for i in range(4)])
        return {"n4": [c["token_ids"] for c in fan], "singles": [o["token_ids"] for o in singles]}


    def _joining(self, host: Any) -> dict[str, Any]:
        """A greedy request decodes; seeded requests join it once it has run a few steps; greedy ones join after
        those finished, into the slots they left (MRV2 hands out the last freed first). Then the same requests again,
        each group on its own, and the seeded ones once more at temperature 0."""
        seeded, greedy = joining_requests()
        host.submit([JOIN_LONG])
        deadline = time.monotonic() + 60
        while (steps := host.progress([JOIN_LONG["id"]])[JOIN_LONG["id"]]) < JOIN_AFTER_STEPS:
            assert time.monotonic() < deadline, f"the long request decoded {steps} tokens in 60 s"
            time.sleep(0.005)
        together = host.collect(host.submit(seeded))
        together += host.collect(host.submit(greedy))
        together += host.collect([JOIN_LONG["id"]])
        alone = run(host, [JOIN_LONG]) + run(host, seeded) + run(host, greedy)
        as_greedy = run(host, [{**r, "sampling": {**r["sampling"], "temperature": 0.0}} for r in seeded])
        tokens = lambda rows: {r["id"]: r["token_ids"] for r in rows}  # noqa: E731
        return {"together": tokens(together), "alone": tokens(alone), "seeded_as_greedy": tokens(as_greedy),
                "steps_before_join": steps}


def run(host: Any, requests: list[dict[str, Any]], timeout: float = 300.0) -> list[dict[str, Any]]:
    """Requests with their own sampling parameters in one batch; outputs in request order."""
    return host.run_requests(requests, timeout=timeout)


def draw_requests(name: str) -> list[dict[str, Any]]:
    """DRAWS one-token requests of one configuration, seeds fixed (each configuration its own range)."""
    cfg = dict(DRAW_CONFIGS[name])
    prompt = cfg.pop("prompt", DRAW_PROMPT)
    base = 10_000 * (list(DRAW_CONFIGS).index(name) if name != "repetition_baseline" else
                     list(DRAW_CONFIGS).index("repetition_penalty"))
    return [{"id": f"draw{i}", "prompt": prompt, "sampling": {**cfg, "seed": base + i, "max_tokens": 1}}
            for i in range(DRAWS)]


def seeded_requests(chunked: bool = False) -> list[dict[str, Any]]:
    """Seeded sampling with each knob, 16 tokens each (knobs acting on output tokens need more than one).
    `chunked` (MRV2 only: see the module's docstring) adds one whose long prompt is prefilled in two chunks."""
    knobs: list[dict[str, Any]] = [
        {"temperature": 0.8}, {"temperature": 1.2, "top_k": 5}, {"temperature": 1.2, "top_p": 0.8},
        {"temperature": 1.2, "min_p": 0.1}, {"temperature": 1.0, "repetition_penalty": 1.3},
        {"temperature": 1.0, "frequency_penalty": 0.8, "presence_penalty": 0.5},
        {"temperature": 1.0, "top_k": 8, "top_p": 0.9, "min_p": 0.02},
        {"temperature": 1.0, "logit_bias": {5: 2.0, 70: 1.5}, "bad_words": ["ab"]},
    ]
    requests = [{"id": f"seeded{i}", "prompt": SEEDED_PROMPTS[i % len(SEEDED_PROMPTS)],
                 "sampling": {**k, "seed": 1000 + i, "max_tokens": MAX_TOKENS}} for i, k in enumerate(knobs)]
    if chunked:
        requests.append({"id": "seeded_chunked", "prompt": CHUNKED_PROMPT,
                         "sampling": {"temperature": 1.0, "top_k": 8, "seed": 77, "max_tokens": MAX_TOKENS}})
    return requests


def joining_requests() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Seeded and greedy requests that join JOIN_LONG's running batch (test_seeded_sampling.py)."""
    def request(kind: str, i: int, sampling: dict[str, Any]) -> dict[str, Any]:
        return {"id": f"join_{kind}{i}", "prompt": SEEDED_PROMPTS[i],
                "sampling": {**sampling, "max_tokens": JOIN_TOKENS, "ignore_eos": True}}

    return ([request("seeded", i, {"temperature": 1.5, "seed": 500 + i}) for i in range(3)],
            [request("greedy", i, {"temperature": 0.0}) for i in range(3)])


def structured_requests(seeded: bool = False) -> list[dict[str, Any]]:
    """JSON-schema requests (greedy and seeded) mixed with unconstrained ones, a choice and a regex, in one batch.
    `seeded`: the sampled ones only (the V1 fp64 engines, whose draws must be equal)."""
    common = {"max_tokens": STRUCTURED_MAX_TOKENS, "ignore_eos": False}
    reqs = [
        ("json_greedy", "Give JSON: ", {"temperature": 0.0, "structured_outputs": {"json": JSON_SCHEMA}}),
        ("free_greedy", "ab", {"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True}),
        ("json_seed1", "x=1;", {"temperature": 1.0, "seed": 11, "structured_outputs": {"json": JSON_SCHEMA}}),
        ("choice", "Pick: ", {"temperature": 0.0, "structured_outputs": {"choice": CHOICES}}),
        ("free_seeded", "Zz", {"temperature": 1.0, "seed": 12, "max_tokens": MAX_TOKENS, "ignore_eos": True}),
        ("json_seed2", "ab", {"temperature": 1.5, "seed": 13, "structured_outputs": {"json": JSON_SCHEMA}}),
        ("regex", "Code: ", {"temperature": 0.0, "structured_outputs": {"regex": REGEX}}),
        ("regex_seeded", "Zz", {"temperature": 1.0, "seed": 14, "structured_outputs": {"regex": REGEX}}),
    ]
    return [{"id": rid, "prompt": prompt, "sampling": {**common, **s}} for rid, prompt, s in reqs
            if not seeded or "seed" in s]


@pytest.fixture(scope="session")
def char_model(cache_root) -> str:
    from ascend_testkit.models.tiny_llama import cached_char_llama

    return str(cached_char_llama(cache_dir=cache_root / "models"))


@pytest.fixture(scope="session")
def char_tokenizer(char_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(char_model)


@pytest.fixture(scope="session")
def served(request, cpu_host, sim_v1_host, char_model, char_tokenizer) -> ServedRuns:
    """`served[name]`: "cpu", "v1", "mrv2" (every workload), "cpu-fp64", "v1-fp64" (the seeded ones with
    use_fp64_gumbel), "cpu-replay" (plain vLLM CPU's distributions along MRV2's seeded outputs). The MRV2 host is
    asked for only by what needs MRV2."""

    class Hosts(dict):
        def __missing__(self, lane: str) -> Any:
            assert lane == "mrv2", lane
            self[lane] = request.getfixturevalue("sim_host")
            return self[lane]

    return ServedRuns(Hosts(cpu=cpu_host, v1=sim_v1_host), char_model, char_tokenizer)


@pytest.fixture(scope="session")
def workload():
    """The suite's constants, for the test modules (which cannot import this file)."""
    from types import SimpleNamespace

    names = ("VOCAB_SIZE", "EOS", "MAX_NUM_SEQS", "TOKEN_BUDGET", "SEEDED_PROMPT_MAX", "ENGINE", "CHUNKED_PROMPT",
             "GREEDY_PROMPTS", "KNOB_PROMPT", "MAX_TOKENS", "DRAW_PROMPT", "PENALTY_PROMPT", "DRAWS", "DRAW_CONFIGS",
             "SEEDED_PROMPTS", "PROMPT_LOGPROB_PROMPTS", "N_SEED", "LOGPROB_TOKEN_IDS", "JSON_SCHEMA", "CHOICES",
             "REGEX", "STRUCTURED_MAX_TOKENS")
    return SimpleNamespace(**{name: globals()[name] for name in names}, seeded_requests=seeded_requests,
                           draw_requests=draw_requests, structured_requests=structured_requests)
