"""Our calls of torch_npu ops, read with `ast`, and each held to the op's schema as a torch_npu wheel declares it.

torch_npu is reached however a module reaches it: `import torch_npu [as t]`, `from torch_npu import atb`, a loader
function returning `importlib.import_module("torch_npu")` (`_torch_npu().op(...)`) or a transparent wrapper of it
(`Counted(_torch_npu())`: a call of a local name with the module as its only argument), names bound to any of those
XX
`**kwargs` is resolved when it is a local dict built from literal keys (`{...}`, `dict(...)`, `.update(...)`,
`kw["k"] = v`), so conditionally passed keywords are checked too; names of module-level constants are folded, so
`sparse_mode=_SPARSE_BAND` is checked as the int it is.

`check_call(call, schema)` finds what would fail only on a card: an unknown keyword, too many positionals, a
keyword-only parameter passed by position, a required parameter missing, a literal of the wrong type, a result
unpacked into the wrong number of names.
"""

from __future__ import annotations

import ast
import difflib
import operator
from dataclasses import dataclass, field
from pathlib import Path

from ascend_contracts.torch_npu_schema import PYTHON_KINDS, Schema, SchemaParam

TORCH_NPU = "torch_npu"
# How a call reaches an op: attributes of these paths are ops; `torch.ops.<ns>.<op>[.overload]` is too.
OP_OWNERS = {"torch_npu": "torch_npu", "torch_npu.atb": "torch_npu.atb", "torch.ops.npu": "torch.ops.npu",
             "torch.ops.atb": "torch.ops.atb"}
_LOADERS = frozenset({"importlib.import_module", "__import__"})
_TRACKED = ("torch_npu", "torch", "importlib")  # modules whose names the scan follows
_FOLD = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow,
         ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv, ast.Mod: operator.mod}
UNKNOWN = object()  # an argument whose value the scan cannot tell


def kind_of(value: object) -> str:
    """The Python kind of a folded literal: int, float, bool, str, None, or list[<kinds>]."""
    if value is None:
        return "None"
    if isinstance(value, bool | int | float | str):
        return type(value).__name__
    if isinstance(value, list):
        inner = sorted({kind_of(v) for v in value if v is not UNKNOWN})
        return f"list[{'|'.join(inner)}]"
    return "?"


@dataclass(frozen=True)
class NpuCall:
    op: str
    via: str  # "torch_npu" | "torch_npu.atb" | "torch.ops.npu" | "torch.ops.atb"
    file: str
    line: int
    function: str  # the enclosing top-level function, "" at module level
    positional: tuple[tuple[str, ...] | None, ...] = ()  # per argument: its possible literal kinds, None unknown
    star_args: bool = False
    keywords: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    unresolved_kwargs: bool = False  # a `**mapping` whose keys the scan could not read
    unpacked: int | None = None  # `a, b = op(...)`: 2
    indexed: int | None = None  # `op(...)[0]`: 0

    @property
    def target(self) -> str:
        return f"{self.via}.{self.op}"

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" + (f" in {self.function}()" if self.function else "")


class _Scope:
    """Names bound to torch_npu paths, module constants and local kwargs dicts, inherited by nested functions."""

    def __init__(self, parent: _Scope | None = None):
        self.parent = parent
        self.paths: dict[str, str | None] = {}  # None: shadowed (a parameter of that name)
        self.loaders: set[str] = set()
        self.constants: dict[str, object] = {}
        self.dicts: dict[str, dict[str, list[ast.expr]] | None] = {}  # None: keys not resolvable

    def lookup(self, attr: str, name: str):
        scope = self
        while scope is not None:
            table = getattr(scope, attr)
            if name in table:
                return table[name]
            scope = scope.parent
        return None

    def is_loader(self, name: str) -> bool:
        scope = self
        while scope is not None:
            if name in scope.loaders:
                return True
            scope = scope.parent
        return False


def _own_statements(body: list[ast.stmt]):
    """Statements of a body and of its nested blocks (if/for/with/try), not of nested functions or classes."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for name in ("body", "orelse", "finalbody", "handlers"):
            nested = getattr(stmt, name, [])
            yield from _own_statements([s for s in nested if isinstance(s, ast.stmt | ast.excepthandler)])


class _ModuleScanner:
    def __init__(self, tree: ast.Module, file: str, imported_loaders: frozenset[str] = frozenset()):
        self.tree = tree
        self.file = file
        self.imported_loaders = imported_loaders
        self.calls: list[NpuCall] = []
        self.parents: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node

    # --- what an expression stands for -----------------------------------------------------------------------
    def path(self, expr: ast.expr, scope: _Scope) -> str | None:
        """The dotted torch_npu / torch path `expr` evaluates to, if it is one."""
        if isinstance(expr, ast.Name):
            return scope.lookup("paths", expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.path(expr.value, scope)
            return f"{owner}.{expr.attr}" if owner else None
        if isinstance(expr, ast.Call):
            func = expr.func
            if isinstance(func, ast.Name) and scope.is_loader(func.id):
                return TORCH_NPU
            if isinstance(func, ast.Name) and len(expr.args) == 1 and not expr.keywords \
                    and self.path(expr.args[0], scope) == TORCH_NPU:
                return TORCH_NPU  # a transparent wrapper of the module (e.g. one counting each call)
            if self._is_import_call(expr, scope):
                return expr.args[0].value
            if isinstance(func, ast.Name) and func.id == "getattr" and len(expr.args) >= 2 \
                    and isinstance(expr.args[1], ast.Constant) and isinstance(expr.args[1].value, str):
                owner = self.path(expr.args[0], scope)
                return f"{owner}.{expr.args[1].value}" if owner else None
        return None

    def _is_import_call(self, call: ast.Call, scope: _Scope) -> bool:
        func = call.func
        name = self.path(func, scope) or (func.id if isinstance(func, ast.Name) else None)
        return name in _LOADERS and len(call.args) == 1 and isinstance(call.args[0], ast.Constant) \
            and call.args[0].value in (TORCH_NPU, "torch_npu.atb")

    def fold(self, expr: ast.expr, scope: _Scope) -> list[object]:
        """The values `expr` may have when it is built from literals and module constants, else [UNKNOWN]."""
        if isinstance(expr, ast.Constant):
            return [expr.value]
        if isinstance(expr, ast.Name):
            value = scope.lookup("constants", expr.id)
            return [value] if value is not None or expr.id == "None" else [UNKNOWN]
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub | ast.UAdd | ast.Not):
            out = []
            for v in self.fold(expr.operand, scope):
                if isinstance(v, bool | int | float):
                    out.append(not v if isinstance(expr.op, ast.Not) else (-v if isinstance(expr.op, ast.USub) else +v))
                else:
                    out.append(UNKNOWN)
            return out
        if isinstance(expr, ast.BinOp) and type(expr.op) in _FOLD:
            left, right = self.fold(expr.left, scope), self.fold(expr.right, scope)
            if len(left) == 1 and len(right) == 1 and all(isinstance(v, int | float) and not isinstance(v, bool)
                                                          for v in (left[0], right[0])):
                try:
                    return [_FOLD[type(expr.op)](left[0], right[0])]
                except (ArithmeticError, ValueError):
                    return [UNKNOWN]
            return [UNKNOWN]
        if isinstance(expr, ast.IfExp):
            return self.fold(expr.body, scope) + self.fold(expr.orelse, scope)
        if isinstance(expr, ast.List | ast.Tuple):
            return [[v for e in expr.elts for v in (self.fold(e, scope) if not isinstance(e, ast.Starred) else [])]]
        if isinstance(expr, ast.ListComp):
            return [[UNKNOWN]]
        return [UNKNOWN]

    def kinds(self, expr: ast.expr, scope: _Scope) -> tuple[str, ...] | None:
        values = self.fold(expr, scope)
        if any(v is UNKNOWN for v in values):
            return None
        return tuple(sorted({kind_of(v) for v in values}))

    # --- bindings --------------------------------------------------------------------------------------------
    def bind(self, body: list[ast.stmt], scope: _Scope, module_level: bool) -> None:
        statements = list(_own_statements(body))
        for stmt in statements:
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    root = alias.name.split(".")[0]
                    if root in _TRACKED:
                        scope.paths[alias.asname or root] = alias.name if alias.asname else root
            elif isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module \
                    and stmt.module.split(".")[0] in _TRACKED:
                for alias in stmt.names:
                    scope.paths[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
            elif isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module:
                for alias in stmt.names:  # another module's loader (e.g. the backend's counting `_npu`)
                    if f"{stmt.module}.{alias.name}" in self.imported_loaders:
                        scope.loaders.add(alias.asname or alias.name)
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and self._returns_torch_npu(stmt, scope):
                scope.loaders.add(stmt.name)
        for _ in range(2):  # a binding may use one made later in the body (x = t; t = loader() reads fine)
            for stmt in statements:
                if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
                    self._assign(stmt, scope, module_level)
        self._kwargs_dicts(statements, scope)

    def _returns_torch_npu(self, func: ast.FunctionDef | ast.AsyncFunctionDef, outer: _Scope) -> bool:
        inner = _Scope(outer)
        for stmt in _own_statements(func.body):
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.name == TORCH_NPU:
                        inner.paths[alias.asname or TORCH_NPU] = TORCH_NPU
        returns = [s for s in _own_statements(func.body) if isinstance(s, ast.Return) and s.value is not None]
        return bool(returns) and all(self.path(r.value, inner) == TORCH_NPU for r in returns)

    def _assign(self, stmt: ast.Assign | ast.AnnAssign, scope: _Scope, module_level: bool) -> None:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for target in targets:
            if isinstance(target, ast.Name):
                bound = self.path(stmt.value, scope)
                if bound:
                    scope.paths[target.id] = bound
                elif module_level:
                    values = self.fold(stmt.value, scope)
                    if len(values) == 1 and values[0] is not UNKNOWN:
                        scope.constants[target.id] = values[0]
            elif module_level and isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) \
                    and len(target.elts) == len(stmt.value.elts):
                for name, value in zip(target.elts, stmt.value.elts, strict=True):
                    folded = self.fold(value, scope)
                    if isinstance(name, ast.Name) and len(folded) == 1 and folded[0] is not UNKNOWN:
                        scope.constants[name.id] = folded[0]

    def _dict_keys(self, expr: ast.expr) -> dict[str, list[ast.expr]] | None:
        if isinstance(expr, ast.Dict):
            if any(k is None or not (isinstance(k, ast.Constant) and isinstance(k.value, str)) for k in expr.keys):
                return None
            return {k.value: [v] for k, v in zip(expr.keys, expr.values, strict=True)}
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "dict" \
                and not expr.args and all(k.arg for k in expr.keywords):
            return {k.arg: [k.value] for k in expr.keywords}
        if isinstance(expr, ast.IfExp):
            a, b = self._dict_keys(expr.body), self._dict_keys(expr.orelse)
            return None if a is None or b is None else _merge(a, b)
        return None

    def _kwargs_dicts(self, statements: list[ast.stmt], scope: _Scope) -> None:
        for stmt in statements:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                keys = self._dict_keys(stmt.value)
                name = stmt.targets[0].id
                if keys is not None or name in scope.dicts:
                    old = scope.dicts.get(name, {})
                    scope.dicts[name] = None if keys is None or old is None else _merge(old, keys)
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript):
                sub = stmt.targets[0]
                if isinstance(sub.value, ast.Name) and scope.dicts.get(sub.value.id) is not None:
                    key = sub.slice
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        scope.dicts[sub.value.id].setdefault(key.value, []).append(stmt.value)
                    else:
                        scope.dicts[sub.value.id] = None
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                    and isinstance(stmt.value.func, ast.Attribute) and isinstance(stmt.value.func.value, ast.Name):
                call, name = stmt.value, stmt.value.func.value.id
                if scope.dicts.get(name) is None or call.func.attr not in ("update", "setdefault"):
                    continue
                table = scope.dicts[name]
                if call.func.attr == "setdefault" and call.args and isinstance(call.args[0], ast.Constant):
                    table.setdefault(call.args[0].value, []).extend(call.args[1:2])
                elif call.func.attr == "update":
                    extra = self._dict_keys(call.args[0]) if call.args else {}
                    if extra is None or any(k.arg is None for k in call.keywords):
                        scope.dicts[name] = None
                        continue
                    scope.dicts[name] = _merge(_merge(table, extra), {k.arg: [k.value] for k in call.keywords})

    # --- the scan --------------------------------------------------------------------------------------------
    def _op_of(self, path: str) -> tuple[str, str] | None:
        owner, _, name = path.rpartition(".")
        if owner in OP_OWNERS:
            return name, OP_OWNERS[owner]
        grand, _, _overload = owner.rpartition(".")  # torch.ops.npu.op.default / .out
        if grand in ("torch.ops.npu", "torch.ops.atb"):
            return owner.rpartition(".")[2], grand
        return None

    def _record(self, call: ast.Call, scope: _Scope, function: str) -> None:
        path = self.path(call.func, scope)
        target = self._op_of(path) if path else None
        if target is None or (target[1] == "torch_npu" and target[0] == "atb"):
            return
        keywords: dict[str, tuple[str, ...] | None] = {}
        unresolved = False
        for kw in call.keywords:
            if kw.arg is not None:
                keywords[kw.arg] = self.kinds(kw.value, scope)
                continue
            table = scope.lookup("dicts", kw.value.id) if isinstance(kw.value, ast.Name) else self._dict_keys(kw.value)
            if table is None:
                unresolved = True
                continue
            for key, values in table.items():
                kinds = [self.kinds(v, scope) for v in values]
                keywords[key] = None if any(k is None for k in kinds) else tuple(sorted({x for k in kinds for x in k}))
        parent = self.parents.get(id(call))
        unpacked = indexed = None
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 \
                and isinstance(parent.targets[0], ast.Tuple | ast.List) \
                and not any(isinstance(e, ast.Starred) for e in parent.targets[0].elts):
            unpacked = len(parent.targets[0].elts)
        elif isinstance(parent, ast.Subscript) and parent.value is call and isinstance(parent.slice, ast.Constant) \
                and isinstance(parent.slice.value, int):
            indexed = parent.slice.value
        self.calls.append(NpuCall(
            op=target[0], via=target[1], file=self.file, line=call.lineno, function=function,
            positional=tuple(self.kinds(a, scope) for a in call.args if not isinstance(a, ast.Starred)),
            star_args=any(isinstance(a, ast.Starred) for a in call.args), keywords=keywords,
            unresolved_kwargs=unresolved, unpacked=unpacked, indexed=indexed))

    def _visit(self, node: ast.AST, scope: _Scope, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                self._visit(deco, scope, function)
            inner = _Scope(scope)
            for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                inner.paths[arg.arg] = None  # a parameter shadows an outer binding of its name
            self.bind(node.body, inner, module_level=False)
            for stmt in node.body:
                self._visit(stmt, inner, function or node.name)
            return
        if isinstance(node, ast.ClassDef):
            inner = _Scope(scope)
            self.bind(node.body, inner, module_level=False)
            for stmt in node.body:
                self._visit(stmt, inner, function)
            return
        if isinstance(node, ast.Call):
            self._record(node, scope, function)
        for child in ast.iter_child_nodes(node):
            self._visit(child, scope, function)

    def loaders(self) -> set[str]:
        """The module-level functions that return torch_npu (other modules may import and call them)."""
        scope = _Scope()
        self.bind(self.tree.body, scope, module_level=True)
        return set(scope.loaders)

    def run(self) -> list[NpuCall]:
        scope = _Scope()
        self.bind(self.tree.body, scope, module_level=True)
        for stmt in self.tree.body:
            self._visit(stmt, scope, "")
        self.calls.sort(key=lambda c: c.line)
        return self.calls


def _merge(a: dict[str, list[ast.expr]], b: dict[str, list[ast.expr]]) -> dict[str, list[ast.expr]]:
    out = {k: list(v) for k, v in a.items()}
    for k, v in b.items():
        out.setdefault(k, []).extend(v)
    return out


def scan_calls(text: str, file: str = "<string>", imported_loaders: frozenset[str] = frozenset()) -> list[NpuCall]:
    """Every call of a torch_npu op in one module's source. `imported_loaders`: dotted names ("pkg.mod.fn") of other
    modules' functions that return torch_npu, so a module calling an imported loader is read too."""
    if TORCH_NPU not in text and "torch.ops." not in text \
            and not any(name.rsplit(".", 1)[1] in text for name in imported_loaders):
        return []
    return _ModuleScanner(ast.parse(text, filename=file), file, imported_loaders).run()


def module_loaders(text: str, file: str = "<string>") -> set[str]:
    """Names of the module-level functions of one module's source that return torch_npu."""
    if TORCH_NPU not in text:
        return set()
    return _ModuleScanner(ast.parse(text, filename=file), file).loaders()


def facade_ops(text: str) -> dict[str, list[str]]:
    """Function name -> the facade op names a `{"op": function}` table of the module binds it to (npu_ops())."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Name):
                    out.setdefault(value.id, []).append(key.value)
    return out


@dataclass(frozen=True)
class CallProblem:
    severity: str
    param: str | None
    detail: str


def _accepts(param: SchemaParam, kinds: tuple[str, ...]) -> list[str]:
    """The kinds among `kinds` a parameter of this type rejects."""
    bad = []
    for kind in kinds:
        if kind == "None":
            if not param.optional and param.default != "None":
                bad.append(kind)
        elif kind.startswith("list["):
            if not param.is_list:
                bad.append(kind)
                continue
            allowed = PYTHON_KINDS.get(param.base)
            elements = [e for e in kind[5:-1].split("|") if e]
            if allowed is not None and any(e not in allowed for e in elements):
                bad.append(kind)
        else:
            allowed = PYTHON_KINDS.get(param.base)
            sized = param.is_list and param.type != f"{param.base}[]"  # int[2] also takes one int
            if allowed is not None and (kind not in allowed or (param.is_list and not sized)):
                bad.append(kind)
    return bad


def bound_parameters(call: NpuCall, schema: Schema) -> list[str]:
    """The schema parameters this call binds, by position or keyword (its `**` keys included)."""
    names = [p.name for p in schema.positional[:len(call.positional)]]
    return names + [k for k in call.keywords if schema.param(k) is not None and k not in names]


def _takes(schema: Schema, wrong: str) -> str:
    names = [p.name for p in schema.params]
    close = difflib.get_close_matches(wrong, names, n=2, cutoff=0.7)
    if close:
        return f"{schema.name} has {' or '.join(map(repr, close))}"
    return f"{schema.name} takes {', '.join(names)}" if len(names) <= 10 else f"{schema.name} has no such parameter"


def check_call(call: NpuCall, schema: Schema) -> list[CallProblem]:
    out: list[CallProblem] = []
    positional = schema.positional
    n = len(call.positional)
    if n > len(positional):
        extra = schema.params[len(positional):n]
        if len(extra) == n - len(positional) and all(p.keyword_only for p in extra):
            out.append(CallProblem("P1", extra[0].name, "keyword-only parameter(s) "
                                   f"{', '.join(repr(p.name) for p in extra)} passed by position "
                                   f"({n} positional arguments; {schema.name} takes {len(positional)})"))
        else:
            out.append(CallProblem("P1", None, f"{n} positional arguments; {schema.name} takes at most "
                                               f"{len(positional)} ({', '.join(p.name for p in positional)})"))
    for name in call.keywords:
        param = schema.param(name)
        if param is None:
            out.append(CallProblem("P1", name, f"unknown keyword {name!r}; {_takes(schema, name)}"))
        elif not param.keyword_only and positional.index(param) < n:
            out.append(CallProblem("P1", name, f"{name!r} given by position and by keyword"))
    if not call.star_args and not call.unresolved_kwargs:
        bound = set(bound_parameters(call, schema))
        missing = [p.name for p in schema.params if p.required and p.name not in bound]
        if missing:
            out.append(CallProblem("P1", missing[0], f"required parameter(s) {', '.join(map(repr, missing))} "
                                                     "not passed"))
    given = [*zip(positional, call.positional, strict=False), *((schema.param(k), v) for k, v in call.keywords.items())]
    for param, kinds in given:
        if param is not None and kinds is not None:
            bad = _accepts(param, kinds)
            if bad:
                out.append(CallProblem("P1", param.name, f"{param.name!r} is {param.python_type}, given a literal "
                                                         f"{' or '.join(bad)}"))
    arity = len(schema.returns)
    single_list = arity == 1 and schema.returns[0].split("(")[0].endswith("[]")
    if call.unpacked is not None and not single_list and call.unpacked != arity:
        out.append(CallProblem("P1", None, f"result unpacked into {call.unpacked} names; {schema.name} returns "
                                           f"{arity} ({', '.join(schema.returns) or 'nothing'})"))
    if call.indexed is not None and arity > 1 and not -arity <= call.indexed < arity:
        out.append(CallProblem("P1", None, f"result indexed [{call.indexed}]; {schema.name} returns {arity}"))
    return out


def scan_files(files: list[Path], relative_to: Path | None = None) -> list[NpuCall]:
    calls: list[NpuCall] = []
    for path in files:
        name = str(path.relative_to(relative_to)) if relative_to else str(path)
        calls += scan_calls(path.read_text(encoding="utf-8"), name)
    return calls
