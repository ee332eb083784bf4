"""A character-level tokenizer whose tokens are real strings, for structured output (xgrammar, llguidance).

Grammar backends build their token tables from each token's decoded text. The word tokenizer's `w17` tokens decode to
words a grammar never asks for (plain vLLM then ignores a choice constraint), so a grammar test needs a vocabulary
that can spell anything it allows: here `<unk> <s> </s>`, newline and the 95 printable ASCII characters, one token
each, as a BPE model with no merges (the fast-tokenizer form grammar backends read) and a `Fuse` decoder, so
decoding joins the characters back into the text. No BOS is added: a prompt of n characters is n tokens.
"""

from __future__ import annotations

import os

from ascend_testkit.models.word_tokenizer import SPECIALS

CHARS = ("\n", *(chr(c) for c in range(32, 127)))
VOCAB_SIZE = len(SPECIALS) + len(CHARS)  # 99


def char_vocab() -> dict[str, int]:
    return {tok: i for i, tok in enumerate((*SPECIALS, *CHARS))}


def save_char_tokenizer(path: str | os.PathLike, vocab_size: int) -> None:
    """Write the tokenizer to `path` (`vocab_size` must be the model's: every id a token the tokenizer knows)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    if vocab_size != VOCAB_SIZE:
        raise ValueError(f"the character tokenizer has {VOCAB_SIZE} tokens; the model asks for {vocab_size}")
    tok = Tokenizer(models.BPE(vocab=char_vocab(), merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
