"""The simulated lane's stand-ins for MRV2's speculative-decoding kernels do what vLLM's kernels do, kernel by kernel.

`spec_decode_parity_driver.py` runs each vLLM launcher on identical random inputs, first with vLLM's kernels in
Triton's interpreter, then with `mrv2_kernels.spec_decode` registered through vLLM's dispatcher (one subprocess: vLLM
picks its platform once per process). The DFlash2 candidate walk does not run in Triton 3.9's interpreter; it is held
to the same walk stepped from Python, each choice made by vLLM's own `gumbel_noised_argmax` in the interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("spec_decode_parity_driver.py")


@pytest.fixture(scope="module")
def parity(tmp_path_factory) -> dict:
    env = {**os.environ, "ASCEND_VLLM_SIMULATE": "1", "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache"))}
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    out = subprocess.run([sys.executable, str(DRIVER)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def test_every_spec_decode_stand_in_matches_vllms_kernel(parity):
    mismatches = {case: outputs for case, outputs in parity["report"].items()
                  if any(v != "equal" for v in outputs.values())}
    assert not mismatches, mismatches
    # Every case compared something: the EAGLE/MTP, DFlash/DSpark and DFlash2 paths and the verifier's gather.
    assert len(parity["report"]) == 13, sorted(parity["report"])


def test_only_the_dflash2_walk_fails_in_the_interpreter(parity):
    """Without its stand-in DFlash2 could not draft at all in the simulated lane."""
    assert set(parity["upstream_failed"]) == {"case_dflash2_walk_greedy", "case_dflash2_walk_sampled",
                                              "case_dflash2_walk_sampled_fp64"}
    assert all("mask has unsupported dtype" in m for m in parity["upstream_failed"].values())


def test_every_spec_decode_stand_in_was_reached_through_vllms_dispatcher(parity):
    from ascend_platform.simulated.kernel_overrides import STAND_INS
    from ascend_platform.simulated.mrv2_kernels.spec_decode import KERNELS

    ours = {s.short_name for s in STAND_INS if s.kernel in {k for k, _, _ in KERNELS}}
    ran = {name.removeprefix("mrv2_kernels.") for name in parity["usage"] if name.startswith("mrv2_kernels.")}
    assert len(ours) == len(KERNELS) and ours <= ran, (ours, ran)
