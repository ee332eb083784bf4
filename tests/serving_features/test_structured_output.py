"""Structured output (xgrammar) in one batch of JSON-schema, choice, regex and unconstrained requests, greedy and
seeded, on both runners against plain vLLM CPU; the tokenizer spells characters, so a grammar can hold every token.

MRV2 applies the grammar's bitmask through our stand-in for `_apply_grammar_bitmask_kernel`; the V1 runner through
vLLM's `apply_grammar_bitmask`, which calls xgrammar's `apply_token_bitmask_inplace` (its CPU kernel here, its torch
kernel for "npu" tensors on a card).
"""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.engine
OURS = ("v1", "mrv2")
LANES = ("cpu", *OURS)


def _by_id(rows):
    return {r["id"]: r for r in rows}


@pytest.mark.parametrize("lane", LANES)
def test_every_constrained_output_is_valid(served, lane, workload):
    import jsonschema

    rows = _by_id(served[lane]["structured"])
    jsons = [r for rid, r in rows.items() if rid.startswith("json")]
    assert len(jsons) == 3
    for row in jsons:
        assert row["finish_reason"] == "stop", row  # the grammar ended the text, not max_tokens
        jsonschema.validate(json.loads(row["text"]), workload.JSON_SCHEMA)
    assert rows["choice"]["text"] in workload.CHOICES and rows["choice"]["finish_reason"] == "stop"
    for rid in ("regex", "regex_seeded"):
        assert re.fullmatch(workload.REGEX, rows[rid]["text"]), rows[rid]


@pytest.mark.parametrize("lane", OURS)
def test_greedy_constrained_outputs_are_vllm_cpus(served, lane):
    ours, cpu = _by_id(served[lane]["structured"]), _by_id(served["cpu"]["structured"])
    for rid in ("json_greedy", "choice", "regex", "free_greedy"):
        assert ours[rid]["token_ids"] == cpu[rid]["token_ids"], rid


@pytest.mark.parametrize("lane", LANES)
def test_unconstrained_neighbours_are_untouched(served, lane):
    """The unconstrained rows of the mixed batch are what the same requests give in a batch of their own (no
    grammar mask leaks onto a row that has none)."""
    mixed = _by_id(served[lane]["structured"])
    alone = _by_id(served[lane]["structured_free_alone"])
    assert set(alone) == {"free_greedy", "free_seeded"}
    for rid, row in alone.items():
        assert mixed[rid]["token_ids"] == row["token_ids"] and len(row["token_ids"]) == 16, rid


def test_the_grammar_forbids_what_the_model_prefers(served):
    """Without the grammar the model would not write JSON: the unconstrained greedy text of the JSON prompt's
    neighbours is not JSON, so the valid outputs above come from the mask."""
    free = _by_id(served["cpu"]["structured"])["free_greedy"]["text"]
    with pytest.raises(ValueError):
        json.loads(free)
