"""The task knobs every experiment and command shares: :class:`TaskOptions` (KV dictionary lines, prompts, value
range, seed, template; multiple-choice questions, shots and form) and the tasks it builds.

An experiment's config extends it (``PruneConfig(TaskOptions)``, ...) with its own defaults, so
``prune(model, pairs=20)`` and ``gna prune --pairs 20`` name the same option; the command line reads it back
with one helper (``gna_interp.cli.task_options``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from gna_interp.options import Options, options
from gna_interp.tasks.kv import KVRetrieval
from gna_interp.tasks.mmlu import MultipleChoice, Question, questions_from

__all__ = ["TaskOptions"]


@options
class TaskOptions(Options):
    """What the tasks of a run are built from.

    Attributes:
        pairs: KV dictionary lines per prompt (None: chosen elsewhere, e.g. a circuit's or a calibration's).
        samples: prompts per task.
        max_value: KV values are ``0..max_value`` (None: chosen elsewhere).
        seed: the prompts' seed.
        template: KV template, ``official`` or ``completion`` (None: chosen elsewhere).
        questions: multiple-choice source: ``categories``, ``synthetic``, a local file or ``hub[:SUBJECT]``.
        shots: solved questions before each multiple-choice question.
        mc_form: multiple-choice prompt form, ``letters`` or ``stated`` (None: chosen elsewhere).
    """

    pairs: Any = 10
    samples: int = 32
    max_value: Any = 9
    seed: int = 0
    template: Any = "official"
    questions: str = "categories"
    shots: int = 3
    mc_form: Any = "letters"

    def task_options(self) -> "TaskOptions":
        """Only the task knobs (an experiment's config without its own options)."""
        return TaskOptions(**{n: getattr(self, n) for n in TaskOptions.field_names()})

    def kv(self, words: Sequence[str] | None, samples: int | None = None, seed: int | None = None) -> KVRetrieval:
        """The KV task: ``pairs`` lines, ``samples`` prompts (or the given number), seed ``seed`` (or the
        given one), ``template``, values ``0..max_value``, keys from ``words``."""
        return KVRetrieval(self.pairs, self.samples if samples is None else samples,
                           seed=self.seed if seed is None else seed, template=self.template,
                           max_value=self.max_value, words=words)

    @property
    def question_set(self) -> str:
        """The name of the question source in task names (a file's stem, ``hub-SUBJECT``, ``categories``)."""
        return Path(self.questions).stem if Path(self.questions).is_file() else self.questions.replace(":", "-")

    @property
    def generated(self) -> bool:
        """Whether the questions are generated (any seed gives a new set), not read from a file or the hub."""
        return self.questions in ("categories", "synthetic")

    def question_pool(self, samples: int | None = None,
                      seed: int | None = None) -> tuple[list[Question], list[Question]]:
        """``(questions, shots)`` of ``questions`` (:func:`~gna_interp.tasks.mmlu.questions_from`)."""
        return questions_from(self.questions, self.samples if samples is None else samples,
                              self.seed if seed is None else seed, self.shots)

    def multiple_choice(self, pool: tuple[list[Question], list[Question]], form: str) -> MultipleChoice:
        """The multiple-choice task on ``pool`` (:meth:`question_pool`) in ``form`` (``letters``, ``stated``,
        ``cloze``)."""
        questions, shots = pool
        return MultipleChoice(questions, format=form, name=self.question_set, shots=shots)  # type: ignore[arg-type]
