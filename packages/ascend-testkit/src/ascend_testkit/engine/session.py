"""One engine at a time inside a host process: build it as `LLM(...)` does, drive it, tear it down.

Every method returns plain JSON-able data; `ascend_testkit.engine.host` maps pipe commands onto them.
"""

from __future__ import annotations

import gc
import importlib
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

# vLLM's spec-decode and step metrics this session reads (see `metrics_mark` / `acceptance`).
STEP_HISTOGRAM = "vllm:iteration_tokens_total"


class NoEngineError(RuntimeError):
    pass


def _top_logprobs(steps: Sequence[Any] | None) -> list[dict[str, float] | None]:
    """vLLM's per-position {token id: Logprob} dicts as {str(token id): logprob} (None where vLLM gives none: the
    first prompt position)."""
    return [None if step is None else {str(tok): lp.logprob for tok, lp in step.items()} for step in (steps or [])]


def _completion(out: Any) -> dict[str, Any]:
    return {"token_ids": list(out.token_ids), "text": out.text, "logprobs": _top_logprobs(out.logprobs),
            "finish_reason": out.finish_reason}


def _outputs(request_outputs: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per request: its first completion's fields at the top level, every completion (n > 1) under
    "completions", and the prompt's logprobs when asked for (`prompt_logprobs`)."""
    rows = []
    for r in request_outputs:
        completions = [_completion(out) for out in sorted(r.outputs, key=lambda o: o.index)]
        rows.append({"id": r.request_id, **completions[0], "completions": completions,
                     "prompt_token_ids": list(r.prompt_token_ids or []),
                     "prompt_logprobs": None if r.prompt_logprobs is None else _top_logprobs(r.prompt_logprobs),
                     "num_cached_tokens": r.num_cached_tokens, "kv_transfer_params": r.kv_transfer_params})
    return rows


def _multimodal(prompt: Any) -> Any:
    """A prompt as `LLM.generate` takes it: a {prompt, multi_modal_data} dict's images may arrive as data: URIs
    (JSON over the pipe carries no image) and become PIL images here."""
    if not isinstance(prompt, Mapping) or "multi_modal_data" not in prompt:
        return prompt
    import base64
    import io

    from PIL import Image

    def image(item: Any) -> Any:
        if isinstance(item, str) and item.startswith("data:image/"):
            return Image.open(io.BytesIO(base64.b64decode(item.partition("base64,")[2]))).convert("RGB")
        return item

    data = dict(prompt["multi_modal_data"])
    if "image" in data:
        data["image"] = [image(i) for i in data["image"]] if isinstance(data["image"], list) else image(data["image"])
    return {**prompt, "multi_modal_data": data}


def _resolve(path: str) -> Any:
    """'package.module:attr.attr' -> the object (probe functions shipped to workers by collective_rpc)."""
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _forget_process_caches() -> None:
    """vLLM caches per-process choices a new engine must make again: the attention backend is cached on the layer's
    shape alone, so an engine with another platform policy (e.g. the 310P chip) would inherit the last one's."""
    from vllm.v1.attention import selector

    for name in ("_cached_get_attn_backend", "_cached_get_mamba_attn_backend"):
        cached = getattr(selector, name, None)
        if cached is not None and hasattr(cached, "cache_clear"):
            cached.cache_clear()


class EngineSession:
    def __init__(self) -> None:
        self.llm: Any = None
        self.spec: dict[str, Any] = {}
        self.pending: dict[str, dict[str, Any]] = {}
        self.done: dict[str, dict[str, Any]] = {}
        self.landed: dict[str, float] = {}
        self._mark: list[Any] | None = None
        # An engine pins this process's threads (the worker's OpenMP binding); the next one starts from all of them.
        self._affinity = os.sched_getaffinity(0)

    # ---- life cycle -----------------------------------------------------------------------------------------------
    def start(self, model: str, engine: Mapping[str, Any] | None = None,
              env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Build `LLM(model, **engine)` after applying `env` (variables an engine reads; not the model runner, which
        is the process's: see `engine_env`)."""
        if self.llm is not None:
            raise RuntimeError("an engine is already running in this host; stop it first")
        for key, value in (env or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(value)
        if "VLLM_USE_V2_MODEL_RUNNER" in (env or {}):
            raise ValueError("the model runner is the host process's (EngineHost(runner=...)), not an engine's")
        import vllm.envs

        # The previous engine froze vLLM's environment cache; this one must see the variables set above.
        vllm.envs.disable_envs_cache()
        from vllm import LLM

        kwargs = dict(engine or {})
        t0 = time.perf_counter()
        self.llm = LLM(model=model, **kwargs)
        startup_s = time.perf_counter() - t0
        self.spec = {"model": model, "engine": kwargs}
        self._probe_transfer_results()
        from vllm.platforms import current_platform

        return {"startup_s": startup_s, "platform": type(current_platform).__name__, "pid": os.getpid(),
                "runner": {"0": "v1", "1": "v2"}.get(os.environ.get("VLLM_USE_V2_MODEL_RUNNER", ""), "default")}

    def stop(self) -> None:
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        self.pending.clear()
        self.done.clear()
        self.landed.clear()
        self._mark = None
        try:
            llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
            _forget_process_caches()
            gc.collect()
            os.sched_setaffinity(0, self._affinity)

    def _engine(self) -> Any:
        if self.llm is None:
            raise NoEngineError("no engine is running in this host (call start first)")
        return self.llm

    @property
    def core(self) -> Any:
        """The in-process `EngineCore` (scheduler, executor)."""
        return self._engine().llm_engine.engine_core.engine_core

    # ---- generation -----------------------------------------------------------------------------------------------
    @staticmethod
    def sampling(params: Mapping[str, Any] | None) -> Any:
        from vllm import SamplingParams

        params = dict(params or {})
        params.setdefault("temperature", 0.0)
        kv = params.pop("kv_transfer_params", None)
        if kv:
            params["extra_args"] = {**params.get("extra_args", {}), "kv_transfer_params": kv}
        if params.get("logit_bias"):  # JSON object keys arrive as strings
            params["logit_bias"] = {int(tok): float(bias) for tok, bias in params["logit_bias"].items()}
        if isinstance(params.get("structured_outputs"), Mapping):  # JSON over the pipe: {"json": ..., "regex": ...}
            from vllm.sampling_params import StructuredOutputsParams

            params["structured_outputs"] = StructuredOutputsParams(**params["structured_outputs"])
        return SamplingParams(**params)

    @staticmethod
    def lora_requests(lora: Any, count: int) -> list[Any] | None:
        """`lora` as vLLM's per-request `LoRARequest`s: None (no adapter), one {name, id, path} for every request, or
        a list of those (None for a base-model request), one per request."""
        if lora is None:
            return None
        from vllm.lora.request import LoRARequest

        rows = [lora] * count if isinstance(lora, Mapping) else list(lora)
        if len(rows) != count:
            raise ValueError(f"{len(rows)} LoRA entries for {count} requests")
        return [None if r is None else LoRARequest(r["name"], int(r["id"]), str(r["path"])) for r in rows]

    def generate(self, prompts: Sequence[str] | None = None, prompt_token_ids: Sequence[Sequence[int]] | None = None,
                 sampling: Mapping[str, Any] | None = None, sequential: bool = False,
                 lora: Any = None) -> dict[str, Any]:
        """`LLM.generate` over text prompts or token ids; `sequential` runs one request at a time; `lora` names the
        adapters the requests use (`lora_requests`)."""
        llm = self._engine()
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompts or prompt_token_ids")
        inputs: list[Any] = ([_multimodal(p) for p in prompts] if prompts is not None
                             else [{"prompt_token_ids": list(ids)} for ids in prompt_token_ids or []])
        params = self.sampling(sampling)
        adapters = self.lora_requests(lora, len(inputs))
        t0 = time.perf_counter()
        if sequential:
            results = [o for i, p in enumerate(inputs)
                       for o in llm.generate([p], params, use_tqdm=False,
                                             lora_request=None if adapters is None else adapters[i])]
        else:
            results = llm.generate(inputs, params, use_tqdm=False, lora_request=adapters)
        return {"outputs": _outputs(results), "seconds": time.perf_counter() - t0}

    def embed(self, prompts: Sequence[str]) -> dict[str, Any]:
        """`LLM.embed` (a pooling engine): {"embeddings": [[float], ...] in prompt order, "seconds"}."""
        llm = self._engine()
        t0 = time.perf_counter()
        results = llm.embed(list(prompts), use_tqdm=False)
        return {"embeddings": [list(map(float, r.outputs.embedding)) for r in results],
                "seconds": time.perf_counter() - t0}

    def submit(self, requests: Sequence[Mapping[str, Any]]) -> list[str]:
        """Add requests ({id, prompt | prompt_token_ids, sampling}) without waiting; the host keeps stepping."""
        engine = self._engine().llm_engine
        for r in requests:
            prompt = r["prompt"] if "prompt" in r else {"prompt_token_ids": list(r["prompt_token_ids"])}
            self.pending[r["id"]] = {"id": r["id"], "t_add": time.time()}
            engine.add_request(r["id"], prompt, self.sampling(r.get("sampling")))
        return [r["id"] for r in requests]

    def busy(self) -> bool:
        return self.llm is not None and self.core.scheduler.has_requests()

    def step(self) -> None:
        for out in self._engine().llm_engine.step():
            rec = self.pending.get(out.request_id)
            if rec is None:
                continue
            rec.setdefault("t_first", time.time())
            rec["tokens_so_far"] = len(out.outputs[0].token_ids) if out.outputs else 0
            if out.finished:
                rec.update(_outputs([out])[0], t_end=time.time())
                self.done[out.request_id] = self.pending.pop(out.request_id)

    def progress(self, ids: Sequence[str]) -> dict[str, int]:
        """Output tokens so far of submitted requests (finished ones: all of theirs)."""
        return {i: (self.pending.get(i) or self.done.get(i) or {}).get("tokens_so_far", 0) for i in ids}

    def collect(self, ids: Sequence[str], timeout: float = 120.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while any(i not in self.done for i in ids):
            if time.monotonic() > deadline:
                missing = [i for i in ids if i not in self.done]
                raise TimeoutError(f"requests {missing} not finished within {timeout} s")
            self.step()
        out = [self.done.pop(i) for i in ids]
        for rec in out:
            rec["t_landed"] = next((t for k, t in self.landed.items() if k == rec["id"] or k.startswith(rec["id"])),
                                   None)
        return out

    # ---- what ran -------------------------------------------------------------------------------------------------
    def usage(self) -> list[dict[str, Any]]:
        """Every rank's `ascend_usage()` (the simulated lane's worker)."""
        return self._engine().collective_rpc("ascend_usage")

    def rpc(self, function: str, args: Sequence[Any] = ()) -> list[Any]:
        """`collective_rpc` of a testkit probe named 'module:function' (it must be importable in the workers)."""
        return self._engine().collective_rpc(_resolve(function), args=tuple(args))

    def sleep(self, level: int = 1) -> None:
        self._engine().sleep(level=level)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        self._engine().wake_up(tags=list(tags) if tags else None)

    @staticmethod
    def save_reach() -> bool:
        """Write this process's coverage now (the client asks before it kills the host in a fault test); False when
        the process records none."""
        try:
            import coverage
        except ImportError:
            return False
        current = coverage.Coverage.current()
        if current is None:
            return False
        current.save()
        return True

    def reset_prefix_cache(self) -> bool:
        return bool(self._engine().reset_prefix_cache())

    def free_blocks(self) -> int:
        return int(self.core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks())

    def total_blocks(self) -> int:
        return int(self.core.scheduler.kv_cache_manager.block_pool.num_gpu_blocks)

    # ---- metrics --------------------------------------------------------------------------------------------------
    def metrics_mark(self) -> None:
        """Remember the metrics now; `acceptance` and `engine_steps` report what happened since."""
        self._mark = self._engine().get_metrics()

    def acceptance(self, k: int | None = None) -> dict[str, Any]:
        from ascend_specdecode.metrics import acceptance_from_metrics

        now = acceptance_from_metrics(self._engine().get_metrics(), k)
        return (now.minus(acceptance_from_metrics(self._mark, k)) if self._mark is not None else now).as_dict()

    def engine_steps(self) -> int:
        """Engine steps since the mark (every step runs the target model once)."""
        def steps(metrics: Sequence[Any]) -> int:
            return sum(int(m.count) for m in metrics if m.name == STEP_HISTOGRAM)

        return steps(self._engine().get_metrics()) - (steps(self._mark) if self._mark is not None else 0)

    # ---- KV connectors --------------------------------------------------------------------------------------------
    @staticmethod
    def _worker_connector() -> Any:
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

        return get_kv_transfer_group() if has_kv_transfer_group() else None

    def _probe_transfer_results(self) -> None:
        """Note when each request's KV is reported landed (the same probe for every connector)."""
        connector = self._worker_connector()
        if connector is None or not hasattr(connector, "get_transfer_results"):
            return
        inner = connector.get_transfer_results

        def probed(finished_req_ids):
            results = inner(finished_req_ids)
            now = time.time()
            for req_id in results.finished_recving:
                self.landed.setdefault(req_id, now)
            return results

        connector.get_transfer_results = probed

    def stats(self) -> dict[str, Any]:
        """The scheduler's and the worker's connector counters (`connector_stats()`), and the free blocks."""
        out: dict[str, Any] = {}
        for name, conn in (("scheduler", getattr(self.core.scheduler, "connector", None)),
                           ("worker", self._worker_connector())):
            if conn is not None and hasattr(conn, "connector_stats"):
                out[name] = conn.connector_stats()
        out["free_blocks"] = self.free_blocks()
        return out
