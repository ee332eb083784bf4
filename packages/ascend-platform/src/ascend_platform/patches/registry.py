"""A declarative registry of the monkey patches the platform needs.

Each patch is declared once with its target (`module:attribute`, or `module:object.attribute` for an attribute of a
module-level object such as a settings instance, or `os:environ.NAME` with kind "environment" for an environment
variable vLLM's code reads), the reason it exists and the upstream contract
it relies on (the target's kind and the parameters the replacement must accept). Nothing is patched at import:
`applied()` patches for the length of a `with` block and `apply()` returns a handle that undoes it. Applying
first verifies the target exists and still has the declared shape, and fails loudly naming the patch otherwise.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


class PatchTargetError(RuntimeError):
    """A registered patch's target is missing or no longer matches its contract."""


@dataclass(frozen=True, kw_only=True)
class Patch:
    name: str
    target: str  # "package.module:attribute" or "package.module:object.attribute"
    reason: str
    contract: str  # what upstream promise the replacement depends on, in words
    kind: str = "function"  # function | class | attribute | environment
    params: tuple[str, ...] = ()  # parameters the target must (still) have

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def attribute(self) -> str:
        """The attribute set on the owner (the last dotted part after the colon)."""
        return self.target.split(":", 1)[1].rsplit(".", 1)[-1]

    @property
    def owner_path(self) -> tuple[str, ...]:
        """Attributes leading from the module to the owner object (empty when the module owns the target)."""
        return tuple(self.target.split(":", 1)[1].split(".")[:-1])


@dataclass
class AppliedPatch:
    patch: Patch
    owner: Any
    original: Any
    active: bool = True

    def undo(self) -> None:
        if self.active:
            setattr(self.owner, self.patch.attribute, self.original)
            self.active = False


class _Environment:
    """`os.environ` seen as attributes (None = unset), so an environment variable is applied and undone like any
    other target."""

    def __getattr__(self, name: str) -> str | None:
        return os.environ.get(name)

    def __setattr__(self, name: str, value: str | None) -> None:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class PatchRegistry:
    def __init__(self) -> None:
        self._patches: dict[str, Patch] = {}

    def register(self, patch: Patch) -> Patch:
        if ":" not in patch.target:
            raise ValueError(f"patch {patch.name!r}: target {patch.target!r} must be 'module:attribute'")
        if patch.name in self._patches and self._patches[patch.name] != patch:
            raise ValueError(f"patch {patch.name!r} is already registered with a different declaration")
        self._patches[patch.name] = patch
        return patch

    def __iter__(self) -> Iterator[Patch]:
        return iter(self._patches.values())

    def get(self, name: str) -> Patch:
        try:
            return self._patches[name]
        except KeyError:
            raise KeyError(f"no registered patch {name!r} (known: {sorted(self._patches)})") from None

    def resolve(self, name: str) -> tuple[Any, Any]:
        """(owner object, current target) after checking the target against the patch's contract."""
        patch = self.get(name)
        if patch.kind == "environment":
            if patch.target != f"os:environ.{patch.attribute}":
                raise PatchTargetError(f"patch {name!r}: an environment target is 'os:environ.NAME', not "
                                       f"{patch.target!r}")
            owner = _Environment()
            return owner, getattr(owner, patch.attribute)
        try:
            owner = importlib.import_module(patch.module)
        except ImportError as exc:
            raise PatchTargetError(f"patch {name!r}: module {patch.module!r} does not import ({exc}); "
                                   f"contract: {patch.contract}") from exc
        for step in patch.owner_path:
            if not hasattr(owner, step):
                raise PatchTargetError(f"patch {name!r}: {patch.target} does not exist (no {step!r} on "
                                       f"{getattr(owner, '__name__', type(owner).__name__)}); "
                                       f"contract: {patch.contract}")
            owner = getattr(owner, step)
        if not hasattr(owner, patch.attribute):
            raise PatchTargetError(f"patch {name!r}: {patch.target} does not exist; contract: {patch.contract}")
        target = getattr(owner, patch.attribute)
        if patch.kind == "function" and not callable(target):
            raise PatchTargetError(f"patch {name!r}: {patch.target} is {type(target).__name__}, not a function")
        if patch.kind == "class" and not isinstance(target, type):
            raise PatchTargetError(f"patch {name!r}: {patch.target} is {type(target).__name__}, not a class")
        if patch.params:
            have = set(inspect.signature(target).parameters)
            missing = [p for p in patch.params if p not in have]
            if missing:
                raise PatchTargetError(f"patch {name!r}: {patch.target} lost parameter(s) {missing} "
                                       f"(has {sorted(have)}); contract: {patch.contract}")
        return owner, target

    def verify(self) -> dict[str, str | None]:
        """Every registered patch -> None when its target checks out, else the error message."""
        problems: dict[str, str | None] = {}
        for patch in self:
            try:
                self.resolve(patch.name)
                problems[patch.name] = None
            except PatchTargetError as exc:
                problems[patch.name] = str(exc)
        return problems

    def apply(self, name: str, replacement: Callable[..., Any] | Any) -> AppliedPatch:
        owner, original = self.resolve(name)
        setattr(owner, self.get(name).attribute, replacement)
        return AppliedPatch(self.get(name), owner, original)

    @contextmanager
    def applied(self, name: str, replacement: Callable[..., Any] | Any) -> Iterator[Any]:
        """Patch for the duration of the block; yields the original target."""
        handle = self.apply(name, replacement)
        try:
            yield handle.original
        finally:
            handle.undo()
