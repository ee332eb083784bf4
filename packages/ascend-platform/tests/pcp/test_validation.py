"""PCP's conflicts are errors that name the conflicting feature and the setting to change."""

from __future__ import annotations

import pytest
from vllm.config import CUDAGraphMode, VllmConfig

from ascend_platform.pcp import AscendPCPManager, PCPConfigError, pcp_conflicts, validate_pcp_config


@pytest.fixture(scope="module")
def base_config() -> VllmConfig:
    return VllmConfig()


@pytest.fixture
def config(base_config):
    # vLLM's config refuses PCP > 1 on this CPU build (its V1 runner), so PCP is set after construction.
    parallel, compilation = base_config.parallel_config, base_config.compilation_config
    saved = (
        parallel.prefill_context_parallel_size,
        parallel.decode_context_parallel_size,
        parallel.pipeline_parallel_size,
        compilation.cudagraph_mode,
    )
    parallel.prefill_context_parallel_size = 2
    yield base_config
    (
        parallel.prefill_context_parallel_size,
        parallel.decode_context_parallel_size,
        parallel.pipeline_parallel_size,
        compilation.cudagraph_mode,
    ) = saved


def test_plain_pcp_is_accepted(config):
    validate_pcp_config(config, supports_mm_inputs=False)
    AscendPCPManager.validate_config(config, False)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda c: setattr(c.parallel_config, "decode_context_parallel_size", 2), "decode_context_parallel_size=2"),
        (lambda c: setattr(c.parallel_config, "pipeline_parallel_size", 2), "pipeline_parallel_size=2"),
        (lambda c: setattr(c.compilation_config, "cudagraph_mode", CUDAGraphMode.FULL), "graph mode FULL"),
    ],
)
def test_each_conflict_is_named(config, change, needle):
    change(config)
    with pytest.raises(PCPConfigError, match=needle):
        validate_pcp_config(config)


def test_multimodal_and_all_conflicts_at_once(config):
    config.parallel_config.decode_context_parallel_size = 2
    config.parallel_config.pipeline_parallel_size = 2
    conflicts = pcp_conflicts(config, supports_mm_inputs=True)
    assert [c.split(" (")[0].split(":")[0] for c in conflicts] == [
        "decode context parallel",
        "pipeline parallel",
        "multimodal inputs",
    ]
    with pytest.raises(PCPConfigError) as err:
        AscendPCPManager.validate_config(config, True)
    assert "multimodal" in str(err.value) and "decode context parallel" in str(err.value)


def test_graph_modes_that_keep_full_graphs_to_decodes_are_fine(config):
    for mode in (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.PIECEWISE):
        config.compilation_config.cudagraph_mode = mode
        assert pcp_conflicts(config) == []


def test_no_pcp_no_check(config):
    config.parallel_config.prefill_context_parallel_size = 1
    config.parallel_config.pipeline_parallel_size = 2
    assert pcp_conflicts(config, supports_mm_inputs=True) == []


def test_lora_is_named(config):
    from vllm.config import LoRAConfig

    config.lora_config = LoRAConfig()
    try:
        with pytest.raises(PCPConfigError, match=r"LoRA \(enable_lora=True\)"):
            validate_pcp_config(config)
    finally:
        config.lora_config = None


def test_models_and_features_pcp_cannot_serve_are_named(config):
    from types import SimpleNamespace

    class Model(SimpleNamespace):
        def get_sliding_window(self):
            return self.window

    def conflicts(**model):
        fields = dict(model="m", is_encoder_decoder=False, use_mla=False, window=None) | model
        fake = SimpleNamespace(parallel_config=config.parallel_config, compilation_config=config.compilation_config,
                               model_config=Model(**fields), lora_config=None, speculative_config=None)
        return pcp_conflicts(fake)

    assert conflicts() == []
    assert "encoder-decoder model (m)" in conflicts(is_encoder_decoder=True)[0]
    assert "MLA model (m): the Ascend MLA backend (ASCEND_MLA) does not serve PCP" in conflicts(use_mla=True)[0]
    assert "sliding-window attention (sliding_window=64)" in conflicts(window=64)[0]
    spec = SimpleNamespace(parallel_config=config.parallel_config, compilation_config=config.compilation_config,
                           model_config=None, lora_config=None, speculative_config=SimpleNamespace(method="eagle"))
    assert "speculative decoding (method='eagle')" in pcp_conflicts(spec)[0]
