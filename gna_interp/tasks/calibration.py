"""Choose the task form a model solves, by measurement, before discovering on it.

A circuit can only be read off a task the intact model solves: at chance there is nothing to remove,
and on a form the model barely beats chance a scan ranks noise and format heads. Forms differ a lot on
one model (SmolLM2-135M: KV official template, values 0-9, 0.40; completion template, values 0-99,
0.81; tokenizers differ: SmolLM2 splits numbers into digits, Llama-3 keeps 0-999 whole), so
:func:`calibrate` evaluates the intact model on a small grid of forms, on a few prompts each, and
picks one with headroom by this rule (:func:`choose`):

- a form is *solved* when its accuracy clears chance by the margin of :func:`chance_margin`
  (two standard errors, at least 0.05), and *saturated* at ``saturated`` (0.95) or more;
- the chosen form is the solved one with the highest accuracy; saturated forms count as equally accurate
  and the hardest of them (the longest prompts) is taken, as it leaves ablations the most room; other ties
  go to the shorter prompts (the cheaper scan); when no form is solved, the most accurate (the chance
  check then refuses it);
- harder dictionaries (more pairs) are measured only when no form measured so far is solved below
  saturation (:func:`calibrate`'s ``stage``): a model does not do better with more lines to choose from.

A 16-prompt estimate is coarse (one prompt is 0.06): a form the model solves at 0.85 reads 16/16 about
one time in eight, which is why saturation never demotes a form below a less accurate one.

Knobs the user names are never replaced: the grid only varies the others (:func:`kv_forms`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from gna_interp.constants import CALIBRATION_JSON
from gna_interp.errors import InputError
from gna_interp.options import Options, check_int, options
from gna_interp.results import Result
from gna_interp.tasks.base import Task
from gna_interp.tasks.evaluation import evaluate

__all__ = ["CalibrateOptions", "Calibration", "ChanceVerdict", "FormResult", "KV_GRID", "SATURATED", "calibrate", "chance_margin", "choose",
           "kv_forms"]

SATURATED = 0.95
# The KV grid: template x value range x dictionary size (forms needing more distinct values than the range
# holds are skipped). Measured on SmolLM2 (docs/discovery.md §6): the completion template with values 0-99
# is the form it solves, the official one with values 0-9 the one it barely does.
KV_GRID: dict[str, tuple[Any, ...]] = {"template": ("official", "completion"), "max_value": (9, 99),
                                       "n_pairs": (10, 20)}


def chance_margin(chance: float, n: int) -> float:
    """How far above ``chance`` an accuracy on ``n`` samples must be to count as solving the task: two
    standard errors of a guesser's accuracy, at least 0.05."""
    return max(0.05, 2 * math.sqrt(chance * (1 - chance) / max(n, 1)))


@dataclass(frozen=True)
class ChanceVerdict:
    """Whether the intact model's ``accuracy`` on task ``task`` (``n`` samples, guessing accuracy ``chance``) clears
    chance: :attr:`near_chance` when it is within :attr:`margin` (:func:`chance_margin`) of it. The one chance
    check of discovery, calibration and every experiment; each decides what a verdict near chance means (refuse,
    leave the task out, or note it)."""

    task: str
    accuracy: float
    chance: float
    n: int

    @classmethod
    def of(cls, task: Task, accuracy: float) -> "ChanceVerdict":
        """The verdict of an ``accuracy`` measured on ``task`` (all of its samples)."""
        return cls(task.name, float(accuracy), float(task.chance), len(task))

    @classmethod
    def measure(cls, model: Any, task: Task, batch_size: int = 16) -> "ChanceVerdict":
        """Evaluate the intact ``model`` on ``task`` and give the verdict."""
        return cls.of(task, evaluate(model, task, batch_size=batch_size, progress=False).accuracy)

    @property
    def margin(self) -> float:
        """How far above chance an accuracy on ``n`` samples must be (:func:`chance_margin`)."""
        return chance_margin(self.chance, self.n)

    @property
    def near_chance(self) -> bool:
        """The accuracy is at most ``chance + margin``: the model does not solve the task."""
        return self.accuracy <= self.chance + self.margin

    def line(self, near: str | None = None) -> str:
        """``intact model: accuracy A on TASK (N samples), chance C, margin M``; near chance and given ``near``
        (what it means for the result), `` -- NEAR CHANCE: near`` appended."""
        text = (f"intact model: accuracy {self.accuracy:.3f} on {self.task} ({self.n} samples), chance "
                f"{self.chance:.3f}, margin {self.margin:.3f}")
        return text + (f" -- NEAR CHANCE: {near}" if near is not None and self.near_chance else "")


@dataclass(frozen=True)
class FormResult:
    """One form of the grid, measured: its knobs, the task's name, accuracy, chance, samples, mean prompt
    tokens and the verdict (``chosen``, ``solved``, ``saturated`` or ``at chance``)."""

    form: dict[str, Any]
    task: str
    accuracy: float
    chance: float
    n_samples: int
    tokens: float
    verdict: str = ""

    @property
    def solved(self) -> bool:
        """The intact model clears chance on this form (:class:`ChanceVerdict`)."""
        return not ChanceVerdict(self.task, self.accuracy, self.chance, self.n_samples).near_chance

    def to_dict(self) -> dict[str, Any]:
        return {"form": dict(self.form), "task": self.task, "accuracy": self.accuracy, "chance": self.chance,
                "n_samples": self.n_samples, "tokens": self.tokens, "verdict": self.verdict}


@dataclass
class Calibration(Result):
    """What :func:`calibrate` measured and chose: ``rows`` (one :class:`FormResult` a form, in grid order),
    ``chosen`` (its index), the knobs the user ``named`` (held fixed), ``saturated``, ``seconds`` and the
    harder forms ``skipped`` because an easier one had headroom. Saves to one ``calibration`` JSON file
    (:meth:`save` / :meth:`load`, a folder's ``calibration.json``) and tabulates its forms (:meth:`to_frame`)."""

    rows: list[FormResult]
    chosen: int
    named: dict[str, Any] = field(default_factory=dict)
    saturated: float = SATURATED
    seconds: float = 0.0
    skipped: list[dict[str, Any]] = field(default_factory=list)

    FORMAT = "calibration"
    FILE = CALIBRATION_JSON

    @property
    def form(self) -> dict[str, Any]:
        """The chosen form's knobs."""
        return dict(self.rows[self.chosen].form)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (``circuit.json``'s ``calibration``); :meth:`from_dict` reads it back."""
        return {"rows": [r.to_dict() for r in self.rows], "chosen": self.chosen, "named": dict(self.named),
                "saturated": self.saturated, "seconds": round(self.seconds, 2),
                "skipped": [dict(f) for f in self.skipped]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Calibration":
        """The calibration :meth:`to_dict` described; :class:`InputError` for a malformed record or a choice or
        accuracy out of range."""
        try:
            rows = [FormResult(dict(r["form"]), str(r["task"]), float(r["accuracy"]), float(r["chance"]),
                               int(r["n_samples"]), float(r["tokens"]), str(r.get("verdict", ""))) for r in d["rows"]]
            chosen = int(d["chosen"])
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"malformed calibration record ({type(e).__name__}: {e}); rerun `gna scan`") from None
        if not 0 <= chosen < len(rows):
            raise InputError(f"calibration record chooses form {chosen} of {len(rows)}; rerun `gna scan`")
        for i, r in enumerate(rows):
            for name in ("accuracy", "chance"):
                value = getattr(r, name)
                if not 0 <= value <= 1:  # NaN included
                    raise InputError(f"calibration record: field 'rows/{i}/{name}' is {value!r}, not in [0, 1]; "
                                     f"rerun `gna scan`")
        return cls(rows, chosen, dict(d.get("named") or {}), float(d.get("saturated", SATURATED)),
                   float(d.get("seconds") or 0.0), [dict(f) for f in d.get("skipped") or []])

    def to_frame(self) -> pd.DataFrame:
        """One row a form, in grid order: ``form`` (its index), its knobs, ``task``, ``accuracy``, ``chance``,
        ``n_samples``, ``tokens`` (mean prompt tokens), ``verdict`` and ``chosen``."""
        keys = list(dict.fromkeys(k for r in self.rows for k in r.form))
        return pd.DataFrame([{"form": i, **{k: r.form.get(k) for k in keys}, "task": r.task, "accuracy": r.accuracy,
                              "chance": r.chance, "n_samples": r.n_samples, "tokens": r.tokens, "verdict": r.verdict,
                              "chosen": i == self.chosen} for i, r in enumerate(self.rows)],
                            columns=["form", *keys, "task", "accuracy", "chance", "n_samples", "tokens", "verdict",
                                     "chosen"])

    def lines(self) -> list[str]:
        """A Markdown table of the grid with the choice marked, and one sentence on the rule."""
        keys = list(dict.fromkeys(k for r in self.rows for k in r.form))
        out = ["| " + " | ".join(keys) + " | task | accuracy | chance | prompt tokens | verdict |",
               "|" + "---|" * len(keys) + "---|---:|---:|---:|---|"]
        for r in self.rows:
            mark = "**" if r.verdict == "chosen" else ""
            out.append("| " + " | ".join(str(r.form.get(k, "")) for k in keys) +
                       f" | {r.task} | {mark}{r.accuracy:.3f}{mark} | {r.chance:.3f} | {r.tokens:.0f} | {r.verdict} |")
        return out + [""] + [f"- {t}" for t in self.sentences()]

    def sentences(self) -> list[str]:
        """What was chosen and by which rule; which harder forms were not measured."""
        fixed = (", ".join(f"{k}={v}" for k, v in self.named.items()) + " named, so held fixed; ") if self.named else ""
        c = self.rows[self.chosen]
        out = [f"task form chosen by measurement ({fixed}{len(self.rows)} forms on {c.n_samples} prompts each, "
                   f"{self.seconds:.0f} s): {c.task} ({', '.join(f'{k}={v}' for k, v in c.form.items())}), "
                   f"accuracy {c.accuracy:.3f}; rule: the most accurate form that clears chance by two standard "
                   f"errors, forms at {self.saturated:.2f} or more counting as equal (saturated: the hardest is taken)"]
        if self.skipped:
            out.append(f"not measured (a form above is solved below saturation, so the rule would not pick a harder one): "
                       + "; ".join(", ".join(f"{k}={v}" for k, v in f.items()) for f in self.skipped))
        return out

    def __repr__(self) -> str:
        c = self.rows[self.chosen] if 0 <= self.chosen < len(self.rows) else None
        if c is None:
            return f"Calibration({len(self.rows)} forms, none chosen)"
        return (f"Calibration({len(self.rows)} forms, chosen {c.task!r} ("
                f"{', '.join(f'{k}={v}' for k, v in c.form.items())}): accuracy {c.accuracy:.3f}, chance "
                f"{c.chance:.3f}, {c.n_samples} prompts each"
                + (f", {len(self.skipped)} harder forms not measured" if self.skipped else "") + ")")

    def _repr_html_(self) -> str:
        """Jupyter's display: the grid, one row a form, the chosen one marked; the rule and what was skipped."""
        from gna_interp import html_repr

        keys = list(dict.fromkeys(k for r in self.rows for k in r.form))
        rows = [[("▶ " if i == self.chosen else "") + str(i)] + [r.form.get(k, "") for k in keys]
                + [r.task, html_repr.fmt(r.accuracy), html_repr.fmt(r.chance), html_repr.fmt(r.tokens, 0), r.n_samples,
                   r.verdict or ("chosen" if i == self.chosen else "")] for i, r in enumerate(self.rows)]
        styles = ["font-weight:bold;background:#e8f4e8" if i == self.chosen else "" for i in range(len(self.rows))]
        parts = [html_repr.title("Calibration", f"{len(self.rows)} task forms measured, form {self.chosen} chosen"),
                 html_repr.table(["form", *keys, "task", "accuracy", "chance", "prompt tokens", "prompts", "verdict"],
                             rows, styles)]
        if 0 <= self.chosen < len(self.rows):
            parts.append(html_repr.bullets(self.sentences()))
        return html_repr.block(parts)


def choose(rows: Sequence[FormResult], saturated: float = SATURATED) -> int:
    """The index of the form to discover on (the rule of the module docstring)."""
    if not rows:
        raise InputError("no task forms to choose from")
    solved = [i for i, r in enumerate(rows) if r.solved]
    if not solved:
        return max(range(len(rows)), key=lambda i: (rows[i].accuracy, -i))

    def key(i: int) -> tuple[float, float, int]:
        r = rows[i]
        full = r.accuracy >= saturated  # saturated forms tie; the hardest of them leaves ablations most room
        return min(r.accuracy, saturated), r.tokens if full else -r.tokens, -i

    return max(solved, key=key)


def kv_forms(named: Mapping[str, Any] | None = None, grid: Mapping[str, Sequence[Any]] = KV_GRID,
             ) -> list[dict[str, Any]]:
    """The KV forms to try: the product of ``grid``'s axes, each axis the user ``named`` (not None) replaced
    by that one value; forms with more pairs than distinct values are dropped."""
    named = {k: v for k, v in (named or {}).items() if v is not None}
    unknown = sorted(set(named) - set(grid))
    if unknown:
        raise InputError(f"unknown KV knobs {unknown}; the grid varies {sorted(grid)}")
    axes = {k: (named[k],) if k in named else tuple(v) for k, v in grid.items()}
    forms: list[dict[str, Any]] = [{}]
    for key, values in axes.items():
        forms = [{**f, key: v} for f in forms for v in values]
    ok = [f for f in forms if f["n_pairs"] <= f["max_value"] + 1]
    if not ok:
        raise InputError(f"no KV form fits the named knobs {named}: every line needs its own value, so n_pairs "
                         f"must be at most max_value + 1 (the knobs not named take max_value up to "
                         f"{max(grid['max_value'])} and n_pairs from {min(grid['n_pairs'])})")
    return ok


@options
class CalibrateOptions(Options):
    """How :func:`calibrate` measures the forms.

    Attributes:
        batch_size: prompts a forward.
        saturated: the accuracy from which a form leaves no headroom (:func:`choose`).
        progress: receives one line a form (None: nothing).
        stage: ``form -> key`` ordering the forms from easy to hard (e.g. the dictionary size; None: one stage).
    """

    batch_size: int = 16
    saturated: float = SATURATED
    progress: Callable[[str], None] | None = None
    stage: Callable[[dict[str, Any]], Any] | None = None

    def validate(self) -> None:
        check_int("batch_size", self.batch_size, 1)


def calibrate(model: Any, forms: Sequence[dict[str, Any]], build: Callable[[dict[str, Any]], Task],
              named: Mapping[str, Any] | None = None, config: CalibrateOptions | None = None,
              **overrides: Any) -> Calibration:
    """Evaluate the intact ``model`` on the task ``build(form)`` of the forms and choose one (:func:`choose`).

    ``build`` makes the (small) task of a form; ``named`` records the knobs the user fixed; ``config``
    (:class:`CalibrateOptions`) or keyword ``overrides`` of its fields: ``batch_size``, ``saturated``,
    ``progress`` (receives one line a form) and ``stage`` (e.g. the dictionary size), which orders the forms from
    easy to hard: the forms of a harder stage are measured only when no form measured so far has headroom (solved
    and below ``saturated``), since the rule would not choose them (:attr:`Calibration.skipped` lists them)."""
    cfg = CalibrateOptions.build(config, **overrides)
    batch_size, saturated, progress, stage = cfg.batch_size, cfg.saturated, cfg.progress, cfg.stage
    start = time.perf_counter()
    key = stage or (lambda f: 0)
    stages = sorted({key(f) for f in forms})
    rows: list[FormResult] = []
    skipped: list[dict[str, Any]] = []
    for s in stages:
        if any(r.solved and r.accuracy < saturated for r in rows):
            skipped += [dict(f) for f in forms if key(f) == s]
            continue
        rows += _measure(model, [f for f in forms if key(f) == s], build, batch_size, progress)
    i = choose(rows, saturated)
    verdicts = ["chosen" if j == i else "saturated" if r.solved and r.accuracy >= saturated else
                "solved" if r.solved else "at chance" for j, r in enumerate(rows)]
    rows = [FormResult(r.form, r.task, r.accuracy, r.chance, r.n_samples, r.tokens, v) for r, v in zip(rows, verdicts)]
    return Calibration(rows, i, {k: v for k, v in (named or {}).items() if v is not None}, saturated,
                       time.perf_counter() - start, skipped)


def _measure(model: Any, forms: Sequence[dict[str, Any]], build: Callable[[dict[str, Any]], Task], batch_size: int,
             progress: Callable[[str], None] | None) -> list[FormResult]:
    rows = []
    for form in forms:
        task = build(form)
        acc = evaluate(model, task, batch_size=batch_size, progress=False).accuracy
        tokens = sum(len(model.tokenizer(p)["input_ids"]) for p in task.prompts) / len(task)
        rows.append(FormResult(dict(form), task.name, float(acc), float(task.chance), len(task), float(tokens)))
        if progress is not None:
            progress(f"  {task.name} ({', '.join(f'{k}={v}' for k, v in form.items())}): accuracy {acc:.3f} "
                     f"(chance {task.chance:.3f})")
    return rows
