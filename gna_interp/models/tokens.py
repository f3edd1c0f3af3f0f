"""Where each token of a text sits: its character span (:func:`token_offsets`)."""

from __future__ import annotations

from typing import Any

from gna_interp.errors import InputError

CharSpan = tuple[int, int]


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
