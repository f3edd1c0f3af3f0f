"""Where each token of a text sits: its character span (:func:`token_offsets`) and the label a figure shows for it
(:func:`token_labels`).

A tokenizer may drop text. The zoo's word-level tokenizer removes the dictionary's ``":"`` and line breaks
(:mod:`gna_interp.zoo.tokenizer`), so its tokens decoded one by one read ``apple 12 banana 7`` where the prompt
reads ``apple:12\\nbanana:7``. A token label covers the text from the token's start up to the next token's
start: text that belongs to no token shows with the token before it (``apple:``, ``12\\n``), and the labels of
a prompt joined give the prompt back. For a tokenizer that drops nothing (its tokens decoded together give the
text back) the labels are the tokens decoded one by one, exactly
:meth:`~gna_interp.models.model.Model.to_str_tokens`.
"""

from __future__ import annotations

from typing import Any, Sequence

from gna_interp.errors import InputError

CharSpan = tuple[int, int]


def token_offsets_all(tokenizer: Any, texts: Sequence[str]) -> list[tuple[list[int], list[CharSpan]]]:
    """:func:`token_offsets` of each of ``texts``: one call of a fast tokenizer for all of them."""
    if getattr(tokenizer, "is_fast", False) and texts:
        enc = tokenizer(list(texts), return_offsets_mapping=True)
        return [(list(ids), [(int(a), int(b)) for a, b in offs])
                for ids, offs in zip(enc["input_ids"], enc["offset_mapping"])]
    return [token_offsets(tokenizer, t) for t in texts]


def token_offsets(tokenizer: Any, text: str) -> tuple[list[int], list[CharSpan]]:
    """Token ids of ``text`` (with the tokenizer's own special tokens) and each token's character span.

    Fast tokenizers give the offsets directly. Otherwise they are recovered by decoding growing
    prefixes, which needs a tokenizer whose decoding reproduces the text.
    """
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, return_offsets_mapping=True)
        return list(enc["input_ids"]), [(int(a), int(b)) for a, b in enc["offset_mapping"]]
    ids = list(tokenizer(text)["input_ids"])
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    offsets, prev = [], 0
    for i, tid in enumerate(ids):
        if tid in special:
            offsets.append((prev, prev))
            continue
        end = len(tokenizer.decode(ids[: i + 1], skip_special_tokens=True))
        offsets.append((prev, end))
        prev = end
    if tokenizer.decode(ids, skip_special_tokens=True) != text:
        raise InputError(
            f"{type(tokenizer).__name__} gives no offset mapping and its decoding does not reproduce the "
            f"prompt, so token positions cannot be recovered; load the model with a fast (tokenizers-backed) tokenizer"
        )
    return ids, offsets


def token_labels(tokenizer: Any, text: str) -> tuple[list[int], list[str]]:
    """Token ids of ``text`` (``tokenizer(text)``'s) and one label per token, the labels covering the whole text.

    Where the tokens decoded together reproduce ``text`` (the tokenizer drops nothing) each label is its token
    decoded on its own. Otherwise (a fast tokenizer's offsets) token ``i``'s label is ``text[start_i:start_j]``,
    ``j`` the next token from the text (the first label starts at character 0, the last runs to the end), so text
    the tokenizer dropped shows with the token before it. Special tokens the tokenizer adds (a BOS token: no
    characters of ``text``), a token whose slice is empty and every token of a tokenizer without offsets keep
    their decoded string."""
    fast = bool(getattr(tokenizer, "is_fast", False))
    ids, offsets = token_offsets(tokenizer, text) if fast else (list(tokenizer(text)["input_ids"]), [])
    pieces = [tokenizer.decode([i]) for i in ids]
    if not fast:
        return ids, pieces
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    inside = [k for k, (i, (a, b)) in enumerate(zip(ids, offsets)) if i not in special or a < b]
    if tokenizer.decode([ids[k] for k in inside], clean_up_tokenization_spaces=False) == text:
        return ids, pieces
    starts = [0] + [offsets[k][0] for k in inside[1:]]
    for k, a, b in zip(inside, starts, starts[1:] + [len(text)]):
        if b > a:
            pieces[k] = text[a:b]
    return ids, pieces
