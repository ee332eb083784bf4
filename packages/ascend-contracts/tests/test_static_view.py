"""The ast-based view: re-exports, aliases, inheritance, dataclass constructors, wheels, and where symbols moved."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascend_contracts.shapes import Missing, Shape
from ascend_contracts.source_reader import open_source
from ascend_contracts.static_view import StaticView


def _view(path: Path) -> StaticView:
    return StaticView(open_source(path))


def test_dataclass_members_include_inherited_fields_and_constructor_order(old_tree: Path) -> None:
    shape = _view(old_tree).resolve("vllm.core.spec.Tensor")
    assert isinstance(shape, Shape) and shape.kind == "class"
    assert {"size", "shared_by", "offset", "block_size", "registry"} <= shape.members
    # ClassVar and default_factory handled like dataclasses do; kw_only puts everything behind '*'
    assert shape.signature == ("*", "block_size", "size", "shared_by", "offset=0", "scratch=...")


def test_reexports_aliases_and_relative_imports_resolve_to_the_definition(old_tree: Path) -> None:
    view = _view(old_tree)
    public = view.resolve("vllm.api.PublicTensor")
    assert isinstance(public, Shape) and public.where == "vllm/core/spec.py:13"
    assert isinstance(view.resolve("vllm.core.spec.Alias.shared_by"), Shape)
    method = view.resolve("vllm.api.runner_mod.Runner.build")
    assert isinstance(method, Shape) and method.signature == ("cfg",)


def test_literal_values_and_function_signatures(old_tree: Path) -> None:
    view = _view(old_tree)
    assert view.resolve("vllm.core.spec.GROUP").value == "'vllm.my_group'"
    assert view.resolve("vllm.core.spec.hook").signature == ("x", "flag=False", "*", "mode='a'")
    assert view.version == "1.0.0"


def test_missing_symbols_say_why(old_tree: Path) -> None:
    view = _view(old_tree)
    gone = view.resolve("vllm.core.spec.nothing")
    assert isinstance(gone, Missing) and "vllm.core.spec has no 'nothing'" in gone.reason
    assert "no 'step2'" in view.resolve("vllm.core.runner.Runner.step2").reason
    assert isinstance(view.resolve("vllm.core.spec.plan.inner"), Missing)


def test_wheel_reads_like_a_tree(new_tree: Path, new_wheel: Path) -> None:
    tree, wheel = _view(new_tree), _view(new_wheel)
    for symbol in ("vllm.core.spec.Tensor", "vllm.core.spec.hook", "vllm.core.runner.Runner.step", "vllm.core.spec"):
        assert tree.resolve(symbol) == wheel.resolve(symbol)
    assert wheel.version == "2.0.0"
    assert wheel.label == new_wheel.name


def test_find_elsewhere_prefers_declared_candidates_then_searches_siblings(new_tree: Path) -> None:
    view = _view(new_tree)
    assert view.find_elsewhere("vllm.core.spec.plan") == "vllm.core.planning.plan"
    assert view.find_elsewhere("vllm.core.spec.plan", ("vllm.core.runner.Runner",)) == "vllm.core.runner.Runner"
    assert view.find_elsewhere("vllm.core.spec.nowhere") is None


def test_only_the_modules_a_lookup_needs_are_parsed(new_tree: Path) -> None:
    view = _view(new_tree)
    view.resolve("vllm.core.runner.Runner.step")
    assert view.modules_parsed <= 3  # vllm.core.runner (+ nothing else needed)


def test_open_source_rejects_what_is_not_vllm(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither a vLLM wheel"):
        open_source(tmp_path)


RUNTIME_BOUND = {
    "vllm/__init__.py": "",
    "vllm/platforms/__init__.py": """
        from typing import TYPE_CHECKING

        import msgspec
        from vllm.platforms.interface import Platform
        from dataclasses import KW_ONLY, dataclass, field

        if TYPE_CHECKING:
            current_platform: Platform
        else:
            def __getattr__(name):
                if name == "current_platform":
                    return Platform()
                if name in ("lazy_thing",):
                    return 1
                raise AttributeError(name)

        class _Registry:
            def register_model(self, name, cls):
                pass

        ModelRegistry = _Registry()
        ENV = "VLLM_DEVICE"

        class Params(msgspec.Struct, kw_only=True):
            n: int = 1
            extra_args: dict | None = None

        @dataclass
        class Options:
            a: int
            b: int = field(default=0, kw_only=True)
            _: KW_ONLY
            c: str = "x"
    """,
    "vllm/platforms/interface.py": """
        class Platform:
            env_var = ENV_NAME

            def __init__(self):
                self.device, self.stream = None, None
                self.count: int = 0

            def set_device(self, device):
                pass

        ENV_NAME = "VLLM_DEVICE"
    """,
}


def test_runtime_bound_names_instances_and_keyword_only_fields(make_tree) -> None:
    view = _view(make_tree("rt", RUNTIME_BOUND))
    # `current_platform: Platform` (annotation) and `ModelRegistry = _Registry()` (instance) reach their classes
    assert view.resolve("vllm.platforms.current_platform.set_device").signature == ("device",)
    assert view.resolve("vllm.platforms.ModelRegistry.register_model").signature == ("name", "cls")
    # a module __getattr__ name exists but is opaque
    lazy = view.resolve("vllm.platforms.lazy_thing")
    assert isinstance(lazy, Shape) and lazy.dynamic
    # a class attribute naming a module constant reads as the constant's value
    assert view.resolve("vllm.platforms.interface.Platform.env_var").value == "'VLLM_DEVICE'"
    assert view.resolve("vllm.platforms.Options").signature == ("a", "*", "b=0", "c='x'")
    assert view.resolve("vllm.platforms.Params").signature == ("*", "n=1", "extra_args=None")  # msgspec.Struct
    # attributes an instance gets in __init__ count as members
    assert {"device", "stream", "count", "set_device"} <= view.resolve("vllm.platforms.interface.Platform").members


STAR_EXPORTS = {
    "vllm/__init__.py": "",
    "vllm/distributed/__init__.py": """
        from .listed import *
        from .plain import *
    """,
    "vllm/distributed/listed.py": """
        __all__ = ["exported"]
        def exported(): ...
        def unlisted(): ...
    """,
    "vllm/distributed/plain.py": """
        from .deeper import *
        def get_world_size(group=None): ...
        def _private(): ...
    """,
    "vllm/distributed/deeper.py": "def deep_helper(x): ...\n",
}


def test_star_imports_export_what_import_star_binds(make_tree) -> None:
    """`from .parallel_state import *` is how `vllm.distributed.get_tensor_model_parallel_world_size` exists:
    the static view follows it as `import *` would (`__all__` when listed, else the public names, transitively)."""
    view = _view(make_tree("star", STAR_EXPORTS))
    assert view.resolve("vllm.distributed.get_world_size").signature == ("group=None",)
    assert view.resolve("vllm.distributed.exported").where.endswith("listed.py:2")
    assert view.resolve("vllm.distributed.deep_helper").signature == ("x",)
    for hidden in ("unlisted", "_private", "nothing"):
        assert isinstance(view.resolve(f"vllm.distributed.{hidden}"), Missing), hidden
    assert "*" not in view.resolve("vllm.distributed").members
