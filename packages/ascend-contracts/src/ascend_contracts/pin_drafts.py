"""Draft `[[pins]]` entries for vLLM symbols the source scan found unpinned, read from a vLLM view.

A draft is a starting point a human reviews: the kind and signature come from the view, the `use` from how our code
touches the symbol, and members used on a symbol drafted in the same batch become its `fields` (one entry per
owner instead of one per attribute). Symbols that do not resolve are drafted as comments, never as entries.
"""

from __future__ import annotations

from collections import defaultdict

from ascend_contracts.scan import Usage
from ascend_contracts.shapes import Shape, UpstreamView

# How our code touches a symbol -> the pin's `use`, strongest first.
_USE_RANK = ("patch", "subclass", "call", "read", "import")


def _use(hows: set[str], kind: str, files: set[str]) -> str:
    if "patch" in hows or ("string" in hows and any("/patches/" in f for f in files)):
        return "patch"
    if "subclass" in hows:
        return "subclass"
    if kind == "function":
        return "call"
    if hows == {"string"}:
        return "read"
    return "import"


def _toml_list(items: list[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def draft_pins(usages: list[Usage], view: UpstreamView) -> str:
    """TOML text: one `[[pins]]` per owner symbol, with the attributes used on it as `fields`."""
    by_symbol: dict[str, list[Usage]] = defaultdict(list)
    for usage in usages:
        by_symbol[usage.symbol].append(usage)
    shapes = {symbol: view.resolve(symbol) for symbol in by_symbol}
    owners: dict[str, list[str]] = defaultdict(list)
    for symbol in sorted(by_symbol):
        parent = symbol.rpartition(".")[0]
        parent_shape = shapes.get(parent)
        if isinstance(parent_shape, Shape) and parent_shape.kind == "class":
            owners[parent].append(symbol.rpartition(".")[2])
    blocks = []
    for symbol in sorted(by_symbol):
        parent = symbol.rpartition(".")[0]
        if parent in owners and symbol.rpartition(".")[2] in owners[parent]:
            continue  # drafted as a field of its owner
        shape = shapes[symbol]
        first = by_symbol[symbol][0]
        where = f"{first.file.rsplit('/src/', 1)[-1]}:{first.line}"
        if not isinstance(shape, Shape):
            blocks.append(f"# {symbol}: does not resolve in {view.label} ({shape.reason}); used at {where}")
            continue
        kind = shape.kind
        parent_shape = view.resolve(parent) if parent not in shapes else shapes[parent]
        if kind == "function" and isinstance(parent_shape, Shape) and parent_shape.kind == "class":
            kind = "method"
        hows = {u.how for u in by_symbol[symbol]}
        files = {u.file for u in by_symbol[symbol]}
        for field in owners.get(symbol, []):
            hows |= {u.how for u in by_symbol[f"{symbol}.{field}"]}
        lines = ["[[pins]]", f'symbol = "{symbol}"', f'kind = "{kind}"',
                 f'use = "{_use(hows - {"attribute"} or hows, shape.kind, files)}"']
        if owners.get(symbol):
            lines.append(f"fields = {_toml_list(owners[symbol])}")
        if kind in ("function", "method") and shape.signature is not None:
            lines.append(f"signature = {_toml_list(shape.signature)}")
        if kind == "attribute" and shape.value is not None and shape.value.startswith("'"):
            lines.append(f"value = {shape.value}")
        lines.append(f'note = "used at {where}"')
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
