"""Drafted pins are valid pins that check clean against the release they were drafted from."""

from __future__ import annotations

from pathlib import Path

from ascend_contracts.checker import check
from ascend_contracts.pin_drafts import draft_pins
from ascend_contracts.pins import load_pins
from ascend_contracts.scan import scan_source
from ascend_contracts.source_reader import open_source
from ascend_contracts.static_view import StaticView

OURS = '''
from vllm.core.spec import Tensor, hook
from vllm.core.runner import Runner

PATCH = "vllm.core.spec:plan"


class Mine(Runner):
    def step(self, batch, num_tokens_across_dp=None):
        return hook(Tensor.shared_by, Runner.build)
'''


def test_drafts_group_members_under_their_owner_and_check_clean(tmp_path: Path, old_tree: Path) -> None:
    view = StaticView(open_source(old_tree))
    text = draft_pins(scan_source(OURS, "ascend_x/patches/mod.py"), view)
    path = tmp_path / "upstream_pins.toml"
    path.write_text(text)
    pins = {p.symbol: p for p in load_pins(path)}
    assert pins["vllm.core.runner.Runner"].use == "subclass" and pins["vllm.core.runner.Runner"].fields == ("build",)
    assert pins["vllm.core.spec.Tensor"].fields == ("shared_by",)
    assert pins["vllm.core.spec.hook"].signature == ("x", "flag=False", "*", "mode='a'")
    assert pins["vllm.core.spec.plan"].use == "patch"
    assert check(pins.values(), view).findings == []


def test_symbols_that_do_not_resolve_are_drafted_as_comments(old_tree: Path) -> None:
    text = draft_pins(scan_source("from vllm.core.spec import Gone\n", "m.py"), StaticView(open_source(old_tree)))
    assert text.startswith("# vllm.core.spec.Gone: does not resolve") and "[[pins]]" not in text
