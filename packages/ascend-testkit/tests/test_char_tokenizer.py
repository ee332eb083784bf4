"""The character tokenizer spells any ASCII text one token per character and decodes it back unchanged, so a
grammar backend's token table holds the real strings (what structured output needs)."""

from __future__ import annotations

from ascend_testkit.models.char_tokenizer import CHARS, VOCAB_SIZE, save_char_tokenizer


def test_round_trip_one_token_per_character(tmp_path):
    from transformers import AutoTokenizer

    save_char_tokenizer(tmp_path, VOCAB_SIZE)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = '{"color": "red", "n": [1, 2]}\n~ok'
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert [tok.convert_ids_to_tokens(i) for i in range(3, VOCAB_SIZE)] == list(CHARS)
    assert len(tok) == VOCAB_SIZE and tok.eos_token_id == 2 and tok.bos_token_id == 1
