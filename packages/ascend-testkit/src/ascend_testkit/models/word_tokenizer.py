"""The word-level tokenizer every tiny checkpoint ships: `<unk> <s> </s>` then `w0 … wN`, split on whitespace.

One word is one token and no BOS is added, so a prompt of n words is exactly n tokens for every tiny model.
"""

from __future__ import annotations

import os

SPECIALS = ("<unk>", "<s>", "</s>")


def word(i: int) -> str:
    return f"w{i}"


def save_word_tokenizer(path: str | os.PathLike, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for i in range(vocab_size - len(SPECIALS)):
        vocab[word(i)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)


def prompt_of_length(n: int, offset: int = 0, vocab_size: int = 1000) -> str:
    """A prompt that tokenizes to exactly `n` tokens (no BOS is added by this tokenizer)."""
    return " ".join(word((offset + 7 * i) % (vocab_size - len(SPECIALS))) for i in range(n))
