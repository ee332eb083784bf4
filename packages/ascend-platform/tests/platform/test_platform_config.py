"""`check_and_update_config` and attention selection on real `VllmConfig`s of the tiny model (no engine)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    cache = os.environ.get("ASCEND_VLLM_CACHE")
    return cached_tiny_llama(cache_dir=f"{cache}/models" if cache else tmp_path_factory.mktemp("models"))


@pytest.fixture
def restore_environ():
    # vLLM's CPU policy (reused by the simulated lane) writes worker settings into os.environ.
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def make_config(tiny_model, restore_environ, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")

    def make(**kwargs):
        from vllm.engine.arg_utils import EngineArgs

        args = dict(model=str(tiny_model), dtype="float32", max_model_len=256, max_num_seqs=4, enforce_eager=True)
        args.update(kwargs)
        return EngineArgs(**args).create_engine_config()

    return make


def test_simulated_lane_decisions(make_config):
    from vllm.config import CompilationMode, CUDAGraphMode

    from ascend_platform.npu_platform import WORKER_CLS
    from ascend_platform.simulated_platform import SimulatedNPUPlatform

    cfg = make_config(additional_config={"graph_mode": "piecewise"})
    SimulatedNPUPlatform.check_and_update_config(cfg)
    assert cfg.parallel_config.worker_cls == WORKER_CLS
    assert cfg.cache_config.block_size == 128  # our default (equal to vLLM-CPU's; the next test shows ours decides)
    # An explicit graph mode is kept (the simulated lane records what it would capture); nothing is compiled.
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert cfg.compilation_config.cudagraph_capture_sizes == [1, 2, 4]
    assert cfg.compilation_config.mode == CompilationMode.NONE
    cfg = make_config()
    SimulatedNPUPlatform.check_and_update_config(cfg)
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.NONE  # 'auto' stays eager in the simulated lane
    assert "all" in cfg.compilation_config.custom_ops
    assert cfg.cache_config.kv_cache_memory_bytes == 1 << 30  # VLLM_CPU_KVCACHE_SPACE, via vLLM's CPU policy


def test_block_size_from_config_and_user_wins(make_config):
    from ascend_platform.simulated_platform import SimulatedNPUPlatform

    cfg = make_config(additional_config={"block_size": 64})
    SimulatedNPUPlatform.check_and_update_config(cfg)
    assert cfg.cache_config.block_size == 64
    cfg = make_config(block_size=32, additional_config={"block_size": 64})
    SimulatedNPUPlatform.check_and_update_config(cfg)
    assert cfg.cache_config.block_size == 32


_MLA_BLOCK_SIZES = r"""
import json, sys, torch
torch.cpu._is_amx_tile_supported = lambda: False  # a host without AMX tiles, whatever this one has
from vllm.engine.arg_utils import EngineArgs
sizes = {}
for asked in (None, 64, 128):
    extra = {} if asked is None else {"block_size": asked}
    cfg = EngineArgs(model=sys.argv[1], dtype="float32", max_model_len=256, max_num_seqs=4, enforce_eager=True,
                     **extra).create_engine_config()
    sizes[str(asked)] = [cfg.cache_config.block_size, cfg.model_config.use_mla]
print("SIZES " + json.dumps(sizes))
"""


def test_an_mla_models_block_size_is_the_ascend_policys_on_any_host(tmp_path_factory, restore_environ):
    """vLLM's CPU policy, which the simulated lane reuses for the CPU device, forces 16-token blocks on every MLA
    model on a host without AMX tiles (for its reference CPU_MLA kernel), a user's choice included. This lane never
    runs that kernel: the block size stays the user's, else the Ascend default (a process of the simulated lane, so
    vLLM's own config construction calls our platform; AMX reported absent, so the CPU policy takes that path)."""
    import json
    import subprocess
    import sys

    from ascend_testkit.models.deepseek import TinyDeepseekSpec, cached_tiny_deepseek

    cache = os.environ.get("ASCEND_VLLM_CACHE")
    model = cached_tiny_deepseek(TinyDeepseekSpec(), f"{cache}/models" if cache else tmp_path_factory.mktemp("m"))
    env = dict(os.environ, ASCEND_VLLM_SIMULATE="1", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    out = subprocess.run([sys.executable, "-c", _MLA_BLOCK_SIZES, str(model)], env=env, capture_output=True,
                         text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("SIZES ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    assert json.loads(lines[-1].removeprefix("SIZES ")) == {"None": [128, True], "64": [64, True],
                                                              "128": [128, True]}


def test_device_lane_graph_mode_and_capture_sizes(make_config):
    from vllm.config import CUDAGraphMode

    from ascend_platform.npu_platform import AscendNPUPlatform
    from ascend_platform.plugin_config import parse_ascend_config

    cfg = make_config(enforce_eager=False)
    AscendNPUPlatform._decide_graph_mode(cfg, parse_ascend_config({}))
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert cfg.compilation_config.cudagraph_capture_sizes == [1, 2, 4]  # vLLM's ladder, capped at max_num_seqs
    AscendNPUPlatform._decide_graph_mode(cfg, parse_ascend_config({"graph_mode": "full",
                                                                   "graph_capture_sizes": [2, 4, 16]}))
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert cfg.compilation_config.cudagraph_capture_sizes == [2, 4]
    cfg = make_config(enforce_eager=True)
    AscendNPUPlatform._decide_graph_mode(cfg, parse_ascend_config({}))
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.NONE


def test_bad_config_and_npu_kernels_fail_in_the_simulated_lane(make_config):
    from ascend_platform.plugin_config import AscendConfigError
    from ascend_platform.simulated_platform import SimulatedNPUPlatform

    with pytest.raises(AscendConfigError, match="unknown key 'bogus'"):
        SimulatedNPUPlatform.check_and_update_config(make_config(additional_config={"bogus": True}))
    with pytest.raises(AscendConfigError, match="'kernel_backend'.*allowed: 'auto', 'reference'"):
        SimulatedNPUPlatform.check_and_update_config(make_config(additional_config={"kernel_backend": "npu"}))


def test_attention_selection_through_the_platform(make_config):
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from ascend_platform.attention.selector import ATTENTION_310P_BACKEND, ATTENTION_BACKEND
    from ascend_platform.attention.validation import AttentionConfigError
    from ascend_platform.simulated_platform import SimulatedNPUPlatform

    sel = AttentionSelectorConfig(head_size=32, dtype=torch.float32, kv_cache_dtype="auto", block_size=32)
    with set_current_vllm_config(make_config()):
        assert SimulatedNPUPlatform.get_attn_backend_cls(None, sel) == ATTENTION_BACKEND
    assert "ASCEND" in AttentionBackendEnum.__members__  # layers look the backend up by name
    with set_current_vllm_config(make_config()):  # a user's choice is honoured when it is ours, else refused by name
        assert SimulatedNPUPlatform.get_attn_backend_cls(AttentionBackendEnum["ASCEND"], sel) == ATTENTION_BACKEND
        with pytest.raises(AttentionConfigError, match=r"attention_backend='FLASH_ATTN' .* it takes ASCEND "):
            SimulatedNPUPlatform.get_attn_backend_cls(AttentionBackendEnum.FLASH_ATTN, sel)
    with set_current_vllm_config(make_config(additional_config={"chip": "310P"})):
        assert SimulatedNPUPlatform.get_attn_backend_cls(None, sel) == ATTENTION_310P_BACKEND
    from ascend_platform.attention.selector import MLA_BACKEND

    with set_current_vllm_config(make_config()):
        assert SimulatedNPUPlatform.get_attn_backend_cls(None, sel._replace(use_mla=True)) == MLA_BACKEND
        with pytest.raises(AttentionConfigError, match="ASCEND_MLA cannot serve this model: kv_cache_dtype 'fp8'"):
            SimulatedNPUPlatform.get_attn_backend_cls(None, sel._replace(use_mla=True, kv_cache_dtype="fp8"))
    from ascend_platform.attention.selector import SFA_BACKEND, AttentionChoice, select_attention_backend

    with set_current_vllm_config(make_config()):
        assert SimulatedNPUPlatform.get_attn_backend_cls(None, sel._replace(use_mla=True, use_sparse=True)) \
            == SFA_BACKEND
    assert "ASCEND_SFA" in AttentionBackendEnum.__members__
    from ascend_platform.attention.selector import DSA_BACKEND

    # DeepSeek V4's compressed sparse attention: the backend its compressed layers name (ascend_platform.models)
    assert select_attention_backend(AttentionChoice(use_mla=True, use_sparse=True, compressed=True,
                                                    is_310p=False)) == DSA_BACKEND
    assert "ASCEND_DSA" in AttentionBackendEnum.__members__
    with pytest.raises(NotImplementedError, match="ASCEND_MLA_COMPRESSED"):  # compressed MLA without the indexer
        select_attention_backend(AttentionChoice(use_mla=True, use_sparse=False, compressed=True, is_310p=False))
