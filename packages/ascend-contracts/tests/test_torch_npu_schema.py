"""The torch_npu schema parser on every schema the 2.13.0 wheel registers, and drift grading on a changed schema."""

from __future__ import annotations

import pytest

from ascend_contracts.torch_npu_schema import SchemaError, parse_schema, schema_drift
from ascend_contracts.torch_npu_wheel import TorchNpuWheel


def test_every_registered_schema_parses_as_torch_parses_it(wheel: TorchNpuWheel) -> None:
    import torch

    assert len(wheel.schemas) > 300
    for key, text in wheel.schemas.items():
        ours, theirs = parse_schema(text), torch._C.parse_schema(text)
        assert ours.name + (f".{ours.overload}" if ours.overload else "") == key
        assert [p.name for p in ours.params] == [a.name for a in theirs.arguments], text
        assert [p.keyword_only for p in ours.params] == [a.kwarg_only for a in theirs.arguments], text
        assert [p.required for p in ours.params] == [not a.has_default_value() for a in theirs.arguments], text
        assert [p.alias is not None for p in ours.params] == [a.alias_info is not None for a in theirs.arguments]
        assert len(ours.returns) == len(theirs.returns), text
        assert parse_schema(str(ours)) == ours  # printing loses nothing


def test_parameters_carry_type_optional_list_alias_and_default(wheel: TorchNpuWheel) -> None:
    load = parse_schema(wheel.schemas["npu_paged_cache_load.out"])
    assert (load.name, load.overload) == ("npu_paged_cache_load", "out")
    assert [p.name for p in load.positional] == ["key_cache", "value_cache", "block_table", "context_lens"]
    seq_starts, cumsum, key = load.param("seq_starts"), load.param("cumsum"), load.param("key")
    assert (seq_starts.type, seq_starts.optional, seq_starts.default, seq_starts.keyword_only) == \
        ("Tensor", True, "None", True)
    assert (cumsum.type, cumsum.default) == ("bool", "False")
    assert (key.alias, key.required) == ("a!", True)
    assert load.returns == ("Tensor(a!)", "Tensor(b!)")
    routing = parse_schema(wheel.schemas["npu_moe_init_routing_v2"])
    assert routing.param("active_expert_range").type == "int[2]" and routing.param("active_expert_range").is_list
    fia = parse_schema(wheel.schemas["npu_fused_infer_attention_score"])
    lengths = fia.param("actual_seq_lengths")
    assert (lengths.type, lengths.optional, lengths.python_type) == ("SymInt[]", True, "int[]?")
    assert fia.param("input_layout").default == '"BSH"'
    assert parse_schema(wheel.schemas["_npu_reshape_and_cache"]).returns == ()


def test_bad_schemas_are_errors_quoting_them() -> None:
    with pytest.raises(SchemaError, match="not a schema"):
        parse_schema("npu_x Tensor a")
    with pytest.raises(SchemaError, match=r"'Tensor' is not '<type> <name>'"):
        parse_schema("npu_x(Tensor) -> Tensor")
    with pytest.raises(SchemaError, match=r"\['a'\] declared twice"):
        parse_schema("npu_x(Tensor a, int a) -> Tensor")


def test_drift_on_a_changed_schema_grades_by_what_our_calls_use(wheel: TorchNpuWheel) -> None:
    old = parse_schema(wheel.schemas["npu_moe_gating_top_k"])
    text = old.text
    for before, after in (("int renorm=0", "int renormalize=0"),  # renamed, and we pass renorm=
                          ("float eps=1e-20", "float eps=1e-10"),  # default changed, we pass eps=
                          ("bool out_flag=False", "str out_flag=\"no\""),  # retyped, we never pass it
                          ("Tensor? bias=None", "Tensor? bias"),  # now required, we pass it
                          ("int k, *,", "int k, int k2, *,"),  # a required parameter added
                          ("-> (Tensor, Tensor, Tensor)", "-> (Tensor, Tensor)")):
        assert before in text
        text = text.replace(before, after)
    uses = ["x", "k", "bias", "renorm", "eps", "routed_scaling_factor"]
    found = {(c.severity, c.param, c.detail) for c in schema_drift(old.name, old, parse_schema(text), uses)}
    assert found == {
        ("P1", "renorm", "parameter 'renorm' renamed to 'renormalize'"),
        ("P1", "eps", "default 1e-20 -> 1e-10"),
        ("P2", "out_flag", "type bool -> str"),
        ("P2", "out_flag", 'default False -> "no"'),
        ("P1", "bias", "now required (was default None)"),
        ("P1", "k2", "parameter int k2 added (required)"),
        ("P2", None, "returns 3 -> 2 values (Tensor, Tensor, Tensor -> Tensor, Tensor)"),
    }
    assert schema_drift(old.name, old, old, uses) == []
    gone = schema_drift(old.name, old, None, uses)
    assert [(c.severity, c.symbol) for c in gone] == [("P0", "torch_npu.npu_moe_gating_top_k")]


def test_positional_reorder_and_keyword_only_moves_are_drift(wheel: TorchNpuWheel) -> None:
    old = parse_schema(wheel.schemas["npu_add_rms_norm"])  # (Tensor x1, Tensor x2, Tensor gamma, float epsilon)
    swapped = parse_schema(old.text.replace("Tensor x1, Tensor x2", "Tensor x2, Tensor x1"))
    assert [(c.severity, c.detail) for c in schema_drift(old.name, old, swapped, ["x1", "x2"])] == \
        [("P1", "positional order changed: (x1, x2, gamma, epsilon) -> (x2, x1, gamma, epsilon)")]
    kw = parse_schema(old.text.replace("Tensor gamma, float", "Tensor gamma, *, float"))
    assert [(c.severity, c.param, c.detail) for c in schema_drift(old.name, old, kw, ["epsilon"])] == \
        [("P1", "epsilon", "now keyword-only")]
    sym = parse_schema(old.text.replace("float epsilon", "int epsilon"))
    assert [c.severity for c in schema_drift(old.name, old, sym, [])] == ["P2"]
