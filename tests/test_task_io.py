"""Tasks save to strict JSON and load back with identical samples; bad dicts and bad words are clear errors."""

from __future__ import annotations

import copy
import json

import pytest

from gna_interp.errors import InputError
from gna_interp.tasks import KVRetrieval, MultipleChoice, Sample, Task, synthetic_questions, task_from_dict
from gna_interp.tasks.segments import CharSegments
from spm_tokenizer import spm_tokenizer

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def round_trip(task: Task) -> Task:
    """``task`` through ``to_dict`` -> strict JSON text -> ``task_from_dict``."""
    return task_from_dict(json.loads(json.dumps(task.to_dict(), allow_nan=False)))


def assert_same(task: Task, loaded: Task) -> None:
    assert type(loaded) is type(task) and loaded.name == task.name
    assert [s for s in loaded.samples] == [s for s in task.samples]


@pytest.mark.parametrize("template", ["official", "completion"])
@pytest.mark.parametrize("words", [None, ["apple", "river", "stone", "cloud", "maple", "tiger", "piano"]])
def test_kv_round_trip(template, words):
    task = KVRetrieval(n_pairs=5, n_samples=7, seed=3, template=template, max_value=20, words=words)
    d = task.to_dict()
    assert d["format_version"] == 1 and d["kind"] == "kv" and d["n_samples"] == 7
    assert d["args"] == {"n_pairs": 5, "n_samples": 7, "seed": 3, "template": template, "max_value": 20,
                         "words": words, "value_suffix": "" if template == "official" else "\n"}
    assert_same(task, round_trip(task))


def test_kv_round_trip_keeps_a_custom_suffix_and_name():
    task = KVRetrieval(n_pairs=4, n_samples=3, seed=1).with_value_suffix(".")
    task.name = "renamed"
    loaded = round_trip(task)
    assert_same(task, loaded)
    assert loaded[0].candidates[0].endswith(".")


@pytest.mark.parametrize("fmt", ["letters", "cloze"])
def test_multiple_choice_round_trip(fmt):
    header = "The following are questions about who owns what."
    shots = synthetic_questions(2, seed=9, n_choices=5)
    task = MultipleChoice(synthetic_questions(6, seed=2, n_choices=5), format=fmt, name="owners", header=header,
                          letter_prefix="", shots=shots)
    d = task.to_dict()
    assert d["kind"] == "mc" and d["name"] == f"owners-{fmt}" and len(d["questions"]) == 6
    assert d["args"] == {"format": fmt, "name": "owners", "header": header, "letter_prefix": "",
                         "shots": [q.to_dict() for q in shots]}
    loaded = round_trip(task)
    assert_same(task, loaded)
    assert loaded.questions == task.questions and loaded.shots == task.shots


def test_chat_wrapped_tasks_round_trip_as_samples():
    tok = copy.deepcopy(spm_tokenizer())  # the cached tokenizer is shared: do not give it a template
    tok.chat_template = CHAT_TEMPLATE
    for task in [KVRetrieval(6, 4, seed=0).with_chat_template(tok, system="Be brief."),
                 MultipleChoice.synthetic(4, seed=1).with_chat_template(tok)]:
        d = task.to_dict()
        assert d["kind"] == "samples" and task.name.endswith("+chat")
        loaded = round_trip(task)
        assert type(loaded) is Task and loaded.name == task.name
        assert [s for s in loaded.samples] == [s for s in task.samples]
        assert all(s.meta["chat"] is True for s in loaded)
        assert [s.segments(tok) for s in loaded] == task.segments(tok)


def test_plain_task_keeps_every_sample_field():
    samples = [Sample("ctx a:1\nb:2\nQ b", (" 1", " 2"), 1, CharSegments(((0, 8), (8, 12)), (14, 15)), 12,
                      {"key": "b", "value": 2, "ratio": 0.5, "ok": True, "note": None}),
               Sample("x", ("y",), 0)]
    task = Task("hand-made", samples)
    assert task.to_dict()["samples"][1] == {"prompt": "x", "candidates": ["y"], "gold": 0,
                                            "spans": {"items": [], "query": None}, "cue_start": 0, "meta": {}}
    assert_same(task, round_trip(task))


def test_meta_that_is_not_strict_json_is_refused():
    with pytest.raises(InputError, match=r"meta 'score' = nan is not a finite number"):
        Task("t", [Sample("p", ("a",), 0, meta={"score": float("nan")})]).to_dict()
    with pytest.raises(InputError, match=r"meta 'tags' = \['a'\] is a list, not a JSON scalar"):
        Task("t", [Sample("p", ("a",), 0, meta={"tags": ["a"]})]).to_dict()


def test_unknown_kind_is_refused():
    d = {**KVRetrieval(3, 2).to_dict(), "kind": "sudoku"}
    with pytest.raises(InputError, match=r"unknown task kind 'sudoku'.*\['knowledge', 'kv', 'mc', 'samples'\]"):
        task_from_dict(d)


def test_newer_or_absent_format_version_is_refused():
    d = KVRetrieval(3, 2).to_dict()
    with pytest.raises(InputError, match=r"format_version=2; this gna_interp reads format_version 1\.\.1.*upgrade"):
        task_from_dict({**d, "format_version": 2})
    del d["format_version"]
    with pytest.raises(InputError, match=r"no 'format_version'.*reads format_version 1\.\.1"):
        task_from_dict(d)


def test_malformed_fields_are_named():
    d = KVRetrieval(3, 2).to_dict()
    with pytest.raises(InputError, match=r"'n_pairs' must be int, got '3'"):
        task_from_dict({**d, "args": {**d["args"], "n_pairs": "3"}})
    with pytest.raises(InputError, match=r"unknown argument\(s\) \['colour'\]"):
        task_from_dict({**d, "args": {**d["args"], "colour": "red"}})
    with pytest.raises(InputError, match=r"says n_samples=5 but rebuilds with 2"):
        task_from_dict({**d, "n_samples": 5})


def test_words_must_be_a_list_of_strings():
    with pytest.raises(InputError, match=r"words='apple' is a single string.*pass a list of words"):
        KVRetrieval(words="apple")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"words must all be strings, got \[3\].*pass a list of words"):
        KVRetrieval(n_pairs=2, words=["apple", 3, "river"])  # type: ignore[list-item]
