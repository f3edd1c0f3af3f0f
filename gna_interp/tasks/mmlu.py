"""MMLU-format multiple choice: ``question\\nA. …\\nB. …\\nC. …\\nD. …\\nAnswer:`` scored on the letters.

Formats:

- ``letters``: candidates ``" A"``, ``" B"``, ...; the option lines are the segments
  (``candidates[i]`` belongs to ``items[i]``), the question is the query. A letter is tokenized in
  context, so ``" A"`` is one token for BPE/SentencePiece vocabularies that have it and
  ``" "`` + ``"A"`` (a shared first token, which cancels in every comparison) for those that do
  not; ``letter_prefix=""`` scores ``"A"`` instead.
- ``cloze``: ``question\\nAnswer:`` with the full option texts (``" Paris"``) as candidates: the
  "knowledge" format, no option lines in the prompt.
- ``stated``: letters with the answer stated: option lines ``Paris (B)``, cue ``Answer: Paris (``,
  candidates ``"A"``, ``"B"``, ...: the model finds the stated option and copies its letter (in-context
  retrieval in multiple-choice form). Small models that are at chance on ``letters`` solve it
  (SmolLM2-135M: 0.61 on :meth:`MultipleChoice.categories` with 3 shots, chance 0.25; ``letters`` 0.17-0.27).

Sources: :func:`hub_questions` (``datasets``: ``cais/mmlu``, needs a reachable hub),
:func:`file_questions` (local jsonl/json/csv/parquet with ``question``, ``choices``, ``answer``),
:func:`synthetic_questions` (offline, the answer is stated in the question's context).
"""

from __future__ import annotations

import json
import math
import numbers
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np

from gna_interp.errors import InputError, ModelUnavailableError
from gna_interp.options import check_int
from gna_interp.tasks.base import FORMAT_VERSION, Task
from gna_interp.tasks.sample import Sample
from gna_interp.tasks.seeding import StableRng
from gna_interp.tasks.segments import CharSegments, TextBuilder
from gna_interp.tasks.words import word_list

Format = Literal["letters", "cloze", "stated"]
FORMATS: tuple[str, ...] = ("letters", "cloze", "stated")
LETTERS = string.ascii_uppercase
MMLU_HUB_ID = "cais/mmlu"
SHOT_SEED = 1_000_003  # generated shots come from seed SHOT_SEED + seed: a stream disjoint from the questions'


@dataclass(frozen=True)
class Question:
    """One multiple-choice question; ``answer`` indexes ``choices``."""

    question: str
    choices: tuple[str, ...]
    answer: int
    subject: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.question, str):
            raise InputError(f"a question must be text, got {type(self.question).__name__}")
        if isinstance(self.choices, str) or not all(isinstance(c, str) for c in self.choices):
            raise InputError(f"choices must be a list of option texts, got {self.choices!r}: {self.question[:60]!r}")
        if not 2 <= len(self.choices) <= len(LETTERS):
            raise InputError(f"a question needs 2..{len(LETTERS)} choices, got {len(self.choices)}: "
                             f"{self.question[:60]!r}")
        if isinstance(self.answer, (bool, np.bool_)) or not isinstance(self.answer, numbers.Integral):
            raise InputError(f"answer must be an integer index into the choices, got {self.answer!r} "
                             f"({type(self.answer).__name__}): {self.question[:60]!r}")
        if not 0 <= self.answer < len(self.choices):
            raise InputError(f"answer {self.answer} is not an index into {len(self.choices)} choices: "
                             f"{self.question[:60]!r}")

    def to_dict(self) -> dict[str, Any]:
        """``{question, choices, answer, subject}`` as JSON data."""
        return {"question": self.question, "choices": list(self.choices), "answer": int(self.answer),
                "subject": self.subject}


class MultipleChoice(Task):
    """Multiple-choice questions as a task (``letters``, ``cloze`` or ``stated`` format).

    ``header`` is an optional first paragraph (e.g. ``"The following are multiple choice questions
    (with answers) about anatomy."``); ``shots`` are solved questions put before each question in the
    same format, ``Answer: B`` (or the option text in cloze format) after each (few-shot prompting).
    For a chat model, ``task.with_chat_template(model.tokenizer)`` wraps each question in the model's chat
    template, the cue ``"Answer:"`` opening the assistant's reply (as for every task).
    """

    def __init__(self, questions: Sequence[Question], format: Format = "letters", name: str = "mc",
                 header: str | None = None, letter_prefix: str = " ", shots: Sequence[Question] = ()) -> None:
        if format not in FORMATS:
            raise InputError(f"unknown multiple-choice format {format!r}; choose one of {FORMATS}")
        self.format = format
        self.questions: tuple[Question, ...] = tuple(questions)
        self.letter_prefix = letter_prefix
        if not isinstance(shots, (list, tuple)):
            raise InputError(f"shots must be a list of Question objects (e.g. category_questions(3, seed=1)), got "
                             f"{type(shots).__name__}")
        self.shots: tuple[Question, ...] = tuple(shots)
        if not all(isinstance(q, Question) for q in self.shots):
            raise InputError("shots must be Question objects (e.g. category_questions(3, seed=1))")
        self._args = {"format": format, "name": name, "header": header, "letter_prefix": letter_prefix,
                      "shots": [q.to_dict() for q in self.shots]}
        samples = [self._sample(q, header, letter_prefix) for q in self.questions]
        if not samples:
            raise InputError(f"no questions given for task {name!r}")
        super().__init__(f"{name}-{format}", samples)

    def to_dict(self) -> dict[str, Any]:
        """The questions and constructor arguments (``kind: "mc"``), rebuilt through the constructor on load (its
        chat-wrapped form, :meth:`with_chat_template`, is a plain task stored as its samples)."""
        return {"format_version": FORMAT_VERSION, "kind": "mc", "name": self.name, "n_samples": len(self),
                "args": dict(self._args), "questions": [q.to_dict() for q in self.questions]}

    def _sample(self, q: Question, header: str | None, letter_prefix: str) -> Sample:
        b = TextBuilder()
        if header:
            b.add(header.rstrip("\n") + "\n\n")
        for shot in self.shots:
            b.add(shot.question.strip() + "\n")
            b.add("".join(self._option(i, c) for i, c in enumerate(shot.choices)))
            b.add(f"{self._cue(shot)}{self._answer(shot)}\n\n")
        query = b.add(q.question.strip())
        b.add("\n")
        items = [b.add(self._option(i, c)) for i, c in enumerate(q.choices)] if self.format != "cloze" else []
        if self.format == "letters":
            cands = tuple(f"{letter_prefix}{LETTERS[i]}" for i in range(len(q.choices)))
        elif self.format == "stated":
            cands = tuple(LETTERS[i] for i in range(len(q.choices)))
        else:
            cands = tuple(f" {c.strip()}" for c in q.choices)
        if self.format != "letters" and len({c.strip() for c in q.choices}) != len(q.choices):
            raise InputError(f"{self.format} format needs distinct option texts; {q.question[:60]!r} repeats one")
        cue_start = b.add(self._cue(q))[0]
        return Sample(b.text, cands, q.answer, CharSegments(tuple(items), query), cue_start,
                      {"subject": q.subject, "format": self.format, "answer_letter": LETTERS[q.answer]})

    @classmethod
    def from_hub(cls, subject: str = "all", split: str = "test", n_samples: int | None = None,
                 **kwargs: Any) -> "MultipleChoice":
        """MMLU from the hub (``cais/mmlu``, one subject or ``all``)."""
        return cls(hub_questions(subject, split, n_samples), name=f"mmlu-{subject}", **kwargs)

    @classmethod
    def from_file(cls, path: str | Path, n_samples: int | None = None, shots: int | Sequence[Question] = (),
                  **kwargs: Any) -> "MultipleChoice":
        """Questions from a local jsonl/json/csv/parquet file (see :func:`file_questions`). ``shots``: a count, as
        ``--shots`` on the command line (the file's first ``shots`` questions become the solved examples, the next
        ``n_samples`` the questions), or the solved :class:`Question` objects themselves."""
        if n_samples is not None:
            check_int("n_samples", n_samples, 1)
        qs = file_questions(path)
        if isinstance(shots, int) and not isinstance(shots, bool):
            check_int("shots", shots, 0)
            if shots and shots >= len(qs):
                raise InputError(f"{path}: shots={shots} takes every one of its {len(qs)} questions as examples; "
                                 f"leave some to ask (shots < {len(qs)})")
            shots, qs = qs[:shots], qs[shots:]
        return cls(qs[:n_samples] if n_samples else qs, name=Path(path).stem, shots=shots, **kwargs)

    def _option(self, i: int, text: str) -> str:
        """An option line (none in cloze format)."""
        if self.format == "cloze":
            return ""
        return f"{text.strip()} ({LETTERS[i]})\n" if self.format == "stated" else f"{LETTERS[i]}. {text.strip()}\n"

    def _cue(self, q: Question) -> str:
        """The answer cue, ``Answer:`` (``stated``: ``Answer: TEXT (``)."""
        return f"Answer: {q.choices[q.answer].strip()} (" if self.format == "stated" else "Answer:"

    def _answer(self, q: Question) -> str:
        """What follows the cue in a solved shot."""
        if self.format == "stated":
            return f"{LETTERS[q.answer]})"
        if self.format == "letters":
            return f"{self.letter_prefix}{LETTERS[q.answer]}"
        return f" {q.choices[q.answer].strip()}"

    @classmethod
    def categories(cls, n_samples: int = 64, seed: int = 0, n_choices: int = 4, shots: int = 3,
                   **kwargs: Any) -> "MultipleChoice":
        """Offline knowledge questions (:func:`category_questions`), each after ``shots`` solved ones
        drawn from another stream of the same generator."""
        return cls(category_questions(n_samples, seed, n_choices), name="categories",
                   shots=category_questions(shots, SHOT_SEED + seed, n_choices) if shots else (), **kwargs)

    @classmethod
    def synthetic(cls, n_samples: int = 64, seed: int = 0, n_choices: int = 4, **kwargs: Any) -> "MultipleChoice":
        """Offline questions whose answer is stated in the question (see :func:`synthetic_questions`)."""
        return cls(synthetic_questions(n_samples, seed, n_choices), name="synthetic", **kwargs)


QUESTION_SOURCES = ("categories", "synthetic", "FILE", "hub[:subject]")


def questions_from(source: str, n_samples: int, seed: int = 0, shots: int = 0) -> tuple[list[Question], list[Question]]:
    """``(questions, shots)`` from a source named as on the command line: ``categories``
    (:func:`category_questions`), ``synthetic`` (:func:`synthetic_questions`), ``hub`` or ``hub:SUBJECT``
    (MMLU, :func:`hub_questions`) or a local file (:func:`file_questions`). Generated sources draw the
    shots from another seed; a hub or file gives its first ``shots`` questions as shots and the next
    ``n_samples`` as questions."""
    if n_samples < 1 or shots < 0:
        raise InputError(f"need n_samples >= 1 and shots >= 0, got n_samples={n_samples}, shots={shots}")
    if source in ("categories", "synthetic"):
        make = category_questions if source == "categories" else synthetic_questions
        return make(n_samples, seed), make(shots, SHOT_SEED + seed) if shots else []
    if source == "hub" or source.startswith("hub:"):
        pool = hub_questions(source.partition(":")[2] or "all", "test", n_samples + shots)
    elif Path(source).is_file():
        pool = file_questions(source)
    else:
        raise InputError(f"unknown question source {source!r}: use one of {', '.join(QUESTION_SOURCES)} "
                         f"(FILE: an existing .jsonl/.json/.csv/.parquet file)")
    if len(pool) <= shots:
        raise InputError(f"{source!r} holds {len(pool)} questions, not enough for {shots} shots and any question")
    return pool[shots:shots + n_samples], pool[:shots]


def hub_questions(subject: str = "all", split: str = "test", n_samples: int | None = None) -> list[Question]:
    """Load MMLU questions with ``datasets`` from the Hugging Face hub (needs network)."""
    from gna_interp.models.loading import hub_reachable

    if not hub_reachable():
        raise ModelUnavailableError(
            f"{MMLU_HUB_ID} is on the Hugging Face hub, which is not reachable from here; use "
            f"MultipleChoice.from_file(path) with a local jsonl/csv/parquet copy, or MultipleChoice.synthetic()"
        )
    import datasets

    try:
        ds = datasets.load_dataset(MMLU_HUB_ID, subject, split=split)
    except Exception as e:  # datasets raises many types for a bad config/split/network
        raise ModelUnavailableError(f"could not load {MMLU_HUB_ID} subject={subject!r} split={split!r}: "
                                    f"{type(e).__name__}: {e}") from e
    n = len(ds) if n_samples is None else min(n_samples, len(ds))
    return [Question(r["question"], tuple(r["choices"]), int(r["answer"]), r.get("subject", subject))
            for r in ds.select(range(n))]


def _missing(value: Any) -> bool:
    """A cell with no value: absent, JSON null, a NaN or pandas' NA."""
    import pandas as pd

    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _text(value: Any, what: str, where: str) -> str:
    """``value`` checked to be non-empty text (``what`` and ``where`` name it in the message)."""
    if _missing(value):
        raise InputError(f"{where}: {what} is missing (null); every question needs it")
    if not isinstance(value, str):
        raise InputError(f"{where}: {what} must be text, got {value!r} ({type(value).__name__}); write it as a "
                         f"string, e.g. \"{value}\"")
    if not value.strip():
        raise InputError(f"{where}: {what} is empty; write the text")
    return value


def _parse_choices(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise InputError(f"{where}: 'choices' is the text {value[:60]!r}; it must be a list "
                             f"(a JSON list like [\"a\", \"b\"] in CSV files)") from None
    if hasattr(value, "tolist"):  # parquet lists arrive as numpy arrays
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise InputError(f"{where}: 'choices' must be a list of option texts, got {type(value).__name__}")
    return tuple(_text(c, f"choice {i} ({LETTERS[i] if i < len(LETTERS) else i})", where) for i, c in enumerate(value))


def _letter_choices(row: Mapping[str, Any], letters: Sequence[str], where: str) -> tuple[str, ...]:
    """Options from columns ``A``, ``B``, ...: the given ones must come first (a question with fewer options
    leaves the last columns empty, never one in between)."""
    given = [c for c in letters if not _missing(row.get(c)) and row.get(c) != ""]
    if given != list(letters[:len(given)]):
        gap = next(c for c in letters[:len(given)] if c not in given)
        raise InputError(f"{where}: option {gap} is empty but a later one is given; options fill the columns "
                         f"{', '.join(letters)} from the first")
    return tuple(_text(row[c], f"option {c}", where) for c in given)


def _parse_answer(value: Any, n: int, where: str, text_cells: bool = False) -> int:
    """An option index (an integer; a digit string only where every cell is text, as in CSV) or a letter."""
    expected = f"an option index (an integer 0..{n - 1}) nor a letter ({LETTERS[0]}..{LETTERS[n - 1]})"
    if isinstance(value, str):
        s = value.strip()
        if len(s) == 1 and s.upper() in LETTERS[:n]:
            return LETTERS.index(s.upper())
        if not (text_cells and s.isascii() and s.isdigit()):
            hint = f"; write an index as a number ({s}), not text" if s.isascii() and s.isdigit() else ""
            raise InputError(f"{where}: answer {value!r} is neither {expected}{hint}")
        index = int(s)
    elif isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        index = int(value)
    else:  # 1.9, true, null: never rounded or cast into some option
        raise InputError(f"{where}: answer {value!r} ({'missing' if _missing(value) else type(value).__name__}) "
                         f"is neither {expected}")
    if not 0 <= index < n:
        raise InputError(f"{where}: answer {index} is not an index into {n} choices (0..{n - 1})")
    return index


def _read_rows(path: Path) -> list[tuple[str, Any]]:
    """``(where, row)`` for each question of a file, with the values the file holds: JSON and parquet keep
    numbers, booleans, nulls and text apart (no pandas coercion); every CSV cell is text. ``where`` names
    the row for messages: ``'q.jsonl' line 3`` (blank lines counted), ``'q.csv' row 3`` (header not counted)."""
    import pandas as pd

    name = repr(path.name)

    def load(text: str, where: str) -> Any:
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as e:
            raise InputError(f"{where} is not valid JSON ({type(e).__name__}: {e}); is the file truncated?") from None

    if path.suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8-sig").splitlines()
        return [(f"{name} line {i}", load(line, f"{name} line {i}")) for i, line in enumerate(lines, 1) if line.strip()]
    if path.suffix == ".json":
        data = load(path.read_text(encoding="utf-8-sig"), name)
        if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
            keys = list(next(iter(data.values())))  # pandas' DataFrame.to_json() layout: {column: {index: value}}
            data = [{col: values.get(k) for col, values in data.items()} for k in keys]
        if not isinstance(data, list):
            raise InputError(f"{name} holds a JSON {type(data).__name__}; a .json question file holds a list of "
                             f"objects [{{\"question\": ..., \"choices\": [...], \"answer\": 0}}, ...]")
        return [(f"{name} item {i}", r) for i, r in enumerate(data, 1)]
    if path.suffix == ".csv":
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    else:
        df = pd.read_parquet(path, dtype_backend="numpy_nullable")
    return [(f"{name} row {i}", r) for i, r in enumerate(df.to_dict("records"), 1)]


def _row_question(row: Any, where: str, letters: Sequence[str], text_cells: bool) -> Question:
    """One row of a question file as a :class:`Question`, every field checked (``where`` names the row);
    ``letters``: the option columns ``A``, ``B``, ... of a file without a ``choices`` column."""
    if not isinstance(row, Mapping):
        raise InputError(f"{where}: a question is an object with 'question', 'choices' and 'answer', "
                         f"got {type(row).__name__}")
    question = _text(row.get("question"), "'question'", where)
    choices = _letter_choices(row, letters, where) if letters else _parse_choices(row.get("choices"), where)
    if not 2 <= len(choices) <= len(LETTERS):
        raise InputError(f"{where}: a question needs 2..{len(LETTERS)} choices, got {len(choices)}")
    answer = _parse_answer(row.get("answer"), len(choices), where, text_cells)
    subject = row.get("subject")
    if not (_missing(subject) or isinstance(subject, str)):
        raise InputError(f"{where}: 'subject' must be text, got {subject!r} ({type(subject).__name__})")
    try:
        return Question(question, choices, answer, "" if _missing(subject) else subject)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def file_questions(path: str | Path) -> list[Question]:
    """Read questions from a ``.jsonl``/``.json``/``.csv``/``.parquet`` file.

    Columns: ``question`` (non-empty text); ``choices`` (a list of non-empty texts, a JSON list in CSV) or
    one column per letter ``A``, ``B``, ...; ``answer``: the 0-based option index, an integer (in CSV, where
    every cell is text, its digits), or the option's letter; optional ``subject`` (text). Nothing is coerced:
    ``1.9``, ``true``, ``"1"`` in JSON, or a null ``question`` are refused with the row named.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no such question file: {str(path)!r}")
    if path.suffix not in (".jsonl", ".json", ".csv", ".parquet"):
        raise InputError(f"{path.name!r}: unsupported question file type; use one of "
                         f"['.csv', '.json', '.jsonl', '.parquet']")
    try:
        rows = _read_rows(path)
    except InputError:
        raise
    except (ValueError, OSError, UnicodeDecodeError) as e:  # pandas' parsers, decoding: truncated or malformed files
        raise InputError(f"{path.name!r} cannot be read as {path.suffix} ({type(e).__name__}: {e}); is it truncated "
                         f"or of another format?") from None
    columns = list(dict.fromkeys(k for _, r in rows if isinstance(r, Mapping) for k in r))
    letters = [] if "choices" in columns else [c for c in LETTERS if c in columns]
    missing = [c for c in ("question", "answer") if c not in columns]
    if "choices" not in columns and len(letters) < 2:
        missing.append("choices")
    if rows and missing:
        raise InputError(
            f"{path.name!r} lacks the column(s) {missing}; it has {columns}. A question file needs "
            f"'question', 'choices' (a list, or columns 'A', 'B', ...) and 'answer' (index or letter)"
        )
    out = [_row_question(r, where, letters, path.suffix == ".csv") for where, r in rows]
    if not out:
        raise InputError(f"{path.name!r} holds no questions")
    return out


CATEGORIES_FILE = Path(__file__).resolve().parent.parent / "data" / "categories.txt"


def categories() -> dict[str, tuple[str, ...]]:
    """The shipped word categories (``{"fruit": ("apple", ...), ...}``) that :func:`category_questions` draws on."""
    out: dict[str, tuple[str, ...]] = {}
    for line in CATEGORIES_FILE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, members = line.split(":", 1)
            out[name.strip()] = tuple(m.strip() for m in members.split(","))
    return out


def category_questions(n_samples: int = 64, seed: int = 0, n_choices: int = 4) -> list[Question]:
    """Knowledge questions ``"Which of these is a fruit?"`` whose options are one member of the category
    and members of ``n_choices - 1`` other categories (:func:`categories`), in random order. Answering
    needs what a language model knows about words, not the prompt's context: their cloze format is the
    knowledge twin of the letters format. Seeded, stable."""
    if n_samples < 1:
        raise InputError(f"n_samples must be >= 1, got {n_samples}")
    cats = categories()
    if not 2 <= n_choices <= min(len(LETTERS), len(cats)):
        raise InputError(f"n_choices must be in 2..{min(len(LETTERS), len(cats))}, got {n_choices}")
    names = sorted(cats)
    out = []
    for i in range(n_samples):
        rng = StableRng("mc-categories", seed, i)
        drawn = rng.sample(names, n_choices)
        options = [cats[c][rng.below(len(cats[c]))] for c in drawn]
        order = rng.shuffled(range(n_choices))
        article = "an" if drawn[0][0] in "aeiou" else "a"
        out.append(Question(f"Which of these is {article} {drawn[0]}?", tuple(options[k] for k in order),
                            order.index(0), drawn[0]))
    return out


def synthetic_questions(n_samples: int = 64, seed: int = 0, n_choices: int = 4) -> list[Question]:
    """Questions answerable from their own context, e.g. ``"The lamp belongs to the pilot. … Who owns
    the drum?"`` with the owners as options, shuffled independently of the facts. Seeded, stable."""
    if n_samples < 1:
        raise InputError(f"n_samples must be >= 1, got {n_samples}")
    if not 2 <= n_choices <= len(LETTERS):
        raise InputError(f"n_choices must be in 2..{len(LETTERS)}, got {n_choices}")
    words = word_list()
    out = []
    for i in range(n_samples):
        rng = StableRng("mc", seed, i)
        drawn = rng.sample(words, 2 * n_choices)
        things, owners = drawn[:n_choices], drawn[n_choices:]
        asked = rng.below(n_choices)
        facts = " ".join(f"The {t} belongs to the {o}." for t, o in zip(things, owners))
        order = rng.shuffled(range(n_choices))
        choices = tuple(owners[k] for k in order)
        out.append(Question(f"{facts}\nWho owns the {things[asked]}?", choices, order.index(asked), "synthetic"))
    return out
