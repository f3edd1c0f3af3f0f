"""A SentencePiece-style tokenizer built offline: Unigram model + Metaspace (``▁``) pre-tokenizer.

Trained with the ``tokenizers`` library on the shipped word list and a few prompt fragments, small
enough (< 257 pieces) that its ids fit the tiny test models' byte vocabulary.
"""

from __future__ import annotations

from functools import lru_cache

from gna_interp.tasks.words import word_list


@lru_cache(maxsize=2)
def spm_tokenizer(split_digits: bool = True):
    """``split_digits`` mirrors SentencePiece's option of the same name (Llama-2 uses it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = list(word_list())
    tok = Tokenizer(models.Unigram())
    meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.pre_tokenizer = pre_tokenizers.Sequence([meta, pre_tokenizers.Digits(individual_digits=True)]) \
        if split_digits else meta
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    corpus = [" ".join(words[i:i + 8]) for i in range(0, len(words), 8)]
    corpus += [f"{w}:{i}\n" for i, w in enumerate(words[:100])]
    corpus += ["Memorize the following dictionary:\nThe value of the key 'x' is 42\nAnswer: A B C D\n"
               "Who owns the lamp? The lamp belongs to the pilot."]
    trainer = trainers.UnigramTrainer(vocab_size=240, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>")
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>")
