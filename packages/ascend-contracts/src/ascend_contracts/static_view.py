"""Resolve vLLM symbols from source text with `ast`: no install, no import, only the modules a lookup needs.

Follows what a reader would: re-exports (`from x import y`, `import a.b as c`), aliases (`Foo = Bar`), class
bases across modules (for inherited fields and methods), names bound under `if TYPE_CHECKING:`/`try:`, and
dataclass fields as constructor parameters. Anything dynamic (module `__getattr__`, attributes set at runtime)
is out of reach and resolves as missing, with the reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from ascend_contracts.shapes import Missing, Param, Shape, normalize_literal
from ascend_contracts.source_reader import SourceReader

_MAX_DEPTH = 12
_STARS = "*"  # the bindings key holding a module's star imports, in order
_PY_KINDS = ("positional_only", "positional_or_keyword", "var_positional", "keyword_only", "var_keyword")


@dataclass
class _Module:
    name: str
    file: str
    is_package: bool
    bindings: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class _Target:
    kind: str  # module | class | function | value
    module: _Module
    node: Any = None


def _collect_bindings(body: list[ast.stmt], into: dict[str, tuple[Any, ...]]) -> None:
    """Top-level (or class-level) names; definitions win over assignments, the first assignment wins otherwise."""
    for stmt in body:
        if isinstance(stmt, ast.ClassDef):
            into[stmt.name] = ("class", stmt)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            into[stmt.name] = ("function", stmt)
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if alias.name == "*":  # `from .parallel_state import *`: searched when no own binding matches
                    into.setdefault(_STARS, ("stars", []))[1].append((stmt.module or "", stmt.level))
                else:
                    into.setdefault(alias.asname or alias.name, ("import_from", stmt.module or "", alias.name,
                                                                 stmt.level))
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    into.setdefault(alias.asname, ("import", alias.name))
                else:  # `import a.b` binds `a`
                    root = alias.name.split(".")[0]
                    into.setdefault(root, ("import", root))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            into.setdefault(stmt.target.id, ("value", stmt.value, stmt))
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    into.setdefault(target.id, ("value", stmt.value, stmt))
        elif isinstance(stmt, ast.If):
            _collect_bindings(stmt.body, into)
            _collect_bindings(stmt.orelse, into)
        elif isinstance(stmt, ast.Try):
            _collect_bindings(stmt.body, into)
            for handler in stmt.handlers:
                _collect_bindings(handler.body, into)
            _collect_bindings(stmt.orelse, into)
            _collect_bindings(stmt.finalbody, into)
        elif isinstance(stmt, ast.With):
            _collect_bindings(stmt.body, into)


def instance_attributes(cls: ast.ClassDef) -> set[str]:
    """Names a class's own methods assign on `self` (`self.x = ...`): attributes every instance carries."""
    names: set[str] = set()
    for stmt in cls.body:
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) or not stmt.args.args:
            continue
        this = stmt.args.args[0].arg
        for node in ast.walk(stmt):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == this:
                        names.add(leaf.attr)
    return names


def _lazy_names(binding: tuple[Any, ...] | None) -> set[str]:
    """Names a module-level `__getattr__` hands out, read from the string constants it compares `name` with."""
    if binding is None or binding[0] != "function":
        return set()
    names = set()
    for node in ast.walk(binding[1]):
        if isinstance(node, ast.Compare):
            for part in (node.left, *node.comparators):
                elements = part.elts if isinstance(part, ast.Tuple | ast.List | ast.Set) else [part]
                names.update(e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return names


def _literal_names(value: Any) -> set[str] | None:
    """`__all__ = ["a", "b"]` as a set; None when it is not a literal list or tuple of strings."""
    if not isinstance(value, ast.List | ast.Tuple):
        return None
    names = {e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return names if len(names) == len(value.elts) else None


def _dotted(expr: ast.expr) -> list[str] | None:
    if isinstance(expr, ast.Subscript):  # Generic[T], Base[int]
        expr = expr.value
    names: list[str] = []
    while isinstance(expr, ast.Attribute):
        names.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    names.append(expr.id)
    return names[::-1]


def _default(node: ast.expr | None) -> str | None:
    return None if node is None else normalize_literal(ast.unparse(node))


def params_of(args: ast.arguments) -> tuple[Param, ...]:
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = [Param(a.arg, _PY_KINDS[0] if i < len(args.posonlyargs) else _PY_KINDS[1], _default(d))
           for i, (a, d) in enumerate(zip(positional, defaults, strict=True))]
    if args.vararg:
        out.append(Param(args.vararg.arg, "var_positional"))
    out += [Param(a.arg, "keyword_only", _default(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg:
        out.append(Param(args.kwarg.arg, "var_keyword"))
    return tuple(out)


def _dataclass_options(cls: ast.ClassDef) -> dict[str, bool] | None:
    for deco in cls.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        names = _dotted(target)
        if names and names[-1] == "dataclass":
            opts = {}
            if isinstance(deco, ast.Call):
                for kw in deco.keywords:
                    if kw.arg and isinstance(kw.value, ast.Constant):
                        opts[kw.arg] = bool(kw.value.value)
            return opts
    return None


# Bases whose subclasses take their annotated fields as constructor parameters, like a dataclass.
FIELD_BASED_BASES = frozenset({"Struct", "BaseModel", "NamedTuple"})


def _field_based_base(cls: ast.ClassDef) -> bool:
    return any((_dotted(base) or [""])[-1] in FIELD_BASED_BASES for base in cls.bases)


def _field_default(value: ast.expr | None) -> tuple[bool, str | None, bool | None]:
    """`(in __init__, default, kw_only or None when not said)` of a dataclass field's right-hand side."""
    if isinstance(value, ast.Call) and (_dotted(value.func) or [""])[-1] == "field":
        kws = {kw.arg: kw.value for kw in value.keywords}
        init, kw_only = kws.get("init"), kws.get("kw_only")
        kw_only_flag = bool(kw_only.value) if isinstance(kw_only, ast.Constant) else None
        if isinstance(init, ast.Constant) and init.value is False:
            return False, None, kw_only_flag
        if "default" in kws:
            return True, _default(kws["default"]), kw_only_flag
        return True, "..." if "default_factory" in kws else None, kw_only_flag
    return True, _default(value), None


class StaticView:
    """Pins resolved against a vLLM source tree or wheel (`UpstreamView`)."""

    def __init__(self, source: SourceReader):
        self.source = source
        self.label = source.label
        self.version = source.version()
        self._modules: dict[str, _Module | None] = {}
        self._members: dict[int, dict[str, tuple[Any, ...]]] = {}

    # -- modules ---------------------------------------------------------------------------------------------
    def _module(self, name: str) -> _Module | None:
        if name not in self._modules:
            read = self.source.read_module(name)
            if read is None:
                self._modules[name] = None
            else:
                text, relpath = read
                mod = _Module(name, relpath, relpath.endswith("/__init__.py") or relpath.endswith("/"))
                try:
                    _collect_bindings(ast.parse(text, filename=relpath).body, mod.bindings)
                except SyntaxError as exc:
                    mod.error = f"cannot parse {relpath}: {exc.msg} (line {exc.lineno})"
                self._modules[name] = mod
        return self._modules[name]

    @property
    def modules_parsed(self) -> int:
        return sum(1 for m in self._modules.values() if m is not None)

    def _absolute(self, mod: _Module, target: str, level: int) -> str:
        if not level:
            return target
        base = mod.name.split(".")
        if not mod.is_package:
            base = base[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([target] if target else []))

    def _star_source(self, mod: _Module, name: str, depth: int) -> _Module | None:
        """The module a star import brings `name` from: the first whose exports (its `__all__` when it lists one
        literally, else its public names) include it, as `import *` would bind it."""
        if depth > _MAX_DEPTH or name.startswith("_"):
            return None
        for target, level in mod.bindings.get(_STARS, ("stars", []))[1]:
            source = self._module(self._absolute(mod, target, level))
            if source is None or source.error:
                continue
            listed = source.bindings.get("__all__")
            exported = _literal_names(listed[1]) if listed and listed[0] == "value" else None
            if name in source.bindings if exported is None else name in exported:
                return source
            if exported is None and self._star_source(source, name, depth + 1) is not None:
                return source
        return None

    # -- locating ----------------------------------------------------------------------------------------------
    def _locate(self, symbol: str, depth: int = 0) -> _Target | Missing:
        if depth > _MAX_DEPTH:
            return Missing(symbol, "re-export chain too deep (import cycle?)")
        parts = symbol.split(".")
        for cut in range(len(parts), 0, -1):
            name = ".".join(parts[:cut])
            if self.source.has_module(name):
                break
        else:
            return Missing(symbol, f"no module {parts[0]!r} in {self.label}")
        mod = self._module(name)
        if mod is None:
            return Missing(symbol, f"no module {name}")
        if cut == len(parts):
            return _Target("module", mod)
        return self._locate_in(mod, parts[cut:], symbol, depth)

    def _locate_in(self, mod: _Module, rest: list[str], symbol: str, depth: int) -> _Target | Missing:
        if mod.error:
            return Missing(symbol, mod.error)
        binding = mod.bindings.get(rest[0])
        if binding is None:
            if rest[0] in _lazy_names(mod.bindings.get("__getattr__")):
                return _Target("dynamic", mod)
            starred = self._star_source(mod, rest[0], depth)
            if starred is not None:
                return self._locate_in(starred, rest, symbol, depth + 1)
            return Missing(symbol, f"{mod.name} has no {rest[0]!r}")
        tail = "".join(f".{r}" for r in rest[1:])
        kind = binding[0]
        if kind == "import_from":
            return self._locate(f"{self._absolute(mod, binding[1], binding[3])}.{binding[2]}{tail}", depth + 1)
        if kind == "import":
            return self._locate(binding[1] + tail, depth + 1)
        if kind == "class":
            return self._locate_in_class(_Target("class", mod, binding[1]), rest[1:], symbol, depth)
        if kind == "function":
            return _Target("function", mod, binding[1]) if len(rest) == 1 else Missing(
                symbol, f"{mod.name}.{rest[0]} is a function; cannot look inside it")
        value = binding[1]
        names = _dotted(value) if isinstance(value, ast.Name | ast.Attribute) else None
        if names:  # `Alias = Original`
            return self._locate_in(mod, names + rest[1:], symbol, depth + 1)
        # `Registry = _Registry(...)` or `current_platform: Platform`: look inside the instance's class
        stmt = binding[2]
        maker = value.func if isinstance(value, ast.Call) else stmt.annotation if isinstance(stmt, ast.AnnAssign) \
            and value is None else None
        if len(rest) > 1 and maker is not None and _dotted(maker):
            made = self._locate_in(mod, _dotted(maker), symbol, depth + 1)
            if isinstance(made, _Target) and made.kind == "class":
                return self._locate_in_class(made, rest[1:], symbol, depth)
        if len(rest) == 1:
            return _Target("value", mod, binding)
        return Missing(symbol, f"{mod.name}.{rest[0]} is assigned at run time; cannot follow it statically")

    def _locate_in_class(self, cls: _Target, rest: list[str], symbol: str, depth: int) -> _Target | Missing:
        if not rest:
            return cls
        member = self._class_members(cls, depth).get(rest[0])
        if member is None:
            return Missing(symbol, f"class {cls.node.name} ({cls.module.file}) has no {rest[0]!r}")
        kind, node, mod = member
        if kind == "class":
            return self._locate_in_class(_Target("class", mod, node), rest[1:], symbol, depth)
        if len(rest) > 1:
            return Missing(symbol, f"{cls.node.name}.{rest[0]} is not a class; cannot look inside it")
        return _Target("function", mod, node) if kind == "function" else _Target("value", mod, ("value", node, None))

    def _bases(self, cls: _Target, depth: int) -> list[_Target]:
        out = []
        for expr in cls.node.bases:
            names = _dotted(expr)
            if names:
                found = self._locate_in(cls.module, names, ".".join(names), depth + 1)
                if isinstance(found, _Target) and found.kind == "class":
                    out.append(found)
        return out

    def _class_members(self, cls: _Target, depth: int = 0) -> dict[str, tuple[Any, ...]]:
        """Own and inherited members: `{name: (kind, node, module)}`; own ones override, earlier bases win."""
        key = id(cls.node)
        if key in self._members:
            return self._members[key]
        self._members[key] = {}  # guards against a cycle
        members: dict[str, tuple[Any, ...]] = {}
        if depth <= _MAX_DEPTH:
            for base in reversed(self._bases(cls, depth)):
                members.update(self._class_members(base, depth + 1))
        own: dict[str, tuple[Any, ...]] = {name: ("value", None, None) for name in instance_attributes(cls.node)}
        _collect_bindings(cls.node.body, own)
        for name, binding in own.items():
            if binding[0] in ("class", "function"):
                members[name] = (binding[0], binding[1], cls.module)
            else:
                members[name] = ("value", binding[1], cls.module)
        self._members[key] = members
        return members

    def _dataclass_params(self, cls: _Target, depth: int = 0) -> tuple[Param, ...] | None:
        options = _dataclass_options(cls.node)
        if options is None and _field_based_base(cls.node):  # msgspec.Struct, pydantic BaseModel, NamedTuple
            options = {kw.arg: bool(kw.value.value) for kw in cls.node.keywords
                       if kw.arg == "kw_only" and isinstance(kw.value, ast.Constant)}
        inherited: list[Param] = []
        for base in self._bases(cls, depth):
            base_params = self._dataclass_params(base, depth + 1) if depth < _MAX_DEPTH else None
            if base_params:
                inherited = [p for p in inherited if p.name not in {b.name for b in base_params}] + list(base_params)
        if options is None:
            return tuple(inherited) or None
        kw_only = bool(options.get("kw_only"))
        fields: dict[str, Param] = {p.name: p for p in inherited}
        for stmt in cls.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                annotation = ast.unparse(stmt.annotation)
                if "ClassVar" in annotation:
                    continue
                if annotation.endswith("KW_ONLY"):  # `_: KW_ONLY` makes the fields after it keyword-only
                    kw_only = True
                    continue
                init, default, own_kw_only = _field_default(stmt.value) if stmt.value is not None \
                    else (True, None, None)
                kind = "keyword_only" if (kw_only if own_kw_only is None else own_kw_only) else "positional_or_keyword"
                if init:
                    fields[stmt.target.id] = Param(stmt.target.id, kind, default)
        # dataclasses put keyword-only fields after the others, each group in definition order
        ordered = sorted(fields.values(), key=lambda p: p.kind == "keyword_only")
        return tuple(ordered)

    # -- public --------------------------------------------------------------------------------------------------
    def resolve(self, symbol: str) -> Shape | Missing:
        found = self._locate(symbol)
        if isinstance(found, Missing):
            return found
        mod = found.module
        if found.kind == "dynamic":
            return Shape(symbol, "attribute", where=f"{mod.file} (module __getattr__)", dynamic=True)
        if found.kind == "module":
            return Shape(symbol, "module", frozenset(mod.bindings) - {_STARS}, where=mod.file)
        where = f"{mod.file}:{getattr(found.node, 'lineno', 0)}" if found.kind != "value" else mod.file
        if found.kind == "class":
            members = self._class_members(found)
            init = members.get("__init__")
            explicit_init = init is not None and init[0] == "function"
            params = params_of(init[1].args) if explicit_init else self._dataclass_params(found)
            return Shape(symbol, "class", frozenset(members), params, where=where)
        if found.kind == "function":
            return Shape(symbol, "function", params=params_of(found.node.args), where=where)
        value = found.node[1]
        names = _dotted(value) if isinstance(value, ast.Name | ast.Attribute) else None
        if names:  # `device_control_env_var = DEVICE_CONTROL_ENV_VAR`: the constant's value
            target = self._locate_in(mod, names, symbol, 1)
            if isinstance(target, _Target) and target.kind == "value":
                value = target.node[1]
        return Shape(symbol, "attribute", value=None if value is None else _default(value), where=where)

    def find_elsewhere(self, symbol: str, candidates: tuple[str, ...] = ()) -> str | None:
        for candidate in candidates:
            if isinstance(self.resolve(candidate), Shape):
                return candidate
        parts = symbol.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            if self.source.has_module(module):
                break
        else:
            return None
        package = module if self.source.is_package(module) else module.rpartition(".")[0]
        name = parts[cut]
        for sibling in self.source.submodules(package):
            if sibling == module:
                continue
            read = self.source.read_module(sibling)  # a text test first: parse only likely homes
            if read is None or not any(f"{word} {name}" in read[0] for word in ("def", "class")):
                continue
            mod = self._module(sibling)
            binding = mod.bindings.get(name) if mod else None
            if binding and binding[0] in ("class", "function"):
                moved = ".".join([sibling, *parts[cut:]])
                if isinstance(self.resolve(moved), Shape):
                    return moved
        return None
