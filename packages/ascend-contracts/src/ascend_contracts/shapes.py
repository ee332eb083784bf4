"""What a vLLM symbol looks like in one release: its kind, members, parameters and literal value.

Both views (an imported vLLM, a source tree or wheel read with `ast`) describe symbols with these types, so the
checker compares them the same way. Defaults are normalised so that `repr()` of an imported value and the source
text of the same literal agree; a default that is not a literal only counts as "has a default" (`...`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Protocol

NON_LITERAL = "..."


def normalize_literal(text: str) -> str:
    """`repr` of the literal `text` stands for, or `...` when it is not a plain literal."""
    try:
        return repr(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return NON_LITERAL


@dataclass(frozen=True)
class Param:
    name: str
    # positional_only | positional_or_keyword | var_positional | keyword_only | var_keyword
    kind: str
    default: str | None = None  # normalised; None = required

    def render(self) -> str:
        prefix = {"var_positional": "*", "var_keyword": "**"}.get(self.kind, "")
        return f"{prefix}{self.name}" + ("" if self.default is None else f"={self.default}")


def render_signature(params: tuple[Param, ...]) -> tuple[str, ...]:
    """Parameters as short strings (`name`, `name=default`, `*`, `/`, `*args`); a leading self/cls is dropped."""
    if params and params[0].name in ("self", "cls") and params[0].kind != "keyword_only":
        params = params[1:]
    out: list[str] = []
    seen_star = False
    for i, p in enumerate(params):
        if p.kind == "keyword_only" and not seen_star:
            out.append("*")
            seen_star = True
        if p.kind == "var_positional":
            seen_star = True
        out.append(p.render())
        if p.kind == "positional_only" and (i + 1 == len(params) or params[i + 1].kind != "positional_only"):
            out.append("/")
    return tuple(out)


@dataclass(frozen=True)
class Shape:
    """One resolved symbol. `members` are attribute names (inherited ones included) of a class or module."""

    symbol: str
    kind: str  # module | class | function | attribute
    members: frozenset[str] = frozenset()
    params: tuple[Param, ...] | None = None
    value: str | None = None
    where: str = ""
    # Bound at run time (a module `__getattr__`): it exists, but its members cannot be read from source.
    dynamic: bool = False

    @property
    def signature(self) -> tuple[str, ...] | None:
        return None if self.params is None else render_signature(self.params)


@dataclass(frozen=True)
class Missing:
    """A symbol that does not resolve, and why (module absent, attribute absent, import failed...)."""

    symbol: str
    reason: str


class UpstreamView(Protocol):
    """One vLLM release to check pins against."""

    label: str
    version: str | None

    def resolve(self, symbol: str) -> Shape | Missing: ...

    def find_elsewhere(self, symbol: str, candidates: tuple[str, ...] = ()) -> str | None:
        """Where a gone symbol went: the first of `candidates` that resolves, else a sibling module defining it."""
        ...
