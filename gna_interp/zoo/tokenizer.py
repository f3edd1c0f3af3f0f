"""A small word-level tokenizer for the zoo models: template words, the shipped word list, values 0-99.

Pre-tokenisation is a GPT-2-style regex that keeps a word's leading space on the word (``" value"``);
newlines are tokens of their own, and every key and value is one token. A normaliser drops a space
that stands right before a number, so the candidate ``" 42"`` is the single token ``"42"`` -- the very
token of the dictionary line ``"apple:42"`` -- and the value is predicted at the prompt's last token
(``" is"``), where the Aggregate head of a G&A circuit attends from. Text outside the vocabulary maps
to ``[UNK]``. Decoding concatenates token strings, so it reproduces text except those dropped spaces.
"""

from __future__ import annotations

from typing import Any, Iterable

from gna_interp.tasks.kv import HEADER
from gna_interp.tasks.words import word_list

PAD = "<|endoftext|>"
UNK = "[UNK]"
SPLIT_PATTERN = r" ?[A-Za-z]+|[0-9]+| ?[^\sA-Za-z0-9]|\s"
# Texts whose pieces are in the vocabulary besides keys and values: both KV templates.
TEMPLATE_TEXTS = (HEADER, "The value of the key 'x' is", "x:", "\n", " ")
NUMBER_SPACE = r" (?=[0-9])"  # a space before a number belongs to no token
MAX_VALUE = 99


def _pieces(text: str) -> list[str]:
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")
    return [p for p, _ in split.pre_tokenize_str(text)]


def vocabulary(words: Iterable[str] | None = None, max_value: int = MAX_VALUE) -> list[str]:
    """Token strings in id order: specials, template pieces, keys (``words``), values ``0..max_value``."""
    tokens = [PAD, UNK]
    for text in TEMPLATE_TEXTS:
        tokens += _pieces(text)
    tokens += list(words if words is not None else word_list())
    tokens += [str(v) for v in range(max_value + 1)]
    return list(dict.fromkeys(t for t in tokens if t != "x"))


def build_tokenizer(words: Iterable[str] | None = None, max_value: int = MAX_VALUE) -> Any:
    """A ``PreTrainedTokenizerFast`` (word-level, no special tokens added to prompts) for the zoo."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(vocabulary(words, max_value))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Replace(Regex(NUMBER_SPACE), "")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=PAD, eos_token=PAD, pad_token=PAD,
                                   unk_token=UNK)
