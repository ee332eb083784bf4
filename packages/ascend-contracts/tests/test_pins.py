"""The pins format: every mistake is an error naming the file, the entry and the key; our files all load."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascend_contracts.pins import PinsError, adapter_exists, load_pins

REPO = Path(__file__).resolve().parents[3]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "upstream_pins.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("body", "message"), [
    ('symbol = "vllm.a.B"\nkind = "class"\nfeilds = ["x"]\n', "unknown key(s) ['feilds']"),
    ('symbol = "vllm.a.B"\nkind = "klass"\n', "kind 'klass' is not one of"),
    ('symbol = "vllm.a.B"\nkind = "class"\nuse = "steal"\n', "use 'steal' is not one of"),
    ('symbol = "torch.a.B"\nkind = "class"\n', "'symbol' must be a dotted vLLM path"),
    ('symbol = "vllm.a.B"\nkind = "class"\nfields = "x"\n', "'fields' must be a list of strings"),
    ('symbol = "vllm.a.B"\nkind = "class"\ncovered_by = { x = "somewhere.else" }\n', "is not an ascend_core.upstream"),
    ('symbol = "vllm.a.B"\nkind = "class"\nrefused_by = "elsewhere.why"\n', "is not an ascend_core.upstream function"),
    ('symbol = "vllm.a.B"\nkind = "class"\nfields = ["x"]\noptional = ["y"]\n', "optional names ['y'] are not in"),
])
def test_malformed_entries_are_errors_naming_the_entry(tmp_path: Path, body: str, message: str) -> None:
    path = _write(tmp_path, "[[pins]]\n" + body)
    with pytest.raises(PinsError, match="pins\\[0\\]") as info:
        load_pins(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_a_symbol_pinned_twice_is_an_error(tmp_path: Path) -> None:
    entry = '[[pins]]\nsymbol = "vllm.a.B"\nkind = "class"\n'
    with pytest.raises(PinsError, match="pinned twice"):
        load_pins(_write(tmp_path, entry + entry))


def test_older_entries_without_the_newer_keys_still_load(tmp_path: Path) -> None:
    (pin,) = load_pins(_write(tmp_path, '[[pins]]\nsymbol = "vllm.a.B"\nkind = "dataclass"\nfields = ["x"]\n'))
    assert pin.use == "import" and pin.signature is None and not pin.optional and pin.package == tmp_path.name


def test_adapter_names_are_checked_against_ascend_core_upstream() -> None:
    assert adapter_exists("ascend_core.upstream.kv_tensor_layers")
    assert adapter_exists("ascend_core.upstream.speculator")  # a module
    assert not adapter_exists("ascend_core.upstream.no_such_adapter")
    assert not adapter_exists("os.path.join")


@pytest.mark.parametrize("pins_file", sorted(REPO.glob("packages/*/src/*/upstream_pins.toml")),
                         ids=lambda p: p.parent.name)
def test_every_package_pins_file_loads_and_names_real_adapters(pins_file: Path) -> None:
    for pin in load_pins(pins_file):
        for key, adapter in pin.covered_by.items():
            assert adapter_exists(adapter), f"{pins_file}: {pin.symbol} covered_by[{key!r}] = {adapter!r}"
        for name in pin.aliases:
            assert pin.relies_on(name) or name == pin.symbol, f"{pin.symbol}: alias for {name!r}, not relied on"
        keys = {*pin.fields, *pin.params, *pin.aliases, pin.symbol, "*", "signature"}
        stray = set(pin.covered_by) - keys
        assert not stray, f"{pins_file}: {pin.symbol} covered_by names {sorted(stray)}, which the pin never checks"
        if pin.refused_by is not None:  # a refusal is a function answering "why not here", or None
            module, _, name = pin.refused_by.rpartition(".")
            assert callable(getattr(__import__(module, fromlist=[name]), name)), f"{pin.symbol}: {pin.refused_by}"
