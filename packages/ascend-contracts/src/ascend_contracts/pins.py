"""Contract pins: the upstream vLLM symbols each of our packages relies on, read from `upstream_pins.toml`.

The format is documented at the top of ascend-core's `upstream_pins.toml`. Loading validates every entry, so a
typo in a key or an adapter name is an error naming the file and the entry rather than a silently weaker check.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

PINS_FILE = "upstream_pins.toml"
# Import names of our packages, in dependency order; each may carry a pins file next to its __init__.py.
OUR_PACKAGES = ("ascend_kernels", "ascend_core", "ascend_kv_transfer", "ascend_specdecode", "ascend_platform",
                "ascend_vllm")

KINDS = frozenset({"module", "class", "dataclass", "function", "method", "attribute"})
USES = frozenset({"import", "call", "subclass", "patch", "read", "override"})
ADAPTER_PREFIX = "ascend_core.upstream"
# "*" covers every finding of the pin; "signature" covers a P2 signature change.
WHOLE_PIN = "*"
SIGNATURE_KEY = "signature"

_KEYS = frozenset({"symbol", "kind", "use", "fields", "params", "covered_by", "aliases", "moved", "signature",
                   "value", "optional", "refused_by", "note"})


class PinsError(ValueError):
    """A pins file is malformed; the message names the file, the entry and the key."""


@dataclass(frozen=True, kw_only=True)
class Pin:
    symbol: str
    kind: str
    use: str = "import"
    fields: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    covered_by: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    moved: tuple[str, ...] = ()
    signature: tuple[str, ...] | None = None
    value: str | None = None
    optional: bool = False
    # Fields/params a newer vLLM added and our code works without (absent: P2); `optional = [names]` in the file.
    optional_names: tuple[str, ...] = ()
    # An ascend_core.upstream function returning why the feature this pin serves is refused at start-up on the
    # installed vLLM (None where it runs): its findings are covered only where that function refuses the feature.
    refused_by: str | None = None
    note: str = ""
    package: str = ""
    source: str = ""

    def cover(self, key: str) -> str | None:
        """The adapter covering drift of `key` (a field/param name, the symbol, "signature"), else the whole-pin one."""
        return self.covered_by.get(key) or self.covered_by.get(WHOLE_PIN)

    def relies_on(self, name: str) -> bool:
        return name in self.fields or name in self.params


def _strings(value: Any, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PinsError(f"{where}: {key!r} must be a list of strings, got {value!r}")
    return tuple(value)


def _pin_from_table(table: dict[str, Any], where: str, package: str, source: str) -> Pin:
    unknown = set(table) - _KEYS
    if unknown:
        raise PinsError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_KEYS)}")
    symbol = table.get("symbol")
    if not isinstance(symbol, str) or not symbol.startswith("vllm") or " " in symbol:
        raise PinsError(f"{where}: 'symbol' must be a dotted vLLM path, got {symbol!r}")
    kind = table.get("kind")
    if kind not in KINDS:
        raise PinsError(f"{where} ({symbol}): kind {kind!r} is not one of {sorted(KINDS)}")
    use = table.get("use", "import")
    if use not in USES:
        raise PinsError(f"{where} ({symbol}): use {use!r} is not one of {sorted(USES)}")
    covered = table.get("covered_by", {})
    if not isinstance(covered, dict) or not all(isinstance(v, str) for v in covered.values()):
        raise PinsError(f"{where} ({symbol}): 'covered_by' must map names to adapter paths, got {covered!r}")
    for key, adapter in covered.items():
        if not adapter.startswith(ADAPTER_PREFIX):
            raise PinsError(f"{where} ({symbol}): covered_by[{key!r}] = {adapter!r} is not an {ADAPTER_PREFIX} adapter")
    aliases = table.get("aliases", {})
    if not isinstance(aliases, dict):
        raise PinsError(f"{where} ({symbol}): 'aliases' must map a name to the names other releases use")
    refused_by = table.get("refused_by")
    if refused_by is not None and (not isinstance(refused_by, str) or not refused_by.startswith(ADAPTER_PREFIX)):
        raise PinsError(f"{where} ({symbol}): refused_by = {refused_by!r} is not an {ADAPTER_PREFIX} function")
    optional = table.get("optional", False)
    if not isinstance(optional, bool):
        optional_names = _strings(optional, where, "optional")
        unknown_names = set(optional_names) - set(table.get("fields", [])) - set(table.get("params", []))
        if unknown_names:
            raise PinsError(f"{where} ({symbol}): optional names {sorted(unknown_names)} are not in fields/params")
    signature = table.get("signature")
    value = table.get("value")
    if value is not None and not isinstance(value, str | int | float | bool):
        raise PinsError(f"{where} ({symbol}): 'value' must be a literal, got {value!r}")
    return Pin(
        symbol=symbol, kind=kind, use=use,
        fields=_strings(table.get("fields", []), where, "fields"),
        params=_strings(table.get("params", []), where, "params"),
        covered_by=dict(covered),
        aliases={k: _strings(v, where, f"aliases.{k}") for k, v in aliases.items()},
        moved=_strings(table.get("moved", []), where, "moved"),
        signature=None if signature is None else _strings(signature, where, "signature"),
        value=None if value is None else repr(value),
        optional=optional is True,
        optional_names=() if isinstance(optional, bool) else tuple(optional),
        refused_by=refused_by,
        note=str(table.get("note", "")),
        package=package, source=source,
    )


def read_pins_toml(path: Path) -> dict:
    """A pins file's TOML, or PinsError naming the file."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise PinsError(f"{path}: not valid TOML: {exc}") from exc


def load_pins(path: str | Path, package: str = "") -> list[Pin]:
    """Every pin in one file; `package` defaults to the folder the file sits in (the import name)."""
    path = Path(path)
    package = package or path.parent.name
    data = read_pins_toml(path)
    tables = data.get("pins", [])
    if not isinstance(tables, list):
        raise PinsError(f"{path}: 'pins' must be an array of tables ([[pins]])")
    pins = [_pin_from_table(t, f"{path}: pins[{i}]", package, str(path)) for i, t in enumerate(tables)]
    seen: set[str] = set()
    for pin in pins:
        if pin.symbol in seen:
            raise PinsError(f"{path}: {pin.symbol} is pinned twice; merge the entries")
        seen.add(pin.symbol)
    return pins


def package_dir(import_name: str) -> Path | None:
    """The folder of one of our packages, found without importing it (no side effects)."""
    try:
        spec = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def discover_pins_files(packages: tuple[str, ...] = OUR_PACKAGES) -> dict[str, Path]:
    """`{import name: pins file}` for each of our installed packages that has one."""
    found = {}
    for name in packages:
        folder = package_dir(name)
        if folder is not None and (folder / PINS_FILE).is_file():
            found[name] = folder / PINS_FILE
    return found


def load_all_pins(files: dict[str, Path] | None = None) -> list[Pin]:
    files = discover_pins_files() if files is None else files
    return [pin for name, path in files.items() for pin in load_pins(path, name)]


def adapter_exists(path: str) -> bool:
    """True when `path` names a module or attribute under ascend_core.upstream."""
    if not path.startswith(ADAPTER_PREFIX):
        return False
    parts = path.split(".")
    for cut in range(len(parts), 1, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False
