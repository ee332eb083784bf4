"""Synthetic vLLM source trees for the contract checker: two "releases" that differ in every way a pin can see."""

from __future__ import annotations

import textwrap
import zipfile
from pathlib import Path

import pytest

OLD = {
    "vllm/__init__.py": "",
    "vllm/_version.py": "__version__ = version = '1.0.0'\n",
    "vllm/core/__init__.py": "",
    "vllm/core/spec.py": """
        from dataclasses import dataclass, field
        from typing import TYPE_CHECKING, ClassVar

        if TYPE_CHECKING:
            from vllm.core.runner import Runner

        @dataclass(frozen=True, kw_only=True)
        class Base:
            block_size: int
            registry: ClassVar[dict] = {}

        @dataclass(frozen=True, kw_only=True)
        class Tensor(Base):
            size: int
            shared_by: list
            offset: int = 0
            scratch: list = field(default_factory=list)

        def plan(config, groups, memory):
            return None

        def hook(x, flag=False, *, mode="a"):
            return x

        GROUP = "vllm.my_group"
        Alias = Tensor
    """,
    "vllm/core/runner.py": """
        class Runner:
            def step(self, batch, num_tokens_across_dp=None):
                pass

            @classmethod
            def build(cls, cfg):
                return cls()
    """,
    "vllm/api.py": "from vllm.core.spec import Tensor as PublicTensor, plan\nfrom .core import runner as runner_mod\n",
}

NEW = {
    "vllm/__init__.py": "",
    "vllm/_version.py": "__version__ = version = '2.0.0'\n",
    "vllm/core/__init__.py": "",
    "vllm/core/spec.py": """
        from dataclasses import dataclass

        @dataclass(frozen=True, kw_only=True)
        class Base:
            block_size: int

        @dataclass(frozen=True, kw_only=True)
        class Tensor(Base):
            size: int
            layers: list
            offset: int = 0

        def hook(x, flag=True, *, mode="a"):
            return x

        GROUP = "vllm.other_group"
        Alias = Tensor
    """,
    "vllm/core/planning.py": """
        def plan(config, groups, memory):
            return None
    """,
    "vllm/core/runner.py": """
        class Runner:
            def step(self, batch, dp_sync=None):
                pass
    """,
    "vllm/api.py": "from vllm.core.spec import Tensor as PublicTensor\n",
}

PINS = '''
[[pins]]
symbol = "vllm.core.spec.Tensor"
kind = "dataclass"
use = "call"
fields = ["size", "shared_by", "block_size"]
aliases = { shared_by = ["layers"] }
covered_by = { shared_by = "ascend_core.upstream.kv_tensor_layers" }

[[pins]]
symbol = "vllm.core.spec.plan"
kind = "function"
use = "patch"
signature = ["config", "groups", "memory"]

[[pins]]
symbol = "vllm.core.spec.hook"
kind = "function"
use = "call"
params = ["x", "flag"]
signature = ["x", "flag=False", "*", "mode='a'"]

[[pins]]
symbol = "vllm.core.spec.GROUP"
kind = "attribute"
use = "read"
value = "vllm.my_group"

[[pins]]
symbol = "vllm.core.runner.Runner.step"
kind = "method"
use = "override"
params = ["batch", "num_tokens_across_dp"]
aliases = { num_tokens_across_dp = ["dp_sync", "dp_sync_state"] }
covered_by = { num_tokens_across_dp = "ascend_core.upstream.speculator_dp_kwargs" }

[[pins]]
symbol = "vllm.core.runner.Runner.build"
kind = "method"
use = "call"
covered_by = { "*" = "ascend_core.upstream.no_such_adapter" }

[[pins]]
symbol = "vllm.core.planning"
kind = "module"
use = "read"
optional = true
covered_by = { "*" = "ascend_core.upstream.capabilities" }
'''


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


def write_wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in files.items():
            zf.writestr(rel, textwrap.dedent(text).lstrip("\n"))
    return path


@pytest.fixture
def make_tree(tmp_path: Path):
    """`make_tree(name, files)`: a synthetic source tree under tmp_path (a test's own files)."""
    return lambda name, files: write_tree(tmp_path / name, files)


@pytest.fixture
def old_tree(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "old", OLD)


@pytest.fixture
def new_tree(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "new", NEW)


@pytest.fixture
def new_wheel(tmp_path: Path) -> Path:
    return write_wheel(tmp_path / "vllm-2.0.0-py3-none-any.whl", NEW)


@pytest.fixture
def pins_file(tmp_path: Path) -> Path:
    folder = tmp_path / "pkgs" / "ascend_fake"
    folder.mkdir(parents=True)
    path = folder / "upstream_pins.toml"
    path.write_text(PINS, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def wheel():
    """The torch_npu 2.13.0 wheel (the pinned release), fetched into the wheel cache once: CI reaches PyPI, so a
    missing wheel fails the tests that read it instead of skipping them."""
    from ascend_contracts.torch_npu_wheel import open_torch_npu_wheel

    return open_torch_npu_wheel("2.13.0")
