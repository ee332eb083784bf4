"""Resolve vLLM symbols by importing the running vLLM: what our code will actually meet at run time.

Imports go module by module along the dotted path, so a symbol in a module that fails to import reports the
import error instead of a bare AttributeError. Looking for where a gone symbol went reads sibling modules' source
(`StaticView` over the installed files) rather than importing them, which could have side effects.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Any

from ascend_contracts.shapes import Missing, Param, Shape, normalize_literal
from ascend_contracts.source_reader import DirectorySource
from ascend_contracts.static_view import FIELD_BASED_BASES, StaticView, instance_attributes
from ascend_core.upstream.version import installed_vllm_version

_LITERAL_TYPES = (str, int, float, bool, type(None), tuple)
_ANNOTATED_ONLY = object()


def _param(p: inspect.Parameter) -> Param:
    default = None if p.default is inspect.Parameter.empty else normalize_literal(repr(p.default))
    return Param(p.name, p.kind.name.lower(), default)


def _params(obj: Any) -> tuple[Param, ...] | None:
    try:
        return tuple(_param(p) for p in inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature
        return None


def _class_params(cls: type) -> tuple[Param, ...] | None:
    """The constructor parameters vLLM itself defines (an `__init__` of a vLLM class in the MRO, dataclass ones
    included); like the static view, a constructor inherited from outside vLLM (Enum, object, torch) is unknown."""
    mro = inspect.getmro(cls)
    for klass in mro:
        if klass.__module__.split(".")[0] == "vllm" and "__init__" in vars(klass):
            return _params(vars(klass)["__init__"])
    if any(klass.__name__ in FIELD_BASED_BASES for klass in mro[1:]):  # msgspec.Struct, pydantic, NamedTuple
        return _params(cls)
    return None


def _instance_attributes(klass: type) -> set[str]:
    """`self.x = ...` in the class's own methods, read from its source (no instance is made)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError):
        return set()
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    return instance_attributes(node) if node is not None else set()


def _class_members(cls: type) -> frozenset[str]:
    names: set[str] = set()
    for klass in inspect.getmro(cls):
        if klass is object:
            continue
        names.update(vars(klass))
        names.update(getattr(klass, "__annotations__", {}))
        if klass.__module__.split(".")[0] == "vllm":
            names.update(_instance_attributes(klass))
    if dataclasses.is_dataclass(cls):
        names.update(f.name for f in dataclasses.fields(cls))
    return frozenset(names)


def _where(obj: Any) -> str:
    try:
        path = inspect.getsourcefile(obj) or ""
        line = inspect.getsourcelines(obj)[1] if not inspect.ismodule(obj) else 0
    except (TypeError, OSError):
        return getattr(obj, "__module__", "") or ""
    marker = "/vllm/"
    path = path[path.rfind(marker) + 1:] if marker in path else path
    return f"{path}:{line}" if line else path


def _not_this_module(exc: ModuleNotFoundError, name: str) -> bool:
    """True when `import name` failed only because `name` is not a module (so it may be an attribute)."""
    return exc.name == name


class InstalledView:
    """Pins resolved against the vLLM importable in this interpreter (`UpstreamView`)."""

    def __init__(self) -> None:
        self.version = installed_vllm_version()
        self.label = f"installed vLLM {self.version or '(not installed)'}"
        self._static: StaticView | None = None
        self._refusals: dict[str, str | None] = {}

    def feature_refusal(self, adapter: str) -> str | None:
        """Why the feature gated by the `refused_by` function `adapter` is refused at start-up on this vLLM (its
        own words), or None where it runs. The same function the platform/connectors call at start-up."""
        if adapter not in self._refusals:
            module, _, name = adapter.rpartition(".")
            reason = getattr(importlib.import_module(module), name)()
            self._refusals[adapter] = None if reason is None else str(reason)
        return self._refusals[adapter]

    def _locate(self, symbol: str) -> tuple[Any, Any] | Missing:
        """`(object, owner)`; owner is the class an attribute was found on (None for module attributes)."""
        parts = symbol.split(".")
        try:
            obj: Any = importlib.import_module(parts[0])
        except ImportError as exc:
            return Missing(symbol, f"import {parts[0]} failed: {exc}")
        owner: Any = None
        path = parts[0]
        for part in parts[1:]:
            path = f"{path}.{part}"
            if inspect.ismodule(obj) and hasattr(obj, "__path__"):
                try:
                    obj, owner = importlib.import_module(path), None
                    continue
                except ModuleNotFoundError as exc:
                    if not _not_this_module(exc, path):
                        return Missing(symbol, f"import {path} failed: {exc}")
                except Exception as exc:  # the module exists but does not import on this machine
                    return Missing(symbol, f"import {path} failed: {type(exc).__name__}: {exc}")
            if inspect.isclass(obj):
                try:
                    raw = inspect.getattr_static(obj, part)
                except AttributeError:
                    if part not in _class_members(obj):
                        return Missing(symbol, f"class {obj.__qualname__} has no {part!r}")
                    raw = _ANNOTATED_ONLY  # a dataclass field without a default, or a bare annotation
                obj, owner = raw, obj
            elif hasattr(obj, part):
                obj, owner = getattr(obj, part), None
            else:
                return Missing(symbol, f"{getattr(obj, '__name__', path)} has no {part!r}")
        return obj, owner

    def resolve(self, symbol: str) -> Shape | Missing:
        found = self._locate(symbol)
        if isinstance(found, Missing):
            return found
        obj, owner = found
        if isinstance(obj, staticmethod | classmethod):
            obj = obj.__func__
        if isinstance(obj, property):
            return Shape(symbol, "attribute", where=_where(obj.fget))
        if obj is _ANNOTATED_ONLY or isinstance(obj, dataclasses.Field):
            return Shape(symbol, "attribute", where=_where(owner))
        if inspect.ismodule(obj):
            return Shape(symbol, "module", frozenset(dir(obj)), where=_where(obj))
        if inspect.isclass(obj):
            return Shape(symbol, "class", _class_members(obj), _class_params(obj), where=_where(obj))
        if callable(obj):
            return Shape(symbol, "function", params=_params(obj), where=_where(obj))
        if isinstance(obj, enum.Enum):  # an enum member: its value, as the source spells it
            obj = obj.value
        value = normalize_literal(repr(obj)) if isinstance(obj, _LITERAL_TYPES) else None
        return Shape(symbol, "attribute", value=value, where=_where(owner) if owner is not None else "")

    def _static_view(self) -> StaticView | None:
        if self._static is None:
            try:
                vllm = importlib.import_module("vllm")
            except ImportError:
                return None
            self._static = StaticView(DirectorySource(Path(vllm.__file__).parent.parent))
        return self._static

    def find_elsewhere(self, symbol: str, candidates: tuple[str, ...] = ()) -> str | None:
        for candidate in candidates:
            if isinstance(self.resolve(candidate), Shape):
                return candidate
        static = self._static_view()
        return static.find_elsewhere(symbol) if static else None
