"""The simulated lane's stand-ins for MRV2's Triton kernels do what vLLM's kernels do, kernel by kernel.

`kernel_parity_driver.py` runs each vLLM launcher on identical random inputs, first with vLLM's kernels in Triton's
interpreter, then with our stand-ins registered through vLLM's dispatcher (one subprocess: vLLM picks its platform
once per process). The driver imports Triton before the platform turns the interpreter on, as a process running an
engine without multiprocessing does, so vLLM's kernels reach Triton's own library through the
`simulated.triton_library_calls` bridge (spawned workers decorate that library interpreted instead).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("kernel_parity_driver.py")


@pytest.fixture(scope="module")
def parity(tmp_path_factory) -> dict:
    env = {**os.environ, "ASCEND_VLLM_SIMULATE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache"))}
    for key in ("VLLM_USE_V2_MODEL_RUNNER", "TRITON_INTERPRET"):
        env.pop(key, None)
    out = subprocess.run([sys.executable, str(DRIVER)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def test_every_stand_in_matches_vllms_kernel(parity):
    mismatches = {case: outputs for case, outputs in parity["report"].items()
                  if any(v != "equal" and not (isinstance(v, float) and v < 1e-5) for v in outputs.values())}
    assert not mismatches, mismatches
    assert len(parity["report"]) >= 20
    # Sampling with temperature is bit-exact: the same seeds and positions draw the same tokens as vLLM's kernel.
    assert parity["report"]["gumbel_sample"]["sampled"] == "equal"
    assert parity["report"]["gumbel_sample_fp64"]["sampled"] == "equal"
    assert parity["report"]["gumbel_sample_no_padding_rows"]["sampled"] == "equal"
    assert parity["report"]["gumbel_sample_greedy"]["sampled"] == "equal"
    assert parity["report"]["gumbel_sample_greedy_bf16_fp64"]["sampled"] == "equal"


HOST_PATHS = ("prepare_pos_seq_lens", "combine_sampled_and_draft_tokens", "get_num_sampled_and_rejected", "post_update",
              "gumbel_sample", "gumbel_greedy", "gather_block_tables", "temperature")


def test_host_paths_and_torch_formulations_are_both_held_to_vllms_kernels(parity):
    """The per-step stand-ins' host paths (native loops, numpy) ran on the driver's CPU tensors, and each case ran
    again with them off (the torch formulation the emulated NPU's tensors take): both equal vLLM's kernel (the
    mismatch test above covers every report entry)."""
    for name in HOST_PATHS:
        assert parity["usage"].get(f"mrv2_kernels.host.{name}", 0) > 0, name
    # sampled rows on the host: the reference's native Gumbel loop (the @torch cases run with it suspended)
    assert parity["native_calls"]["gumbel_sample"] > 0, parity["native_calls"]
    torch_cases = {case for case in parity["report"] if case.endswith("@torch")}
    expected = {"prepare_pos_seq_lens@torch", "combine_tokens_with_drafts@torch", "num_sampled_and_rejected@torch",
                "post_update@torch", "post_update_no_counts_no_qsl@torch", "gumbel_sample@torch", "temperature@torch",
                "gumbel_sample_greedy@torch", "gumbel_sample_fp64@torch", "block_tables_one_group@torch",
                "block_tables_two_groups@torch"}
    assert expected <= torch_cases, torch_cases


# vLLM kernels Triton 3.9's interpreter cannot run (compared against a naive formulation instead): MRV2 would stop
# at the first top-k/top-p or structured-output request without the stand-ins.
INTERPRETER_FAILURES = {
    "case_top_k_top_p": "'int' object has no attribute 'to'",
    "case_grammar_bitmask": "mask has unsupported dtype",
}


# MRV2's logits processors and logprob kernels a request can ask for (logits_kernel_cases.py): each held to vLLM's
# own kernel run in the interpreter, never to a naive formulation.
LOGITS_CASES = ("logit_bias", "logit_bias_restore_all_masked", "bad_words", "prompt_logprobs_token_ids",
                "logprob_token_ids", "logprob_token_ids_without_topk", "penalties_and_bincount")


def test_logits_processor_and_logprob_stand_ins_are_held_to_vllms_kernels(parity):
    assert set(LOGITS_CASES) <= set(parity["report"])
    assert not {f"case_{case}" for case in LOGITS_CASES} & set(parity["upstream_failed"])
    for case in ("logit_bias", "logit_bias_restore_all_masked", "bad_words", "penalties_and_bincount"):
        assert parity["report"][case]["logits"] == "equal", case  # masks and biases are exact, not close
    assert parity["report"]["prompt_logprobs_token_ids"] == {"token_ids": "equal"}


def test_kernels_reach_tritons_library_through_the_bridge(parity):
    assert parity["triton_library"] == {"interpreted": False, "ready": True}


def test_only_the_known_kernels_fail_in_the_interpreter(parity):
    assert set(parity["upstream_failed"]) == set(INTERPRETER_FAILURES)
    for case, message in INTERPRETER_FAILURES.items():
        assert message in parity["upstream_failed"][case]


def test_every_stand_in_was_reached_through_vllms_dispatcher(parity):
    from ascend_platform.simulated.kernel_overrides import STAND_INS
    from ascend_platform.simulated.mrv2_kernels.spec_decode import KERNELS

    # The spec-decode stand-ins run in their own driver (test_spec_decode_stand_ins.py asserts they were reached).
    spec_decode = {kernel for kernel, _, _ in KERNELS}
    ran = {name.removeprefix("mrv2_kernels.") for name in parity["usage"] if name.startswith("mrv2_kernels.")}
    assert {s.short_name for s in STAND_INS if s.kernel not in spec_decode} <= ran
    assert {"gather_block_tables"} <= ran and parity["usage"]["kernels.compute_slot_mapping"] >= 2


def test_stand_ins_take_their_kernels_parameters_in_order():
    """vLLM's dispatcher passes a launch's arguments positionally in the kernel's order."""
    import importlib
    import inspect

    from ascend_platform.simulated.kernel_overrides import STAND_INS

    for stand_in in STAND_INS:
        module, name = stand_in.kernel.rsplit(".", 1)
        kernel = getattr(importlib.import_module(module), name)
        kernel_params = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)
        ours = [p.name for p in inspect.signature(stand_in.impl).parameters.values()
                if p.kind is not inspect.Parameter.VAR_KEYWORD]
        assert ours == kernel_params, stand_in.kernel
