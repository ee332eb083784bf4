"""Run one speculative-decoding engine over a fixed greedy workload on an engine host and report what it did.

Used by the engine tests and `benchmarks/specdecode.py`: generated token ids, the acceptance report read from vLLM's
spec-decode metrics, target forward passes (vLLM's `iteration_tokens_total` histogram: one observation per engine
step, and every step runs the target once), the generation's wall time, and the classes the worker ran
(`speculative_parts`) with what our speculator and verifier counted (`speculative_usage`). Requests go one at a time
by default, so passes per generated token is a per-request figure.

`MRV2_CASES` / `mrv2_case_models` name, for every speculative method Model Runner V2 runs here, the target and drafts
the engine tests and the benchmark share: a no-speculation baseline per target, the self-draft where the method can
take one (a draft that reproduces the target, acceptance 1 at every position), a noisy self-draft (partial
acceptance: some drafts accepted, later ones rejected, within one step) and, for DFlash, a random draft.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ascend_testkit.engine import EngineHost


def measure(host: EngineHost, model: str, spec: Mapping[str, Any] | None, prompts: Sequence[str], max_tokens: int,
            *, sequential: bool = True, **engine: Any) -> dict[str, Any]:
    host.start(model, speculative_config=dict(spec) if spec else None, disable_log_stats=False, **engine)
    try:
        host.generate(prompts[:1], max_tokens=4, ignore_eos=True)  # warm-up
        host.metrics_mark()
        gen = host.generate(prompts, max_tokens=max_tokens, ignore_eos=True, sequential=sequential)
        token_ids = [o["token_ids"] for o in gen["outputs"]]
        return {
            "token_ids": token_ids,
            "acceptance": host.acceptance(spec["num_speculative_tokens"]) if spec else None,
            "target_passes": host.engine_steps(),
            "generated_tokens": sum(len(t) for t in token_ids),
            "seconds": gen["seconds"],
            "parts": host.rpc("ascend_testkit.probes:speculative_parts")[0],
            "usage": host.rpc("ascend_testkit.speculation:speculative_usage"),
        }
    finally:
        host.stop()


def _class_name(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def speculative_usage(worker: Any) -> dict[str, Any]:
    """(Runs in a worker, through `EngineHost.rpc`.) The classes that drafted and verified and what they counted:
    the speculator (MRV2) or drafter (V1), the draft model and its decoder layer classes, the verifier."""
    runner = worker.model_runner
    speculator = getattr(runner, "speculator", None) or getattr(runner, "drafter", None)
    model = getattr(speculator, "model", None)
    layers = sorted({_class_name(m) for m in (model.modules() if model is not None else ())
                     if type(m).__name__.endswith("DecoderLayer")})
    verifier = getattr(runner, "rejection_sampler", None)
    return {"runner": _class_name(runner), "speculator": _class_name(speculator),
            "speculator_counts": dict(getattr(speculator, "ascend_counts", {})), "draft_model": _class_name(model),
            "draft_layers": layers, "verifier": _class_name(verifier),
            "verifier_counts": dict(getattr(verifier, "ascend_counts", {}))}


# ---- the methods Model Runner V2 runs, and their checkpoints --------------------------------------------------------

METHODS = ("eagle", "mtp", "dflash", "dflash2", "dspark")
VLLM_METHOD = {"eagle": "eagle", "mtp": "mtp", "dflash": "dflash", "dflash2": "dflash", "dspark": "dspark"}
WINDOW = 4  # sliding window of the EAGLE-compatible Llama and of the MiMo MTP target
NOISE = {"eagle": 0.1, "mtp": 0.1, "dflash2": 0.3, "dspark": 0.3}  # ~1/3 of first drafts accepted


@dataclass(frozen=True)
class MethodCase:
    name: str
    family: str | None  # a METHODS entry; None: no speculation
    target: str  # "llama" (EAGLE-compatible), "mimo" (one layer + MTP layer), "bigram"
    draft: str  # "none", "self", "noisy", "random"


def _case(family: str | None, target: str, draft: str) -> MethodCase:
    return MethodCase(f"{family or 'baseline'}-{draft if family else target}", family, target, draft)


MRV2_CASES: tuple[MethodCase, ...] = (
    _case(None, "llama", "none"), _case("eagle", "llama", "self"), _case("eagle", "llama", "noisy"),
    _case("dflash", "llama", "random"),
    _case(None, "mimo", "none"), _case("mtp", "mimo", "self"), _case("mtp", "mimo", "noisy"),
    _case(None, "bigram", "none"), _case("dflash2", "bigram", "self"), _case("dflash2", "bigram", "noisy"),
    _case("dspark", "bigram", "self"), _case("dspark", "bigram", "noisy"),
)
CASES_BY_NAME = {c.name: c for c in MRV2_CASES}


def baseline_of(case: MethodCase) -> MethodCase:
    return CASES_BY_NAME[f"baseline-{case.target}"]


def mrv2_case_models(cache_dir: str | os.PathLike, k: int,
                     cases: Sequence[MethodCase] = MRV2_CASES) -> dict[str, dict[str, Any]]:
    """Build (once, into `cache_dir`) every checkpoint `cases` need: case name -> {"model": the target checkpoint,
    "spec": the speculative_config (None for a baseline), "engine": extra LLM arguments}."""
    from ascend_testkit.models import drafts, mimo_mtp, parallel_drafts
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    cache = Path(cache_dir)
    base = cached_tiny_llama(cache_dir=cache)
    llama = drafts.eagle_compatible_target(base, sliding_window=WINDOW)
    bigram = parallel_drafts.bigram_target(base)

    def mimo(mtp: str, noise: float = 0.0) -> Path:
        return mimo_mtp.mimo_mtp_target(base, cache / f"{base.name}-mimo-w{WINDOW}-mtp-{mtp}{noise or ''}",
                                        mtp=mtp, sliding_window=WINDOW, noise=noise)

    out: dict[str, dict[str, Any]] = {}
    for case in cases:
        noise = NOISE.get(case.family or "", 0.0) if case.draft == "noisy" else 0.0
        tag = f"{case.draft}{noise or ''}"
        model: Path = {"llama": llama, "bigram": bigram}.get(case.target) or mimo("copy")
        engine: dict[str, Any] = {"tokenizer": str(base)} if case.target == "mimo" else {}
        draft: Path | None = None
        if case.family == "eagle":
            draft = drafts.eagle_draft(llama, cache / f"{llama.name}-eagle-{tag}", self_draft=True, noise=noise)
        elif case.family == "dflash":
            draft = drafts.dflash_draft(llama, cache / f"{llama.name}-dflash-rand")
        elif case.family == "mtp":
            model = mimo("copy", noise)  # the MTP layer ships inside the target checkpoint
        elif case.family == "dflash2":
            draft = parallel_drafts.dflash2_draft(bigram, cache / f"{bigram.name}-dflash2-{tag}", self_draft=True,
                                                  noise=noise)
        elif case.family == "dspark":
            draft = parallel_drafts.dspark_draft(bigram, cache / f"{bigram.name}-dspark-{tag}", self_draft=True,
                                                 noise=noise)
        spec = None
        if case.family is not None:
            spec = {"method": VLLM_METHOD[case.family], "num_speculative_tokens": k}
            if draft is not None:
                spec["model"] = str(draft)
        out[case.name] = {"model": str(model), "spec": spec, "engine": engine}
    return out
