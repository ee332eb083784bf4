"""Adapter for giving vLLM's `AttentionBackendEnum` the names of out-of-tree attention backends.

vLLM's attention layer looks its backend up by name (`AttentionBackendEnum[backend.get_name()]`). From 0.29 on,
`register_backend("NAME", path)` adds a member for a string name (`AttentionBackendEnum.register`); the legacy lane's
`register_backend` takes enum members only, so a plugin there had just the one `CUSTOM` slot. This adapter takes the
string form where the installed vLLM offers it, and otherwise adds the member exactly as the newer
`AttentionBackendEnum.register` does (a new member; no existing member or function is replaced).
"""

from __future__ import annotations

from typing import Any

REGISTRY_MODULE = "vllm.v1.attention.backends.registry"


def enum_registers_names(enum_cls: Any) -> bool:
    """Whether `enum_cls` (vLLM's `AttentionBackendEnum`) adds members for string names itself."""
    return callable(getattr(enum_cls, "register", None))


def register_attention_backend(name: str, class_path: str) -> None:
    """Make `AttentionBackendEnum[name]` resolve to `class_path` (idempotent)."""
    import importlib

    registry = importlib.import_module(REGISTRY_MODULE)
    enum_cls = registry.AttentionBackendEnum
    if name in enum_cls.__members__:
        return
    if not name.isidentifier() or hasattr(enum_cls, name):
        raise ValueError(f"invalid or reserved attention backend name {name!r}")
    if enum_registers_names(enum_cls):
        registry.register_backend(name, class_path)
        return
    member = object.__new__(enum_cls)
    member._name_ = name
    member._value_ = class_path
    setattr(enum_cls, name, member)
    enum_cls._member_map_[name] = member
    enum_cls._value2member_map_[class_path] = member
    enum_cls._member_names_.append(name)
