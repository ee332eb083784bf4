"""Find every upstream vLLM symbol our sources touch, and the ones no pin covers, so pins cannot go stale.

Reads our own files with `ast` (no import) and records: `import vllm...` / `from vllm... import X`; attribute
chains on names bound to vLLM modules or symbols (`kcu.get_kv_cache_config_from_groups`, `Factory._registry`,
assignments to them = patches); classes that subclass a vLLM class; `getattr/setattr/hasattr(vllm_obj, "name")`;
and string targets (`"vllm.v1.worker.utils.allocate_kv_cache"`, `"vllm.x:Y"`, and `load("vllm.x", "Y")`-style
module/attribute pairs), as the declarative patch registry and the probes name their targets that way.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from ascend_contracts.pins import PINS_FILE, Pin, load_pins
from ascend_contracts.shapes import normalize_literal

_DOTTED = re.compile(r"^vllm(\.[A-Za-z_]\w*)+$")
# `vllm.x.y:Attr` (a patch target); a bare `vllm:name` is a Prometheus metric name, not a symbol.
_COLON = re.compile(r"^(vllm(?:\.[A-Za-z_]\w*)+):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
# Python's own attributes end a chain: `Cls.method.__func__` relies on `Cls.method`, not on vLLM's `__func__`.
_PYTHON_ATTRS = frozenset({"__func__", "__name__", "__qualname__", "__module__", "__doc__", "__dict__", "__wrapped__",
                           "__self__", "__class__", "__mro__", "__bases__", "__annotations__", "__signature__",
                           "__dataclass_fields__", "__code__", "__defaults__", "__kwdefaults__", "__members__"})
_ATTR_FUNCS = {"getattr": "attribute", "hasattr": "attribute", "setattr": "patch", "delattr": "patch"}


@dataclass(frozen=True)
class Usage:
    symbol: str
    file: str
    line: int
    how: str  # import | attribute | patch | subclass | string


def _string_symbol(text: str) -> str | None:
    if _DOTTED.match(text):
        return text
    match = _COLON.match(text)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def _docstring_ids(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            ids.add(id(body[0].value))
    return ids


class _FileScanner:
    def __init__(self, tree: ast.Module, file: str):
        self.tree = tree
        self.file = file
        self.aliases: dict[str, str] = {}
        self.usages: list[Usage] = []
        self.parents: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node

    def add(self, symbol: str, node: ast.AST, how: str) -> None:
        self.usages.append(Usage(symbol, self.file, getattr(node, "lineno", 0), how))

    def _imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "vllm" or alias.name.startswith("vllm."):
                        self.add(alias.name, node, "import")
                        if alias.asname:
                            self.aliases[alias.asname] = alias.name
                        else:
                            self.aliases["vllm"] = "vllm"
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                    and (node.module == "vllm" or node.module.startswith("vllm.")):
                for alias in node.names:
                    full = node.module if alias.name == "*" else f"{node.module}.{alias.name}"
                    self.add(full, node, "import")
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = full

    def chain(self, expr: ast.AST) -> str | None:
        names: list[str] = []
        while isinstance(expr, ast.Attribute):
            names.append(expr.attr)
            expr = expr.value
        if not (isinstance(expr, ast.Name) and expr.id in self.aliases):
            return None
        parts = [self.aliases[expr.id]]
        for name in reversed(names):
            if name in _PYTHON_ATTRS:
                break
            parts.append(name)
        return ".".join(parts)

    def _attributes(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute):
                parent = self.parents.get(id(node))
                if isinstance(parent, ast.Attribute) and parent.value is node:
                    continue  # only the outermost attribute of a chain
                symbol = self.chain(node)
                if symbol:
                    self.add(symbol, node, "patch" if isinstance(node.ctx, ast.Store | ast.Del) else "attribute")
            elif isinstance(node, ast.ClassDef):
                for base in node.bases:
                    symbol = self.chain(base.value if isinstance(base, ast.Subscript) else base)
                    if symbol:
                        self.add(symbol, node, "subclass")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTR_FUNCS \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and isinstance(node.args[1].value, str):
                owner = self.chain(node.args[0])
                if owner:
                    self.add(f"{owner}.{node.args[1].value}", node, _ATTR_FUNCS[node.func.id])

    def _strings(self) -> None:
        docstrings = _docstring_ids(self.tree)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                symbol = _string_symbol(node.value)
                if symbol:
                    self.add(symbol, node, "string")
            elif isinstance(node, ast.Call) and len(node.args) >= 2 \
                    and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args[:2]) \
                    and _DOTTED.match(node.args[0].value) and _IDENT.match(node.args[1].value):
                self.add(f"{node.args[0].value}.{node.args[1].value}", node, "string")

    def run(self) -> list[Usage]:
        self._imports()
        self._attributes()
        self._strings()
        return self.usages


def scan_source(text: str, file: str = "<string>") -> list[Usage]:
    return _FileScanner(ast.parse(text, filename=file), file).run()


def scan_folder(folder: Path) -> list[Usage]:
    """Usages in every `.py` file under `folder`."""
    usages: list[Usage] = []
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" not in path.parts:
            usages += scan_source(path.read_text(encoding="utf-8"), str(path))
    return usages


def is_pinned(symbol: str, pins: list[Pin]) -> bool:
    """True when a pin names `symbol`, something inside it, or names its owner and lists it as a field/parameter.

    A string that equals a pinned constant's value (an entry-point group name) counts as pinned too.
    """
    literal = repr(symbol)
    for pin in pins:
        if pin.symbol == symbol or pin.symbol.startswith(symbol + "."):
            return True
        if symbol.startswith(pin.symbol + "."):
            first = symbol[len(pin.symbol) + 1:].split(".")[0]
            if pin.relies_on(first):
                return True
        if pin.value is not None and normalize_literal(pin.value) == literal:
            return True
    return False


@dataclass
class ScanResult:
    usages: dict[str, list[Usage]] = field(default_factory=dict)  # package -> usages
    unpinned: dict[str, list[Usage]] = field(default_factory=dict)  # package -> usages without a pin

    @property
    def ok(self) -> bool:
        return not any(self.unpinned.values())

    def unpinned_symbols(self, package: str | None = None) -> list[str]:
        packages = [package] if package else sorted(self.unpinned)
        return sorted({u.symbol for p in packages for u in self.unpinned.get(p, [])})


def check_folder(folder: Path, pins: list[Pin]) -> tuple[list[Usage], list[Usage]]:
    usages = scan_folder(folder)
    return usages, [u for u in usages if not is_pinned(u.symbol, pins)]


def scan_workspace(root: Path, extra_roots: tuple[str, ...] = ("src",)) -> ScanResult:
    """Each `packages/*/src/<pkg>` against its own pins file; `extra_roots` (the meta-package) against all pins."""
    result = ScanResult()
    all_pins: list[Pin] = []
    folders: list[tuple[str, Path, list[Pin] | None]] = []
    for pins_file in sorted(root.glob(f"packages/*/src/*/{PINS_FILE}")):
        pins = load_pins(pins_file)
        all_pins += pins
        folders.append((pins_file.parent.name, pins_file.parent, pins))
    for extra in extra_roots:
        for folder in sorted((root / extra).glob("*/__init__.py")):
            own = folder.parent / PINS_FILE
            if own.is_file():  # the meta-package may pin what only its commands use
                all_pins += load_pins(own)
            folders.append((folder.parent.name, folder.parent, None))
    for name, folder, pins in folders:
        usages, missing = check_folder(folder, all_pins if pins is None else pins)
        result.usages[name] = usages
        result.unpinned[name] = missing
    return result
