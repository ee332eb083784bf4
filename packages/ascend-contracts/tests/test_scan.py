"""The source scan: every way our code reaches into vLLM is found, and an unpinned one fails."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from ascend_contracts.pins import load_pins
from ascend_contracts.scan import is_pinned, scan_source, scan_workspace

REPO = Path(__file__).resolve().parents[3]

SOURCE = '''
"""Docstrings mentioning vllm.not.a.target are not targets."""
import vllm.envs as envs
from vllm.v1 import kv_cache_interface as kci
from vllm.v1.kv_cache_interface import KVCacheTensor
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

TARGET = "vllm.v1.worker.utils.allocate_kv_cache"
COLON = "vllm.v1.core.kv_cache_utils:get_kv_cache_config_from_groups"
GROUP = "vllm.general_plugins"
METRIC = "vllm:spec_decode_num_drafts"


class Ours(KVConnectorBase_V1):
    pass


def f(load):
    envs.VLLM_PLUGINS
    kci.MLAAttentionSpec.tokens_per_state
    KVCacheTensor.shared_by
    kci.KVCacheGroupSpec = object  # a patch
    setattr(kci.KVCacheConfig, "num_blocks", 1)
    hasattr(KVCacheTensor, "host_resident")
    load("vllm.v1.attention.backend", "AttentionBackend")
    "vllm.v1.core.kv_cache_planning"
'''


def test_scan_finds_imports_chains_patches_subclasses_and_string_targets() -> None:
    found = {(u.symbol, u.how) for u in scan_source(SOURCE, "x.py")}
    assert {
        ("vllm.envs", "import"),
        ("vllm.v1.kv_cache_interface", "import"),
        ("vllm.v1.kv_cache_interface.KVCacheTensor", "import"),
        ("vllm.distributed.kv_transfer.kv_connector.v1.base.KVConnectorBase_V1", "subclass"),
        ("vllm.v1.worker.utils.allocate_kv_cache", "string"),
        ("vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups", "string"),
        ("vllm.general_plugins", "string"),
        ("vllm.envs.VLLM_PLUGINS", "attribute"),
        ("vllm.v1.kv_cache_interface.MLAAttentionSpec.tokens_per_state", "attribute"),
        ("vllm.v1.kv_cache_interface.KVCacheTensor.shared_by", "attribute"),
        ("vllm.v1.kv_cache_interface.KVCacheGroupSpec", "patch"),
        ("vllm.v1.kv_cache_interface.KVCacheConfig.num_blocks", "patch"),
        ("vllm.v1.kv_cache_interface.KVCacheTensor.host_resident", "attribute"),
        ("vllm.v1.attention.backend.AttentionBackend", "string"),
        ("vllm.v1.core.kv_cache_planning", "string"),
    } <= found
    assert not any("not.a.target" in symbol or "num_drafts" in symbol for symbol, _ in found)


def test_is_pinned_accepts_the_symbol_its_parents_its_relied_on_members_and_pinned_values(tmp_path: Path) -> None:
    path = tmp_path / "upstream_pins.toml"
    path.write_text(textwrap.dedent('''
        [[pins]]
        symbol = "vllm.v1.kv_cache_interface.KVCacheTensor"
        kind = "dataclass"
        fields = ["layers"]

        [[pins]]
        symbol = "vllm.plugins.DEFAULT_PLUGINS_GROUP"
        kind = "attribute"
        value = "vllm.general_plugins"
    '''))
    pins = load_pins(path)
    assert is_pinned("vllm.v1.kv_cache_interface.KVCacheTensor", pins)
    assert is_pinned("vllm.v1.kv_cache_interface", pins)  # a module imported only to reach a pinned symbol
    assert is_pinned("vllm.v1.kv_cache_interface.KVCacheTensor.layers", pins)
    assert not is_pinned("vllm.v1.kv_cache_interface.KVCacheTensor.shared_by", pins)
    assert not is_pinned("vllm.v1.kv_cache_interface.KVCacheConfig", pins)
    assert is_pinned("vllm.general_plugins", pins)


def _fixture_workspace(tmp_path: Path) -> Path:
    """A copy of one real package (ascend_kernels: no vLLM use) plus a planted module that imports vLLM."""
    root = tmp_path / "ws"
    pkg = root / "packages" / "ascend-fake" / "src" / "ascend_fake"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Fake package."""\n')
    (pkg / "upstream_pins.toml").write_text(textwrap.dedent('''
        [[pins]]
        symbol = "vllm.config.VllmConfig"
        kind = "class"
    '''))
    (pkg / "pinned.py").write_text("from vllm.config import VllmConfig\n")
    (pkg / "planted.py").write_text("from vllm.v1.request import Request\n\n\ndef f(r: Request):\n"
                                    "    return r.request_id\n")
    kernels = REPO / "packages" / "ascend-kernels" / "src" / "ascend_kernels"
    shutil.copytree(kernels, root / "packages" / "ascend-kernels" / "src" / "ascend_kernels",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_scan_fails_on_an_unpinned_import_planted_in_a_package(tmp_path: Path) -> None:
    result = scan_workspace(_fixture_workspace(tmp_path))
    assert not result.ok
    assert result.unpinned_symbols("ascend_fake") == ["vllm.v1.request.Request"]
    (usage,) = result.unpinned["ascend_fake"]
    assert usage.file.endswith("planted.py") and usage.line == 1 and usage.how == "import"
    assert result.unpinned["ascend_kernels"] == []


def test_our_sources_are_fully_pinned() -> None:
    result = scan_workspace(REPO)
    assert result.usages, "no package scanned: is REPO the workspace root?"
    first = {(p, u.symbol): u for p, us in result.unpinned.items() for u in reversed(us)}
    assert result.ok, "vLLM symbols used without a pin (add [[pins]] to the package's upstream_pins.toml):\n" + \
        "\n".join(f"  {p}: {s} ({u.how}, {u.file}:{u.line})" for (p, s), u in sorted(first.items()))


def test_python_attributes_end_a_chain() -> None:
    text = "from vllm.platforms.cpu import CpuPlatform\nf = CpuPlatform.check_and_update_config.__func__\n"
    found = {u.symbol for u in scan_source(text)}
    assert "vllm.platforms.cpu.CpuPlatform.check_and_update_config" in found
    assert not any("__func__" in s for s in found)
