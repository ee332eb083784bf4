"""The declarative patch registry: targets checked before patching, scoped application, loud failures."""

from __future__ import annotations

import os
import types

import pytest

from ascend_platform.patches import REGISTRY, Patch, PatchRegistry, PatchTargetError


def test_every_catalogued_patch_matches_the_installed_vllm():
    problems = REGISTRY.verify()
    assert problems and all(p is None for p in problems.values()), problems
    for patch in REGISTRY:
        assert patch.reason and patch.contract


def test_applied_is_scoped_and_restores(tmp_path, monkeypatch):
    mod = types.ModuleType("ascend_test_patch_target")
    mod.fn = lambda a, b: a + b
    monkeypatch.setitem(__import__("sys").modules, mod.__name__, mod)
    reg = PatchRegistry()
    reg.register(Patch(name="t.fn", target=f"{mod.__name__}:fn", reason="test", contract="fn(a, b)", params=("a", "b")))
    original = mod.fn
    with reg.applied("t.fn", lambda a, b: a * b) as seen:
        assert seen is original and mod.fn(3, 4) == 12
    assert mod.fn is original and mod.fn(3, 4) == 7


def test_missing_target_or_changed_signature_fails_loudly(monkeypatch):
    mod = types.ModuleType("ascend_test_patch_target2")
    mod.fn = lambda x: x
    monkeypatch.setitem(__import__("sys").modules, mod.__name__, mod)
    reg = PatchRegistry()
    reg.register(Patch(name="gone", target=f"{mod.__name__}:nope", reason="r", contract="c"))
    reg.register(Patch(name="sig", target=f"{mod.__name__}:fn", reason="r", contract="fn(a)", params=("a",)))
    reg.register(Patch(name="mod", target="ascend_no_such_module:fn", reason="r", contract="c"))
    with pytest.raises(PatchTargetError, match="'gone'.*does not exist"):
        reg.apply("gone", None)
    with pytest.raises(PatchTargetError, match=r"'sig'.*lost parameter\(s\) \['a'\]"):
        reg.apply("sig", None)
    with pytest.raises(PatchTargetError, match="does not import"):
        reg.resolve("mod")
    assert mod.fn(5) == 5  # nothing was patched


def test_registration_rejects_conflicts_and_bad_targets():
    reg = PatchRegistry()
    reg.register(Patch(name="a", target="m:f", reason="r", contract="c"))
    reg.register(Patch(name="a", target="m:f", reason="r", contract="c"))  # identical: idempotent
    with pytest.raises(ValueError, match="different declaration"):
        reg.register(Patch(name="a", target="m:g", reason="r", contract="c"))
    with pytest.raises(ValueError, match="module:attribute"):
        reg.register(Patch(name="b", target="m.f", reason="r", contract="c"))
    with pytest.raises(KeyError, match="no registered patch"):
        reg.get("zzz")


def test_importing_the_platform_patches_nothing():
    import vllm.v1.worker.gpu.model_runner as mr

    before = mr.init_kv_cache
    import ascend_platform.worker.model_runner_v2  # noqa: F401

    assert mr.init_kv_cache is before and before.__module__ == "vllm.v1.worker.gpu.attn_utils"


def test_a_target_can_be_an_attribute_of_a_module_level_object(monkeypatch):
    mod = types.ModuleType("ascend_test_patch_target3")
    mod.settings = types.SimpleNamespace(flag=False)
    monkeypatch.setitem(__import__("sys").modules, mod.__name__, mod)
    reg = PatchRegistry()
    reg.register(Patch(name="knob", target=f"{mod.__name__}:settings.flag", kind="attribute", reason="r", contract="c"))
    reg.register(Patch(name="gone", target=f"{mod.__name__}:nothing.flag", kind="attribute", reason="r", contract="c"))
    with reg.applied("knob", True) as before:
        assert before is False and mod.settings.flag is True
    assert mod.settings.flag is False
    with pytest.raises(PatchTargetError, match="no 'nothing'"):
        reg.apply("gone", True)


def test_importing_the_simulated_platform_patches_nothing():
    import torch

    before = torch.accelerator.empty_cache
    import ascend_platform.simulated_platform  # noqa: F401

    assert torch.accelerator.empty_cache is before  # the shims go in when vLLM instantiates the platform


def test_an_environment_variable_is_applied_and_undone(monkeypatch):
    registry = PatchRegistry()
    registry.register(Patch(name="t.env", target="os:environ.ASCEND_TEST_PATCHED_VAR", kind="environment",
                            reason="test", contract="read by the test"))
    monkeypatch.delenv("ASCEND_TEST_PATCHED_VAR", raising=False)
    handle = registry.apply("t.env", "rank-ident")
    assert os.environ["ASCEND_TEST_PATCHED_VAR"] == "rank-ident" and handle.original is None
    handle.undo()
    assert "ASCEND_TEST_PATCHED_VAR" not in os.environ  # unset before, unset after
    monkeypatch.setenv("ASCEND_TEST_PATCHED_VAR", "before")
    with registry.applied("t.env", "during") as original:
        assert original == "before" and os.environ["ASCEND_TEST_PATCHED_VAR"] == "during"
    assert os.environ["ASCEND_TEST_PATCHED_VAR"] == "before"
    registry.register(Patch(name="t.bad", target="os:getenv.X", kind="environment", reason="r", contract="c"))
    with pytest.raises(PatchTargetError, match="an environment target is 'os:environ.NAME'"):
        registry.apply("t.bad", "x")
