"""How the platform wires `ascend_specdecode` and the PCP manager into vLLM (no engine; the engine-level proof is in
tests/specdecode): speculative configs are validated at start-up, the workers install the Ascend drafter and
verifier, and MRV2 builds `AscendPCPManager` through upstream's `pcp_manager_cls` hook.
"""

from __future__ import annotations

import inspect
import os

import pytest


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    cache = os.environ.get("ASCEND_VLLM_CACHE")
    return cached_tiny_llama(cache_dir=f"{cache}/models" if cache else tmp_path_factory.mktemp("models"))


@pytest.fixture
def spec_config(tiny_model, monkeypatch):
    """A real VllmConfig of the tiny model with the model itself as its draft (vLLM's draft_model method)."""
    saved = dict(os.environ)  # vLLM's CPU policy (reused by the simulated lane) writes worker settings here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm.engine.arg_utils import EngineArgs

    cfg = EngineArgs(model=str(tiny_model), dtype="float32", max_model_len=256, max_num_seqs=4, enforce_eager=True,
                     speculative_config={"method": "draft_model", "model": str(tiny_model),
                                         "num_speculative_tokens": 2}).create_engine_config()
    yield cfg
    os.environ.clear()
    os.environ.update(saved)


def test_valid_speculative_config_passes_start_up(spec_config):
    from ascend_platform.simulated_platform import SimulatedNPUPlatform

    SimulatedNPUPlatform.check_and_update_config(spec_config)
    assert spec_config.speculative_config.num_speculative_tokens == 2


def test_bad_speculative_config_fails_start_up_with_one_error(spec_config):
    from ascend_platform.simulated_platform import SimulatedNPUPlatform
    from ascend_specdecode import SpeculativeConfigError

    spec_config.speculative_config.method = "medusa"
    spec_config.speculative_config.num_speculative_tokens = 0
    with pytest.raises(SpeculativeConfigError) as err:
        SimulatedNPUPlatform.check_and_update_config(spec_config)
    message = str(err.value)
    assert "\n" not in message
    assert "'medusa'" in message and "num_speculative_tokens must be a positive integer, got 0" in message


def test_draft_vocabulary_mismatch_fails_start_up(spec_config):
    from ascend_platform.simulated_platform import SimulatedNPUPlatform
    from ascend_specdecode import SpeculativeConfigError

    target_vocab = spec_config.model_config.get_vocab_size()
    spec_config.speculative_config.draft_vocab_size = target_vocab + 7
    with pytest.raises(SpeculativeConfigError, match=f"draft vocabulary size {target_vocab + 7} differs"):
        SimulatedNPUPlatform.check_and_update_config(spec_config)


def test_worker_load_model_is_the_ascend_one():
    # The mixin installs the verifier after vLLM's load_model; it must come first in the worker's MRO. That the
    # hooks run and AscendRejectionSampler verifies is shown on a real engine in tests/specdecode.
    from ascend_platform.worker.worker import AscendWorker, AscendWorkerMixin

    assert AscendWorker.load_model is AscendWorkerMixin.load_model
    assert AscendWorker._build_runner is AscendWorkerMixin._build_runner


@pytest.mark.parametrize("runner_name", ["SimulatedModelRunnerV2", "NPUModelRunnerV2"])
def test_mrv2_runners_build_the_ascend_pcp_manager(runner_name):
    from vllm.v1.worker.gpu import model_runner as upstream
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    from ascend_platform.pcp import AscendPCPManager
    from ascend_platform.worker import model_runner_v2

    runner_cls = getattr(model_runner_v2, runner_name)
    hook = inspect.getattr_static(runner_cls, "pcp_manager_cls")
    assert isinstance(hook, property)
    assert hook is not inspect.getattr_static(upstream.GPUModelRunner, "pcp_manager_cls")  # ours, first in the MRO
    built = hook.fget(object.__new__(runner_cls))  # the property reads nothing from the instance
    assert built is AscendPCPManager and issubclass(built, PCPManager)
    # upstream builds the manager with `cls=self.pcp_manager_cls` and checks the config through the class
    assert "cls=self.pcp_manager_cls" in inspect.getsource(upstream.GPUModelRunner)
    assert callable(built.validate_config)


def test_draft_model_on_mrv2_fails_start_up_naming_the_v1_runner(spec_config, monkeypatch):
    from ascend_platform.simulated_platform import SimulatedNPUPlatform
    from ascend_specdecode import SpeculativeConfigError

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(SpeculativeConfigError, match="'draft_model' runs only on the V1 runner.*"
                                                     "VLLM_USE_V2_MODEL_RUNNER=0"):
        SimulatedNPUPlatform._check_speculative_config(spec_config)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    SimulatedNPUPlatform._check_speculative_config(spec_config)


def test_mrv2_requested_where_triton_is_off_fails_start_up_once(spec_config, monkeypatch):
    """This pytest process never resolved the simulated platform, so Triton's interpreter is off here."""
    from vllm.triton_utils import HAS_TRITON

    from ascend_platform.simulated.mrv2_lane import ModelRunnerV2Unavailable
    from ascend_platform.simulated_platform import SimulatedNPUPlatform

    assert not HAS_TRITON
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ModelRunnerV2Unavailable, match="Triton's interpreter was not enabled in this process"):
        SimulatedNPUPlatform.check_and_update_config(spec_config)
