"""The registry of task kinds: one :class:`TaskKind` per kind of task that :func:`~gna_interp.tasks.choice.choose_task`
builds (``kv``, ``mc``, ``cloze``; more with :func:`register_task_kind`).

A kind holds everything kind-specific about choosing a task: the knobs it checks, the forms it calibrates over, how
it builds the task of one form, its knowledge twin and the retrieval formats it offers to other tasks (the
``formats`` knob). :mod:`~gna_interp.tasks.choice` asks the kind and never compares a kind to a string.
"""

from __future__ import annotations

from typing import Any

from gna_interp.errors import InputError, OptionError
from gna_interp.registry import Registry
from gna_interp.tasks.base import Task
from gna_interp.tasks.calibration import kv_forms
from gna_interp.tasks.options import TaskOptions

__all__ = ["KNOWLEDGE_SAMPLES", "KV_UNCALIBRATED", "TaskKind", "format_kinds", "register_task_kind",
           "task_kind", "task_kinds", "unregister_task_kind"]

KV_UNCALIBRATED: dict[str, Any] = {"template": "completion", "max_value": 99, "n_pairs": 10}  # SmolLM2's choice
KNOWLEDGE_SAMPLES = 32


class TaskKind:
    """One kind of task :func:`~gna_interp.tasks.choice.choose_task` can build; subclass it and register an instance.

    A subclass sets :attr:`name` and implements :meth:`build`; the other methods have defaults for a kind with
    nothing to calibrate, no knowledge twin and no formats of its own.

    Attributes:
        name: the ``kind`` knob's value (lower case).
        questions: the kind reads the multiple-choice question source (``questions``), which is then checked.
        formats: retrieval formats this kind builds for other tasks (values of the ``formats`` knob).
        format_word: what a format is to this kind, in notes (``template`` for KV).
    """

    name: str = ""
    questions: bool = False
    formats: tuple[str, ...] = ()
    format_word: str = "form"

    def check(self, choice: Any) -> None:
        """Refuse (:class:`OptionError`) knobs of ``choice`` (a ``TaskChoice``) no form of this kind can take."""

    def build(self, model: Any, options: TaskOptions, form: dict[str, Any], first_seed: bool) -> Task:
        """The task in ``form`` from ``options`` (samples and seed already set). ``first_seed`` is False when a
        second set of prompts (the reference of mean / resample ablation) is asked for."""
        raise NotImplementedError(f"task kind {self.name!r} does not build tasks")

    def forms(self, choice: Any) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        """``(named knobs, forms to measure, the form taken without calibration)``; one form: nothing to
        calibrate."""
        return {}, [{}], {}

    def twin(self, model: Any, choice: Any, notes: list[str]) -> Task | None:
        """The task's knowledge twin (needs knowledge, not retrieval), or None with a note saying why."""
        return None

    def own_format(self, form: dict[str, Any]) -> str | None:
        """The format of ``formats`` that ``form`` already is (not built twice)."""
        return None

    def format_form(self, fmt: str, form: dict[str, Any]) -> dict[str, Any]:
        """The form of this kind's format ``fmt``, built beside a task of form ``form`` (of any kind)."""
        raise NotImplementedError(f"task kind {self.name!r} offers no formats")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class KVKind(TaskKind):
    """KV retrieval (:class:`~gna_interp.tasks.kv.KVRetrieval`): template, value range and pairs calibrated; the
    zero-shot :class:`~gna_interp.tasks.knowledge.Knowledge` facts as its twin."""

    name = "kv"
    formats = ("official", "completion")
    format_word = "template"

    def check(self, choice: Any) -> None:
        try:  # the knobs left unnamed are chosen from a grid: some form of it must fit the named ones
            kv_forms({"template": choice.template, "max_value": choice.max_value, "n_pairs": choice.pairs})
        except InputError as e:
            raise OptionError(str(e)) from None

    def build(self, model: Any, options: TaskOptions, form: dict[str, Any], first_seed: bool) -> Task:
        return options.replace(pairs=form["n_pairs"], template=form["template"],
                               max_value=form["max_value"]).kv(getattr(model, "kv_words", None))

    def forms(self, choice: Any) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        named = {"template": choice.template, "max_value": choice.max_value, "n_pairs": choice.pairs}
        fallback = {k: named[k] if named[k] is not None else v for k, v in KV_UNCALIBRATED.items()}
        return named, kv_forms(named), fallback

    def twin(self, model: Any, choice: Any, notes: list[str]) -> Task | None:
        from gna_interp.tasks.knowledge import Knowledge

        twin = Knowledge(n_samples=KNOWLEDGE_SAMPLES, seed=choice.seed)
        try:
            model.tokenize(twin.prompts)
        except InputError:
            notes.append(f"no knowledge control: {model.name}'s vocabulary cannot write the facts of the zero-shot "
                         f"knowledge task")
            return None
        return twin

    def own_format(self, form: dict[str, Any]) -> str | None:
        return form.get("template")

    def format_form(self, fmt: str, form: dict[str, Any]) -> dict[str, Any]:
        return {**{k: form.get(k, v) for k, v in KV_UNCALIBRATED.items()}, "template": fmt}


class ClozeKind(TaskKind):
    """Multiple choice scored on the option texts (:class:`~gna_interp.tasks.mmlu.MultipleChoice`, ``cloze``):
    nothing to calibrate, no twin (it is the twin of ``mc``)."""

    name = "cloze"
    questions = True

    def build(self, model: Any, options: TaskOptions, form: dict[str, Any], first_seed: bool) -> Task:
        if not first_seed and not options.generated:
            raise InputError(f"a second set of questions (seed {options.seed}) is needed, which "
                             f"questions={options.questions!r} does not generate; use zero ablation or "
                             f"questions='categories' / 'synthetic'")
        return options.multiple_choice(options.question_pool(), self._form(form))

    def _form(self, form: dict[str, Any]) -> str:
        return "cloze"


class MCKind(ClozeKind):
    """Multiple choice scored on the letters (``letters`` or ``stated`` form, calibrated); the cloze form of the
    same questions as its twin."""

    name = "mc"
    formats = ("stated", "letters")

    def _form(self, form: dict[str, Any]) -> str:
        return form["mc_form"]

    def forms(self, choice: Any) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        forms = [{"mc_form": f} for f in ((choice.mc_form,) if choice.mc_form else ("letters", "stated"))]
        return {"mc_form": choice.mc_form}, forms, {"mc_form": choice.mc_form or "stated"}

    def twin(self, model: Any, choice: Any, notes: list[str]) -> Task | None:
        try:
            return ClozeKind().build(model, choice.task_options().replace(samples=choice.samples), {}, True)
        except InputError as e:  # e.g. a question repeating an option text, which cloze cannot score
            notes.append(f"no knowledge twin (the cloze form of these questions cannot be scored: {e})")
            return None

    def own_format(self, form: dict[str, Any]) -> str | None:
        return form.get("mc_form")

    def format_form(self, fmt: str, form: dict[str, Any]) -> dict[str, Any]:
        return {"mc_form": fmt}


_REGISTRY: Registry[TaskKind] = Registry("task kind", OptionError)


def register_task_kind(kind: TaskKind) -> TaskKind:
    """Make a task kind known to :func:`~gna_interp.tasks.choice.choose_task` (the ``kind`` knob); returns it.

    A name or a format already taken is refused (:class:`OptionError`).
    """
    name = getattr(kind, "name", None)
    owners = format_kinds()
    taken = sorted(f for f in kind.formats if f in owners and owners[f].name != name)
    if taken:
        raise OptionError(f"task kind {name!r} offers format(s) {taken}, already offered by "
                          f"{sorted({owners[f].name for f in taken})}")
    return _REGISTRY.add(name, kind)


# The registry's own methods, under the task kinds' names: forget a kind, the kinds' names in registration order,
# one kind by name (an OptionError naming the registered ones for an unknown name).
unregister_task_kind = _REGISTRY.remove
task_kinds = _REGISTRY.names
task_kind = _REGISTRY.get


def format_kinds() -> dict[str, TaskKind]:
    """``{format: the kind that builds it}`` over the registered kinds (the values of the ``formats`` knob)."""
    return {f: k for k in _REGISTRY.entries() for f in k.formats}


for _kind in (KVKind(), MCKind(), ClozeKind()):
    register_task_kind(_kind)
