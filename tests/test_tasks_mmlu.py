"""MMLU-format multiple choice: prompt format, sources (file, synthetic, hub offline), bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from gna_interp.errors import InputError, ModelUnavailableError
from gna_interp.models import loading
from gna_interp.tasks import MultipleChoice, Question, evaluate, file_questions, synthetic_questions
from gna_interp.engine import plan_scoring

QS = [Question("What is the capital of France?", ("Berlin", "Paris", "Rome", "Madrid"), 1, "geography"),
      Question("2 + 2 =", ("3", "4", "5", "22"), 1, "math")]


def test_letters_format():
    s = MultipleChoice(QS)[0]
    assert s.prompt == "What is the capital of France?\nA. Berlin\nB. Paris\nC. Rome\nD. Madrid\nAnswer:"
    assert s.candidates == (" A", " B", " C", " D") and s.gold == 1 and s.answer == " B"
    assert [s.prompt[a:b] for a, b in s.spans.items] == ["A. Berlin\n", "B. Paris\n", "C. Rome\n", "D. Madrid\n"]
    assert s.prompt[slice(*s.spans.query)] == QS[0].question
    assert s.prompt[s.cue_start:] == "Answer:"
    assert MultipleChoice(QS, letter_prefix="")[0].candidates == ("A", "B", "C", "D")


def test_cloze_format_and_header():
    s = MultipleChoice(QS, format="cloze", header="The following are multiple choice questions.")[0]
    assert s.prompt == "The following are multiple choice questions.\n\nWhat is the capital of France?\nAnswer:"
    assert s.candidates == (" Berlin", " Paris", " Rome", " Madrid") and s.spans.items == ()


def test_synthetic_is_seeded_and_answerable_from_context():
    a, b = synthetic_questions(20, seed=1), synthetic_questions(20, seed=1)
    assert a == b and a != synthetic_questions(20, seed=2)
    for q in a:
        thing = q.question.splitlines()[-1].removeprefix("Who owns the ").removesuffix("?")
        assert f"The {thing} belongs to the {q.choices[q.answer]}." in q.question
        assert sum(f"belongs to the {c}." in q.question for c in q.choices) == 4
    assert {q.answer for q in synthetic_questions(40, seed=0)} == {0, 1, 2, 3}
    assert len(MultipleChoice.synthetic(3, n_choices=6)[0].candidates) == 6


@pytest.mark.parametrize("kind", ["jsonl", "csv-json", "csv-letters", "parquet"])
def test_local_files(tmp_path, kind):
    rows = [{"question": q.question, "choices": list(q.choices), "answer": q.answer, "subject": q.subject} for q in QS]
    if kind == "jsonl":
        path = tmp_path / "q.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows))
    elif kind == "csv-json":
        path = tmp_path / "q.csv"
        pd.DataFrame([{**r, "choices": json.dumps(r["choices"])} for r in rows]).to_csv(path, index=False)
    elif kind == "csv-letters":
        path = tmp_path / "q.csv"
        pd.DataFrame([{"question": r["question"], **dict(zip("ABCD", r["choices"])), "answer": "ABCD"[r["answer"]],
                       "subject": r["subject"]} for r in rows]).to_csv(path, index=False)
    else:
        path = tmp_path / "q.parquet"
        pd.DataFrame(rows).to_parquet(path)
    assert file_questions(path) == QS
    task = MultipleChoice.from_file(path, n_samples=1)
    assert len(task) == 1 and task.name == "q-letters"


def test_file_with_missing_columns(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "x?", "options": ["a", "b"], "answer": 0}))
    with pytest.raises(InputError, match=r"lacks the column\(s\) \['question', 'choices'\]"
                                          r".*has \['prompt', 'options', 'answer'\]"):
        file_questions(path)


def test_file_errors(tmp_path):
    with pytest.raises(InputError, match="no such question file"):
        file_questions(tmp_path / "nope.jsonl")
    (tmp_path / "q.txt").write_text("x")
    with pytest.raises(InputError, match="unsupported question file type"):
        file_questions(tmp_path / "q.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "choices": ["a", "b"], "answer": "Z"}))
    with pytest.raises(InputError, match="neither an option index"):
        file_questions(bad)
    bad.write_text(json.dumps({"question": "q", "choices": ["a", "b"], "answer": 5}))
    with pytest.raises(InputError, match="answer 5 is not an index"):
        file_questions(bad)
    csv = tmp_path / "bad.csv"
    pd.DataFrame([{"question": "q", "choices": "a or b", "answer": 0}]).to_csv(csv, index=False)
    with pytest.raises(InputError, match="must be a list"):
        file_questions(csv)


def test_hub_unreachable_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(loading, "hub_reachable", lambda *a, **k: False)
    with pytest.raises(ModelUnavailableError, match="not reachable.*from_file.*synthetic"):
        MultipleChoice.from_hub("anatomy")


def test_bad_format():
    with pytest.raises(InputError, match="unknown multiple-choice format"):
        MultipleChoice(QS, format="essay")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="2..26 choices"):
        Question("q", ("only",), 0)


def test_evaluate_multiple_choice_on_tiny_models(tiny_models):
    task = MultipleChoice.synthetic(4, seed=0)
    for fam in ("llama", "mamba2"):
        ev = evaluate(tiny_models[fam], task, progress=False)
        assert ev.metrics["chance"] == pytest.approx(0.25) and 0 <= ev.accuracy <= 1
        # byte tokens: " A".." D" share the first token " ": one row per question
        assert len(plan_scoring(tiny_models[fam], task.samples).rows) == 4
