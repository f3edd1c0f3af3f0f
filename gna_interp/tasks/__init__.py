"""Tasks that G&A discovery runs on, segment annotation, and their evaluation through the plan engine.

The task interface (what circuit code consumes)
------------------------------------------------
A :class:`Task` is a ``name`` plus an immutable tuple of :class:`Sample`; it is built without a model,
so the same seed gives the same prompts everywhere. A :class:`Sample` holds:

- ``prompt`` -- the text; the scored prediction is the one made at its last token;
- ``candidates`` -- the continuations to compare (``" 42"``, ``" B"``), ``gold`` -- the right one's index;
- ``spans`` -- tokenizer-free character spans of the prompt's lines/options and of its query;
- ``cue_start`` -- where the answer cue begins (what a chat template leaves in the reply);
- ``meta`` -- task facts (key, value, depth, subject, ...), copied into result tables.

``sample.segments(tokenizer)`` / ``task.segments(tokenizer)`` map the spans onto token positions
(:class:`Segments`): ``items[i]`` (a :class:`Span`, with ``.summary`` = last token, e.g. the newline),
``query``, ``final``. For KV retrieval and letter-format multiple choice, ``candidates[i]`` belongs to
``items[i]``, so the Aggregate head's target is ``items[gold].summary`` seen from ``final``.

Scoring: :func:`evaluate` scores every candidate by the summed log-prob of its tokens (the official scorer) through
the plan engine (:mod:`gna_interp.engine`: :func:`~gna_interp.engine.plan_scoring` once +
:func:`~gna_interp.engine.run_plan` many times, e.g. under ablation hooks), from batched forwards rather than one per
candidate. Results are :class:`~gna_interp.engine.CandidateScores` (accuracy, logit difference gold minus best other,
gold probability, a per-sample DataFrame).

Tasks: :class:`KVRetrieval` (official and completion templates), :class:`MultipleChoice` (MMLU format;
letters or cloze; hub, local file or synthetic questions; optional chat template); controls that need no
in-context retrieval: :class:`Knowledge` (zero-shot completions of well-known facts, scored over answers
of the same kind) and :class:`NeutralText` (plain-text LM loss).

Kinds: :func:`~gna_interp.tasks.choice.choose_task` builds the task of a registered :class:`TaskKind` (``kv``,
``mc``, ``cloze``; more with :func:`register_task_kind`).

Saving: ``task.to_dict()`` is strict-JSON data (``format_version``, ``kind`` and the constructor
arguments, the questions, or the samples); :func:`task_from_dict` rebuilds the same samples in
another process, e.g. to re-evaluate a saved circuit on its own task.
"""

from gna_interp.tasks.base import Task
from gna_interp.tasks.evaluation import Evaluation, evaluate
from gna_interp.tasks.io import task_from_dict
from gna_interp.tasks.kinds import TaskKind, register_task_kind, task_kinds, unregister_task_kind
from gna_interp.tasks.knowledge import Fact, Knowledge, fact_categories, facts
from gna_interp.tasks.kv import PAPER_SIZES, KVRetrieval
from gna_interp.tasks.mmlu import MultipleChoice, Question, file_questions, hub_questions, synthetic_questions
from gna_interp.tasks.sample import Sample
from gna_interp.tasks.segments import CharSegments, Segments, Span, TextBuilder, annotate
from gna_interp.tasks.text import NeutralText, lm_loss
from gna_interp.tasks.words import word_list

__all__ = ["PAPER_SIZES", "CharSegments", "Evaluation", "Fact", "KVRetrieval", "Knowledge", "MultipleChoice", "NeutralText",
           "Question", "Sample", "Segments", "Span", "Task", "TaskKind", "TextBuilder", "annotate", "evaluate",
           "fact_categories", "facts", "file_questions", "hub_questions", "lm_loss", "register_task_kind",
           "synthetic_questions", "task_from_dict", "task_kinds", "unregister_task_kind", "word_list"]
