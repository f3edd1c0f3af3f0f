"""`choose_task(model)`: the task a discovery runs on, chosen once for every entry point.

``gna scan``, ``gna.discover(model)`` with no task, and the experiments that discover a circuit of their own all
call this, so a notebook gets the task form the command line gets. What it does, in order:

1. **the form**: the knobs named in :class:`TaskChoice` are kept as given; the others are chosen by measuring the
   intact model on ``calibrate`` prompts of each form of a small grid (:mod:`gna_interp.tasks.calibration`; KV:
   template official / completion, values 0-9 / 0-99, 10 pairs, 20 pairs only when no 10-pair form is solved
   below saturation; multiple choice: letters / stated). ``calibrate=0`` takes completion / 99 / 10 pairs / stated.
2. **the task** in that form, ``samples`` prompts, seed ``seed``;
3. **its knowledge twin**, a task needing knowledge but no retrieval, measured with the circuit removed: for KV the
   zero-shot :class:`~gna_interp.tasks.knowledge.Knowledge` facts (when the model's vocabulary can write them), for
   letter / stated multiple choice the cloze form of the same questions;
4. **the other formats** named in ``formats`` (KV templates with the task's values and pairs, multiple-choice
   forms on the same questions); a format equal to the task's own is dropped with a note.

:meth:`ChosenTask.reference` builds the second task of the same form (seed + 1) that mean / resample ablation reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gna_interp.errors import OptionError
from gna_interp.options import check_choice, check_int, check_pairs_fit, options
from gna_interp.tasks.base import Task
from gna_interp.tasks.calibration import Calibration
from gna_interp.tasks.kinds import KNOWLEDGE_SAMPLES, KV_UNCALIBRATED, format_kinds, task_kind, task_kinds
from gna_interp.constants import MAX_PAIRS, MAX_SAMPLES
from gna_interp.tasks.mmlu import QUESTION_SOURCES
from gna_interp.tasks.calibration import calibrate as measure_forms
from gna_interp.tasks.options import TaskOptions

__all__ = ["KNOWLEDGE_SAMPLES", "KV_UNCALIBRATED", "ChosenTask", "TaskChoice", "build_task",
           "calibrate", "check_knobs", "choose_task", "prompt_tokens"]


def check_knobs(opts: TaskOptions, kv: bool = True, questions: bool = False) -> None:
    """Refuse (:class:`OptionError`) task knobs of ``opts`` that no model could be given: ``samples`` outside
    ``1..MAX_SAMPLES``; with ``kv``, ``pairs`` outside ``2..MAX_PAIRS`` (None passes), ``max_value`` below 1 and
    fewer distinct values than pairs; with ``questions``, a question source that is neither generated, the hub
    nor a file of questions (the file is read). Reads no model and no network."""
    check_int("samples", opts.samples, 1)
    if opts.samples > MAX_SAMPLES:
        raise OptionError(f"samples must be at most {MAX_SAMPLES:,} (every prompt is built and tokenized before the "
                          f"first forward), got {opts.samples:,}")
    if kv:
        check_int("pairs", opts.pairs, 2, allow_none=True)
        check_int("max_value", opts.max_value, 1, allow_none=True)
        if opts.pairs is not None and opts.pairs > MAX_PAIRS:
            raise OptionError(f"pairs must be at most {MAX_PAIRS:,} (lines of one dictionary; the paper's largest is "
                              f"50), got {opts.pairs:,}")
        if opts.pairs is not None and opts.max_value is not None:
            check_pairs_fit(opts.pairs, opts.max_value)
    source = opts.questions
    if not questions or source in ("categories", "synthetic") or source == "hub" or source.startswith("hub:"):
        return
    if not Path(source).is_file():
        raise OptionError(f"unknown question source {source!r}: use one of {', '.join(QUESTION_SOURCES)} "
                          f"(FILE: an existing .jsonl/.json/.csv/.parquet file)")
    from gna_interp.tasks.mmlu import file_questions

    file_questions(source)  # a file that holds no questions (a wrong path, a truncated file) is refused here


@options
class TaskChoice(TaskOptions):
    """How :func:`choose_task` chooses (the task knobs of :class:`~gna_interp.tasks.options.TaskOptions` plus these).

    Attributes:
        kind: ``kv`` (KV retrieval), ``mc`` (multiple choice scored on the letters), ``cloze`` (on the texts) or
            another kind registered with :func:`~gna_interp.tasks.kinds.register_task_kind`.
        pairs, max_value, template: KV knobs; None: chosen by calibration.
        mc_form: multiple-choice form (``letters`` / ``stated``); None: chosen by calibration.
        samples: prompts of the task (24, as ``gna scan``).
        calibrate: prompts per form when calibrating; 0: no calibration (unnamed knobs take completion / 99 /
            10 pairs / stated).
        formats: other retrieval formats to build beside the task (``official``, ``completion``, ``stated``,
            ``letters``: the formats of the registered kinds, :func:`~gna_interp.tasks.kinds.format_kinds`).
        knowledge: build the task's knowledge twin.
        batch_size: sequences per forward while calibrating.
    """

    kind: str = "kv"
    pairs: Any = None
    samples: int = 24
    max_value: Any = None
    template: Any = None
    mc_form: Any = None
    calibrate: int = 16
    formats: tuple = ()
    knowledge: bool = True
    batch_size: int = 16

    def validate(self) -> None:
        check_choice("kind", self.kind, task_kinds())
        check_int("calibrate", self.calibrate, 0)
        check_int("batch_size", self.batch_size, 1)
        if self.template is not None:
            check_choice("template", self.template, ("official", "completion"))
        if self.mc_form is not None:
            check_choice("mc_form", self.mc_form, ("letters", "stated"))
        owners = format_kinds()
        bad = [f for f in self.formats if f not in owners]
        if isinstance(self.formats, str) or bad:
            raise OptionError(f"formats must be a tuple of {tuple(owners)}, got {self.formats!r}")
        check_knobs(self, questions=self.reads_questions)
        task_kind(self.kind).check(self)

    @property
    def reads_questions(self) -> bool:
        """Whether the task or one of its formats reads the multiple-choice question source (``questions``)."""
        owners = format_kinds()
        return task_kind(self.kind).questions or any(owners[f].questions for f in self.formats if f in owners)


@dataclass
class ChosenTask:
    """What :func:`choose_task` chose: the task, its knowledge twin (None when there is none), the other formats,
    the calibration (None when every knob was named or ``calibrate=0``), the form and the choice it came from, and
    notes (formats dropped, a twin that could not be built)."""

    task: Task
    twin: Task | None
    formats: tuple[Task, ...]
    calibration: Calibration | None
    form: dict[str, Any]
    choice: TaskChoice
    notes: list[str] = field(default_factory=list)

    def reference(self, model: Any) -> Task:
        """The same form with seed + 1: the prompts whose activations mean / resample ablation reads."""
        return build_task(model, self.choice, self.form, seed=self.choice.seed + 1)


def build_task(model: Any, choice: TaskChoice, form: dict[str, Any], seed: int | None = None,
               samples: int | None = None) -> Task:
    """The task of ``choice`` in ``form`` (``{"template", "max_value", "n_pairs"}`` or ``{"mc_form"}``), with
    ``samples`` prompts and seed ``seed`` (default: the choice's)."""
    seed = choice.seed if seed is None else seed
    opts = choice.task_options().replace(samples=samples or choice.samples, seed=seed)
    return task_kind(choice.kind).build(model, opts, form, seed == choice.seed)


def _calibrate_form(model: Any, choice: TaskChoice, progress: Callable[[str], None] | None
                    ) -> tuple[Calibration | None, dict[str, Any]]:
    """The calibration of the task form (None when every knob was named, ``calibrate=0`` or the kind has one form)
    and the form chosen."""
    named, forms, fallback = task_kind(choice.kind).forms(choice)
    if len(forms) == 1 or choice.calibrate == 0:
        return None, forms[0] if len(forms) == 1 else fallback
    n = min(choice.calibrate, choice.samples)
    say = progress or (lambda line: None)
    say(f"calibrating the task form: {len(forms)} forms on {n} prompts each at most (a harder form only while no "
        f"easier one is solved below saturation)")
    cal = measure_forms(model, forms, lambda f: build_task(model, choice, f, samples=n), named,
                        batch_size=choice.batch_size, progress=say, stage=lambda f: f.get("n_pairs", 0))
    say(f"  chosen: {cal.rows[cal.chosen].task} ({', '.join(f'{k}={v}' for k, v in cal.form.items())}); "
        f"{len(cal.rows)} of the {len(forms)} forms measured")
    return cal, cal.form


def calibrate(model: Any, choice: TaskChoice | None = None, progress: Callable[[str], None] | None = None,
              **overrides: Any) -> Calibration | None:
    """Measure the intact model on the grid of task forms :func:`choose_task` would choose from (``choice`` or
    keyword overrides of :class:`TaskChoice`: the knobs named are kept) and return the grid with the form chosen
    (``.form``, ``.rows``); None when nothing is left to choose (every knob named, ``calibrate=0``, cloze).
    ``progress`` receives a line per step."""
    from gna_interp.models.model import check_model
    check_model(model)
    return _calibrate_form(model, TaskChoice.build(choice, **overrides), progress)[0]


def _twin(model: Any, choice: TaskChoice, notes: list[str]) -> Task | None:
    """The knowledge twin of the task (see the module docstring), or None (with a note when it cannot be built)."""
    return task_kind(choice.kind).twin(model, choice, notes) if choice.knowledge else None


def _format_tasks(model: Any, choice: TaskChoice, form: dict[str, Any], notes: list[str]) -> tuple[Task, ...]:
    """The tasks of ``choice.formats`` beside the task of ``form``, each built by the kind that offers it; the
    task's own format is dropped with a note."""
    out = []
    own = task_kind(choice.kind)
    for f in choice.formats:
        owner = format_kinds()[f]
        if owner is own and f == own.own_format(form):
            notes.append(f"formats: {f} is the task's own {own.format_word}; not scanned twice")
            continue
        out.append(build_task(model, choice.replace(kind=owner.name), owner.format_form(f, form)))
    return tuple(out)


def choose_task(model: Any, choice: TaskChoice | None = None, progress: Callable[[str], None] | None = None,
                **overrides: Any) -> ChosenTask:
    """Choose the form (calibrating it where knobs are not named), then build the task, its knowledge twin and the
    other formats (the module docstring says how). ``choice`` is a :class:`TaskChoice`, or keyword overrides of
    its fields (``kind="mc"``, ``pairs=20``, ``formats=("official",)``, ...)."""
    from gna_interp.models.model import check_model
    check_model(model)
    choice = TaskChoice.build(choice, **overrides)
    cal, form = _calibrate_form(model, choice, progress)
    notes: list[str] = []
    task = build_task(model, choice, form)
    return ChosenTask(task, _twin(model, choice, notes), _format_tasks(model, choice, form, notes), cal, form,
                      choice, notes)


def prompt_tokens(model: Any, choice: TaskChoice | None = None, **overrides: Any) -> int:
    """Mean tokens per prompt of the task :func:`choose_task` builds without calibrating (unnamed knobs: completion,
    values 0-99, 10 pairs), counted with ``model``'s tokenizer: what a cost estimate assumes a prompt costs."""
    choice = TaskChoice.build(choice, **overrides)
    task = build_task(model, choice, task_kind(choice.kind).forms(choice)[2])
    lens = [len(model.tokenizer(s.prompt)["input_ids"]) for s in task.samples]
    return -(-sum(lens) // len(lens))
