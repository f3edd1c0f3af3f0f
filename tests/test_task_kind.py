"""A task kind added from this file alone: registered, chosen by ``choose_task``, evaluated, and refused once
unregistered (the "How to add a task" section of docs/architecture.md)."""

from __future__ import annotations

import random
from typing import Any

import pytest

import gna_interp as gna
from gna_interp.errors import OptionError
from gna_interp.tasks import Sample, Task, TaskKind, TextBuilder, register_task_kind, task_kinds, unregister_task_kind
from gna_interp.tasks.segments import CharSegments


class ReverseKV(TaskKind):
    """Which key holds a value: a KV dictionary read backwards (``apple:3`` ... ``The key of the value 3:`` ->
    ``apple``)."""

    name = "reverse_kv"

    def forms(self, choice: Any) -> tuple[dict, list[dict], dict]:
        form = {"n_pairs": choice.pairs or 4, "max_value": choice.max_value or 9}
        return {}, [form], form                       # one form: nothing to calibrate

    def build(self, model: Any, options: Any, form: dict, first_seed: bool) -> Task:
        rng = random.Random(options.seed)
        samples = []
        for _ in range(options.samples):
            keys = rng.sample(model.kv_words, form["n_pairs"])
            values = rng.sample(range(form["max_value"] + 1), form["n_pairs"])
            gold = rng.randrange(form["n_pairs"])
            text = TextBuilder()
            text.add("Memorize the following dictionary:\n")
            lines = tuple(text.add(f"{k}:{v}\n") for k, v in zip(keys, values))
            cue = text.position
            text.add("The key of the value ")
            query = text.add(str(values[gold]))
            text.add(":")
            samples.append(Sample(text.text, tuple(keys), gold, CharSegments(lines, query), cue))
        return Task(f"reverse-kv{form['n_pairs']}", samples)


@pytest.fixture
def reverse_kv():
    kind = register_task_kind(ReverseKV())
    try:
        yield kind
    finally:
        unregister_task_kind("reverse_kv")


def test_a_task_kind_from_outside_is_chosen_and_evaluated(reverse_kv):
    model = gna.load_model("zoo:transformer-kv")
    chosen = gna.choose_task(model, kind="reverse_kv", samples=6, pairs=3)
    assert chosen.task.name == "reverse-kv3" and len(chosen.task) == 6 and chosen.calibration is None
    assert chosen.twin is None and chosen.form == {"n_pairs": 3, "max_value": 9}
    ev = gna.evaluate(model, chosen.task, progress=False)
    assert 0.0 <= ev.accuracy <= 1.0 and chosen.task.chance == pytest.approx(1 / 3)
    assert len(ev.to_frame()) == 6
    assert chosen.reference(model)[0].prompt != chosen.task[0].prompt      # seed + 1: another set of prompts
    kv = gna.choose_task(model, kind="reverse_kv", samples=2, formats=("official",))
    assert [t.name for t in kv.formats] == ["kv4-official"]  # a built-in format beside it, with its pairs


def test_a_task_kind_is_refused_when_unknown_or_taken(reverse_kv):
    assert task_kinds() == ("kv", "mc", "cloze", "reverse_kv")
    with pytest.raises(OptionError, match="already registered"):
        register_task_kind(ReverseKV())
    with pytest.raises(OptionError, match="already offered"):
        register_task_kind(type("Twice", (ReverseKV,), {"name": "twice", "formats": ("letters",)})())
    with pytest.raises(OptionError, match="lower-case name"):
        register_task_kind(type("Bad", (ReverseKV,), {"name": "Bad"})())
    unregister_task_kind("reverse_kv")
    try:
        with pytest.raises(OptionError, match="unknown kind"):
            gna.TaskChoice(kind="reverse_kv")
    finally:
        register_task_kind(reverse_kv)
