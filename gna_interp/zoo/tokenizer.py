"""A small word-level tokenizer for the zoo models: template words, the zoo keys, values 0-99.

The zoo keys are the first :data:`N_KEYS` words of the shipped word list. Dictionaries still draw keys
and values afresh for every prompt, so the task stays in-context retrieval; tasks for a zoo model take
``words=model.kv_words``.

Every key and value is one token, and only words and numbers are tokens. Pre-tokenisation first
removes the dictionary separators ``":"``, the line breaks, the quotes around the asked key and the
cue's closing ``"' is"`` (:data:`DROPPED`), then splits with a GPT-2-style regex that keeps a word's
leading space on the word (``" value"``); a normaliser drops a space right before a number. So

- a dictionary line ``"apple:42\n"`` is the two tokens ``apple``, ``42`` (its summary token is the value);
- the official cue ``"The value of the key 'apple' is"`` ends with the token ``apple``: the prompt's
  last token is the asked key, where the value is predicted (and an Aggregate head attends from);
- the candidate ``" 42"`` is the single token ``42``, the very token of the dictionary line.

Why these choices (measured while building the zoo, 2-layer d=64 Llama, 1 CPU thread): with all 900
words as keys, or with any token between a key and its value (``":"``), or with the value predicted
one or two tokens after the asked key (``"' is"``), the transformer stayed at chance for 3000 steps
and more, while with the layout above it went from chance to 99% at 8 pairs between steps 1300 and 1700.
Decoding concatenates token strings, so it reproduces a text without the dropped pieces; figures label tokens
with the text itself (:meth:`Model.token_labels <gna_interp.models.model.Model.token_labels>`: a token's label runs
to the next token's start), so a pattern page reads ``apple:``, ``12\n``, ``banana:``, ``7\n``. Text outside the
vocabulary would map to ``[UNK]``; a :class:`~gna_interp.models.model.Model` refuses it wherever text enters
(:meth:`Model.check_known <gna_interp.models.model.Model.check_known>`), unless the text writes ``[UNK]`` itself.
"""

from __future__ import annotations

from typing import Any, Iterable

from gna_interp.tasks.kv import HEADER
from gna_interp.tasks.words import word_list

N_KEYS = 64  # keys in the zoo vocabulary (>= the largest evaluated dictionary, 40)
PAD = "<|endoftext|>"
UNK = "[UNK]"
SPLIT_PATTERN = r" ?[A-Za-z]+|[0-9]+| ?[^\sA-Za-z0-9]|\s"
DROPPED = r"[:\n]| ?'( is)?"  # separators, line breaks, quotes and the cue's closing "' is" are no tokens
# Texts whose pieces are in the vocabulary besides keys and values: the official KV template (the
# completion template's "x:" lines add no piece: the colon and line break are dropped) and a lone space.
TEMPLATE_TEXTS = (HEADER, "The value of the key 'x' is", " ")
NUMBER_SPACE = r" (?=[0-9])"  # a space before a number belongs to no token
MAX_VALUE = 99


def zoo_keys() -> tuple[str, ...]:
    """The KV keys of the zoo: the first :data:`N_KEYS` words of the shipped word list."""
    return word_list()[:N_KEYS]


def _pre_tokenizer() -> Any:
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(DROPPED), behavior="removed"),
                                    pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")])


def _pieces(text: str) -> list[str]:
    return [p for p, _ in _pre_tokenizer().pre_tokenize_str(text)]


def vocabulary(words: Iterable[str] | None = None, max_value: int = MAX_VALUE) -> list[str]:
    """Token strings in id order: specials, template pieces, keys (``words``), values ``0..max_value``."""
    tokens = [PAD, UNK]
    for text in TEMPLATE_TEXTS:
        tokens += _pieces(text)
    tokens += list(words if words is not None else zoo_keys())
    tokens += [str(v) for v in range(max_value + 1)]
    return list(dict.fromkeys(t for t in tokens if t != "x"))


def build_tokenizer(words: Iterable[str] | None = None, max_value: int = MAX_VALUE) -> Any:
    """A ``PreTrainedTokenizerFast`` (word-level, no special tokens added to prompts) for the zoo."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(vocabulary(words, max_value))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Replace(Regex(NUMBER_SPACE), "")
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=PAD, eos_token=PAD, pad_token=PAD,
                                   unk_token=UNK)
