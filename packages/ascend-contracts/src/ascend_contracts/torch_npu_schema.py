"""torch_npu op schemas (the `m.def` strings the wheel registers) parsed, and graded between two releases.

`parse_schema("npu_rms_norm(Tensor input, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)")` gives the op
name, its positional and keyword-only parameters (type, `?`, list size, alias annotation such as `Tensor(a!)`,
default) and its returns. `schema_drift(op, old, new, uses)` lists what changed, graded like the vLLM checker:
P0 the op is gone, P1 a parameter our calls bind changed (removed, renamed, retyped, re-defaulted, moved between
positional and keyword-only) or a required parameter was added, P2 everything else.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# torch's python argument signatures (what some wheels' strings are) spell C++ types; fold them into schema types
# so one release's `int64_t` and another's `int` are the same contract.
_CPP_TYPES = {"int64_t": "int", "double": "float", "std::string": "str", "c10::string_view": "str",
              "SymIntArrayRef": "SymInt[]", "IntArrayRef": "int[]", "TensorList": "Tensor[]",
              "at::Tensor": "Tensor", "c10::SymInt": "SymInt", "at::ScalarType": "ScalarType"}
_TYPE = re.compile(r"^(?P<base>[A-Za-z_][\w:.]*)(?:\((?P<alias>[^)]*)\))?(?P<list>\[\d*\])?(?:\((?P<alias2>[^)]*)\))?"
                   r"(?P<optional>\?)?$")
_HEAD = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*)(?:\.(?P<overload>\w+))?\s*\(")
# What a Python literal passed for a parameter of this base type may be (the literal check in torch_npu_calls), as
# torch's argument parser decides: an int parameter refuses a bool, a float one takes it (bool is an int to Python).
PYTHON_KINDS: dict[str, tuple[str, ...]] = {
    "int": ("int",), "SymInt": ("int",), "float": ("int", "float", "bool"), "bool": ("bool",), "str": ("str",),
    "Scalar": ("int", "float", "bool"), "Tensor": ("Tensor",),
}


class SchemaError(ValueError):
    """A schema string could not be parsed; the message quotes it."""


@dataclass(frozen=True)
class SchemaParam:
    name: str
    type: str  # the base type with its list suffix, without alias or `?`: "Tensor", "int[]", "SymInt[2]"
    optional: bool = False  # `?`: None is accepted
    default: str | None = None  # as written ("None", "1e-06", '"BSH"', "[]"); None when required
    alias: str | None = None  # "a!" for `Tensor(a!)`: written in place
    keyword_only: bool = False

    @property
    def required(self) -> bool:
        return self.default is None

    @property
    def base(self) -> str:
        return self.type.split("[", 1)[0]

    @property
    def is_list(self) -> bool:
        return "[" in self.type

    @property
    def python_type(self) -> str:
        """The type as a Python caller sees it: SymInt is an int there."""
        return self.type.replace("SymInt", "int") + ("?" if self.optional else "")

    def __str__(self) -> str:
        alias = f"({self.alias})" if self.alias else ""
        base, _, rest = self.type.partition("[")
        text = f"{base}{alias}{'[' + rest if rest else ''}{'?' if self.optional else ''} {self.name}"
        return text + (f"={self.default}" if self.default is not None else "")


@dataclass(frozen=True)
class Schema:
    name: str
    overload: str = ""
    params: tuple[SchemaParam, ...] = ()
    returns: tuple[str, ...] = ()  # one entry per returned value; `-> ()` is empty, `-> Tensor[]` is one list
    text: str = field(default="", compare=False)

    @property
    def positional(self) -> tuple[SchemaParam, ...]:
        return tuple(p for p in self.params if not p.keyword_only)

    @property
    def keyword_only(self) -> tuple[SchemaParam, ...]:
        return tuple(p for p in self.params if p.keyword_only)

    def param(self, name: str) -> SchemaParam | None:
        return next((p for p in self.params if p.name == name), None)

    def __str__(self) -> str:
        parts, star = [], False
        for p in self.params:
            if p.keyword_only and not star:
                parts.append("*")
                star = True
            parts.append(str(p))
        rets = self.returns[0] if len(self.returns) == 1 else f"({', '.join(self.returns)})"
        return f"{self.name}{'.' + self.overload if self.overload else ''}({', '.join(parts)}) -> {rets}"


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """`text` cut at `sep` outside brackets, parentheses and quotes (defaults hold `[0, 1]` and '"a,b"')."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _closing_paren(text: str, open_at: int) -> int:
    depth, quote = 0, ""
    for i in range(open_at, len(text)):
        ch = text[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
    raise SchemaError(f"unbalanced parentheses in schema {text!r}")


def _param(text: str, keyword_only: bool, schema: str) -> SchemaParam:
    decl, eq, default = text.partition("=")
    decl = re.sub(r"\s+\?", "?", decl.strip())  # `int ? mask_type` occurs in the ATB library's strings
    type_text, _, name = decl.rpartition(" ")
    type_text = type_text.strip()
    if not type_text or not name.isidentifier():
        raise SchemaError(f"parameter {text!r} is not '<type> <name>' in schema {schema!r}")
    for cpp, ours in _CPP_TYPES.items():
        if type_text == cpp or type_text.startswith(cpp + "?"):
            type_text = ours + type_text[len(cpp):]
    match = _TYPE.match(type_text)
    if not match:
        raise SchemaError(f"type {type_text!r} of parameter {name!r} is not a schema type in schema {schema!r}")
    return SchemaParam(name=name, type=match["base"] + (match["list"] or ""), optional=bool(match["optional"]),
                       default=default.strip() if eq else None, alias=match["alias"] or match["alias2"],
                       keyword_only=keyword_only)


def _returns(text: str) -> tuple[str, ...]:
    text = text.strip()
    if text.startswith("(") and _closing_paren(text, 0) == len(text) - 1:
        inner = text[1:-1].strip()
        return tuple(split_top_level(inner)) if inner else ()
    return (text,)


def parse_schema(text: str) -> Schema:
    """One schema string (`name[.overload](params) -> returns`) as a `Schema`; `SchemaError` names what is wrong."""
    head = _HEAD.match(text)
    if not head:
        raise SchemaError(f"not a schema (expected 'name(...) -> ...'): {text!r}")
    close = _closing_paren(text, head.end() - 1)
    arrow = text[close + 1:].strip()
    if not arrow.startswith("->"):
        raise SchemaError(f"schema {text!r} has no '-> returns' after its parameters")
    params, keyword_only = [], False
    inner = text[head.end():close].strip()
    for item in split_top_level(inner) if inner else []:
        if item == "*":
            keyword_only = True
            continue
        if not item:
            raise SchemaError(f"empty parameter in schema {text!r}")
        params.append(_param(item, keyword_only, text))
    names = [p.name for p in params]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise SchemaError(f"parameter(s) {duplicated} declared twice in schema {text!r}")
    return Schema(name=head["name"], overload=head["overload"] or "", params=tuple(params),
                  returns=_returns(arrow[2:]), text=text)


def default_value(text: str | None) -> object:
    """A default as a Python value where it is a literal (`1e-06` == `1e-6`, `1` == `1.0`), else the text."""
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


@dataclass(frozen=True)
class SchemaChange:
    severity: str  # P0 | P1 | P2
    op: str
    param: str | None  # the parameter it is about, None for the op itself or its returns
    detail: str

    @property
    def symbol(self) -> str:
        return f"torch_npu.{self.op}" + (f"({self.param})" if self.param else "")


def _param_changes(op: str, before: SchemaParam, after: SchemaParam, used: bool) -> list[SchemaChange]:
    grade = "P1" if used else "P2"
    out = []
    if before.python_type != after.python_type:
        out.append(SchemaChange(grade, op, before.name, f"type {before.python_type} -> {after.python_type}"))
    elif (before.type, before.optional) != (after.type, after.optional):  # SymInt <-> int: same to a caller
        out.append(SchemaChange("P2", op, before.name, f"type {before.type} -> {after.type}"))
    if before.keyword_only != after.keyword_only:
        how = "keyword-only" if after.keyword_only else "positional"
        out.append(SchemaChange(grade, op, before.name, f"now {how}"))
    if before.required != after.required:
        severity = "P1" if after.required else "P2"  # a newly required parameter breaks calls that omit it
        detail = f"now required (was default {before.default})" if after.required else \
            f"now optional (default {after.default})"
        out.append(SchemaChange(severity, op, before.name, detail))
    elif not before.required and default_value(before.default) != default_value(after.default):
        out.append(SchemaChange(grade, op, before.name, f"default {before.default} -> {after.default}"))
    if before.alias != after.alias:
        out.append(SchemaChange(grade, op, before.name, f"alias annotation {before.alias} -> {after.alias}"))
    return out


def _group_index(schema: Schema, param: SchemaParam) -> int:
    group = schema.keyword_only if param.keyword_only else schema.positional
    return group.index(param)


def schema_drift(op: str, old: Schema, new: Schema | None, uses: Iterable[str] = ()) -> list[SchemaChange]:
    """What changed in `op` from `old` to `new` (None: gone), graded by whether our calls bind each parameter."""
    if new is None:
        return [SchemaChange("P0", op, None, f"op gone (was {old})")]
    used = set(uses)
    out: list[SchemaChange] = []
    removed = [p for p in old.params if new.param(p.name) is None]
    added = [p for p in new.params if old.param(p.name) is None]
    for p in removed:
        # A removed and an added parameter at the same place with the same type read as a rename.
        twin = next((a for a in added if a.type == p.type and a.keyword_only == p.keyword_only
                     and _group_index(new, a) == _group_index(old, p)), None)
        detail = f"renamed to {twin.name!r}" if twin else "removed"
        if twin:
            added.remove(twin)
        out.append(SchemaChange("P1" if p.name in used else "P2", op, p.name, f"parameter {p.name!r} {detail}"))
    for p in added:
        severity = "P1" if p.required else "P2"
        out.append(SchemaChange(severity, op, p.name, f"parameter {p} added" + (" (required)" if p.required else "")))
    for before in old.params:
        after = new.param(before.name)
        if after is not None:
            out.extend(_param_changes(op, before, after, before.name in used))
    old_order = [p.name for p in old.positional if new.param(p.name) is not None and not new.param(p.name).keyword_only]
    new_order = [p.name for p in new.positional if p.name in old_order]
    if old_order != new_order:
        moved = sorted(n for i, n in enumerate(new_order) if old_order[i] != n)
        severity = "P1" if used & set(moved) else "P2"
        out.append(SchemaChange(severity, op, None, f"positional order changed: ({', '.join(old_order)}) -> "
                                                    f"({', '.join(new_order)})"))
    if len(old.returns) != len(new.returns):
        # Our call sites' unpacking is checked against the new schema itself (torch_npu_calls); here it is news.
        out.append(SchemaChange("P2", op, None, f"returns {len(old.returns)} -> {len(new.returns)} values "
                                                f"({', '.join(old.returns) or 'none'} -> "
                                                f"{', '.join(new.returns) or 'none'})"))
    elif old.returns != new.returns:
        out.append(SchemaChange("P2", op, None, f"returns ({', '.join(old.returns)}) -> ({', '.join(new.returns)})"))
    return out
