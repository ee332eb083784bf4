"""The Model Runner V2 verifier's greedy decisions through `ascend_kernels` equal vLLM's own MRV2 kernels (Triton,
interpreted) on the same batches. Cross-package: the driver runs under our platform's simulated lane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DRIVER = Path(__file__).with_name("mrv2_verifier_parity_driver.py")


def test_greedy_decisions_equal_vllms_mrv2_kernels(tmp_path):
    env = {**os.environ, "ASCEND_VLLM_SIMULATE": "1", "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_CACHE_ROOT": str(tmp_path)}
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    out = subprocess.run([sys.executable, str(DRIVER)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    assert all(case["counts"] == 0 and case["tokens"] == 0 for case in report.values()), report
    assert report["mostly_accepted"]["accepted_drafts"] > 0 and report["placeholders"]["accepted_drafts"] > 0
