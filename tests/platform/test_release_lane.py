"""What the release lane (vLLM 0.27.1, the legacy lane) reports and refuses, as a user meets it.

`ascend-vllm doctor --json` names the release, its lane and every probe's result; what Ascend's code cannot drive on
that vLLM is refused at start-up with the probe's reason (never half-run): Model Runner V2 (no KV hooks), MLA models
(no MLA prefill / spec hooks), and the connectors that need the scheduler's KV cache manager (no
`bind_kv_cache_manager`). On the current lane these tests skip: there those features run (tests/platform, tests/mla,
tests/kv_pool, tests/kv_transfer) and tests/foundation/test_doctor.py checks the doctor.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_core.upstream import (
    ENGINE_TESTED,
    connector_kv_manager_unavailable_reason,
    dflash2_unavailable_reason,
    mla_hooks_unavailable_reason,
    mrv2_unavailable_reason,
)
from ascend_core.upstream.probes import PROBES
from ascend_testkit.reach.collect import reach_env

pytestmark = pytest.mark.engine

CLI = shutil.which("ascend-vllm") or str(Path(sys.executable).with_name("ascend-vllm"))
RELEASE = "0.27.1"


def _doctor_json() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_VLLM_SIMULATE"} | reach_env()
    out = subprocess.run([CLI, "doctor", "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def doctor() -> dict:
    return _doctor_json()


def test_doctor_json_reports_the_release_lane_with_every_probe(doctor):
    vllm = doctor["vllm"]
    if vllm["version"].split("+")[0] != RELEASE:
        pytest.skip(f"not the release lane (vLLM {vllm['version']}); tests/foundation/test_doctor.py covers this one")
    assert vllm["ok"] and vllm["lane"] == "legacy"
    assert vllm["support"]["level"] == "engine-tested" and RELEASE in vllm["support"]["engine_tested"]
    probes = {p["name"]: p for p in vllm["probes"]}
    assert set(probes) == {name for name, _, _ in PROBES}  # every probe, each with its result
    assert all(p["ok"] and p["detail"] for p in probes.values()), probes
    assert probes["kv_tensor_layer_field"]["value"] == "shared_by"
    assert probes["mla_ratio_field"]["value"] == "compress_ratio"
    assert probes["speculator_dp_arg"]["value"] == "num_tokens_across_dp"
    assert probes["logits_skip_gather"]["value"] is False
    assert probes["mrv2_kv_hooks"]["value"] is False
    assert "bind_kv_cache_to_layers" in probes["mrv2_kv_hooks"]["detail"]
    mrv2 = doctor["mrv2_simulated"]
    assert mrv2["runner"] == "default -> v1" and "mrv2_kv_hooks" in mrv2["detail"]


def test_doctor_names_what_ci_engine_tests(doctor):
    support = doctor["vllm"]["support"]
    assert support["engine_tested"] == ENGINE_TESTED
    assert doctor["vllm"]["version"].split("+")[0] in ENGINE_TESTED  # CI runs no other release
    assert all(v in support["detail"] for v in ENGINE_TESTED) and all(v in support["detail"]
                                                                       for v in support["static_only"])


def test_mrv2_is_refused_at_startup_with_the_probe_reason(host_pool, tiny_model):
    refused = mrv2_unavailable_reason()
    if refused is None:
        pytest.skip("Ascend's Model Runner V2 runs on this vLLM (tests/platform and tests/mla run it)")
    host = host_pool.get("sim-v2-refused", lane="simulated", runner="v2")
    try:
        error = host.start_error(tiny_model, dtype="float32", max_model_len=128, enforce_eager=True, max_num_seqs=2,
                                 block_size=32)
    finally:
        host.close()  # nobody else can use a host whose engines are refused
    assert error is not None, "Model Runner V2 started on a vLLM the probe says it cannot run on"
    # vLLM's config validation wraps the platform hook's ModelRunnerV2Unavailable (a ValueError) in its own error.
    message = error["message"]
    assert "Model Runner V2 was requested" in message and "bind_kv_cache_to_layers" in message, error
    assert "set it to 0 for the V1 runner" in message, error


def test_mla_models_are_refused_at_startup_with_the_probe_reason():
    """The platform's config hook (check_and_update_config runs it before any worker starts) refuses an MLA model.
    Called directly rather than through an engine start: an engine would only add vLLM's model inspection (minutes
    under load) before reaching the same hook."""
    refused = mla_hooks_unavailable_reason()
    if refused is None:
        pytest.skip("Ascend's MLA backends run on this vLLM (tests/mla)")
    from types import SimpleNamespace

    from ascend_platform.simulated_platform import SimulatedNPUPlatform

    mla = SimpleNamespace(model_config=SimpleNamespace(use_mla=True, model="tiny-deepseek-v2"))
    with pytest.raises(ValueError, match="cannot run on the Ascend platform here") as info:
        SimulatedNPUPlatform._check_mla_hooks(mla)
    assert "get_mla_prefill_backend_cls" in str(info.value) and "customize_spec" in str(info.value)
    SimulatedNPUPlatform._check_mla_hooks(SimpleNamespace(model_config=SimpleNamespace(use_mla=False, model="llama")))


@pytest.mark.parametrize("qualname", ["ascend_kv_transfer.store_connector:AscendStoreConnector",
                                      "ascend_kv_transfer.mooncake_layerwise_connector:AscendMooncakeLayerwiseConnector"])
def test_connectors_needing_the_kv_cache_manager_are_refused(qualname):
    if connector_kv_manager_unavailable_reason() is None:
        pytest.skip("vLLM binds the KV cache manager to connectors here (tests/kv_pool, tests/kv_transfer run them)")
    import importlib

    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    module, name = qualname.split(":")
    cls = getattr(importlib.import_module(module), name)
    with pytest.raises(ValueError, match="has no bind_kv_cache_manager") as info:
        cls(None, KVConnectorRole.SCHEDULER, None)  # refused before it reads any configuration
    assert f"{name} cannot run on this vLLM" in str(info.value)


def test_dflash2_drafts_are_refused_with_the_probe_reason():
    """The check the platform's config hook runs on a speculative config (before any worker starts)."""
    refused = dflash2_unavailable_reason()
    if refused is None:
        pytest.skip("vLLM has DFlash2 factories here (tests/specdecode runs DFlash2 drafts)")
    from types import SimpleNamespace

    from ascend_specdecode import SpeculativeConfigError, validate_speculative_config

    draft = SimpleNamespace(architectures=["DFlash2DraftModel"])
    spec = SimpleNamespace(method="dflash", num_speculative_tokens=2, draft_model_config=draft, model="tiny-dflash2")
    with pytest.raises(SpeculativeConfigError, match="DFlash2 drafts cannot run here") as info:
        validate_speculative_config(spec)
    assert refused in str(info.value)
