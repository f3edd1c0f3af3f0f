"""A live explorer for Jupyter: pick heads, remove them, watch the task's numbers and patterns change.

The one figure of :mod:`gna_interp.viz` that runs a model: each "remove" scores the task with the chosen
heads removed through :class:`~gna_interp.engine.replay.SetAblation` (the clean prefix is captured once,
so a removal re-runs only the later blocks) and reads the chosen heads' patterns on one prompt with
:func:`~gna_interp.mixing.patterns`. The numbers equal ``evaluate`` under ``ablate`` to float noise.

The Python side is :class:`Explorer` (``select``, ``set_method``, ``set_sample``, ``apply``, ``restore``,
``state``); :func:`explore` returns its ipywidgets widget, which shows itself in Jupyter and Voila.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import torch

from gna_interp.engine.replay import SetAblation
from gna_interp.errors import InputError
from gna_interp.mixing import patterns
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model, check_model
from gna_interp.tasks.base import Task
from gna_interp.engine.plan import CandidateScores
from gna_interp.viz.attention import attention_heads
from gna_interp.viz.html import part, render

__all__ = ["Explorer", "explore"]

METHODS = ("zero", "mean")


def _fmt(x: float) -> str:
    return f"{x:.4f}"


class Explorer:
    """Python side of :func:`explore`; every control calls one of these methods, so tests can drive it directly.

    ``heads`` limits the list to those heads (default: the model's :meth:`~Model.default_heads`).
    ``method`` is ``"zero"`` or ``"mean"`` (the mean over the task's own prompts). ``state`` holds the
    numbers the widget shows.
    """

    def __init__(self, model: Model, task: Task, heads: Sequence[HeadRef | str] | None = None,
                 method: str = "zero", sample: int = 0) -> None:
        if not isinstance(task, Task):
            raise InputError(f"explore needs a Task (e.g. KVRetrieval(...)), got {type(task).__name__}")
        self.model, self.task = model, task
        self.heads: list[HeadRef] = model.check_heads(list(heads)) if heads else model.default_heads()
        self._ablations: dict[str, SetAblation] = {}
        self.selected: list[HeadRef] = []
        self.method = self._check_method(method)
        self.sample = self._check_sample(sample)
        self.removed: list[HeadRef] = []
        self.state: dict[str, Any] = {}
        self._widget: Any = None
        self._refresh()

    # ---- Python side -------------------------------------------------------------------------------------------
    def _check_method(self, method: str) -> str:
        if method not in METHODS:
            raise InputError(f"method must be one of {METHODS}, got {method!r}")
        return method

    def _check_sample(self, sample: int) -> int:
        """``sample`` as the index of one of the task's prompts: an integer (an integral number such as ``2.0`` is
        taken; ``1.7``, NaN or a bool is refused) in ``0..n-1``."""
        n = len(self.task.samples)
        if isinstance(sample, bool) or not isinstance(sample, numbers.Real) or not (
                isinstance(sample, numbers.Integral) or (math.isfinite(sample) and float(sample).is_integer())):
            raise InputError(f"sample must be the index of a prompt (an integer in 0..{n - 1}), got {sample!r}")
        if not 0 <= int(sample) < n:
            raise InputError(f"sample must be in 0..{n - 1}, got {sample}")
        return int(sample)

    def ablation(self, method: str | None = None) -> SetAblation:
        """The :class:`SetAblation` of ``method`` (built once per method)."""
        method = self._check_method(method or self.method)
        if method not in self._ablations:
            reference = None if method == "zero" else self.task
            self._ablations[method] = SetAblation(self.model, self.task, method, reference)
        return self._ablations[method]

    def select(self, heads: Sequence[HeadRef | str]) -> "Explorer":
        """Choose the heads the next :meth:`apply` removes (and whose patterns it shows)."""
        chosen = self.model.check_heads(list(heads)) if heads else []
        self.selected = list(dict.fromkeys(chosen))
        if self._widget is not None:
            self._list.value = tuple(h.name for h in self.selected if h.name in self._list.options)
        return self

    def set_method(self, method: str) -> "Explorer":
        self.method = self._check_method(method)
        if self._widget is not None and self._method.value != method:
            self._method.value = method
        return self

    def set_sample(self, sample: int) -> "Explorer":
        """Choose the prompt whose candidate distribution and patterns are shown."""
        self.sample = self._check_sample(sample)
        if self._widget is not None and self._sample.value != self.sample:
            self._sample.value = self.sample
        self._refresh()
        return self

    def apply(self) -> dict[str, Any]:
        """Remove the selected heads (together, with the current method) and update ``state`` and the widget."""
        self.removed = list(self.selected)
        self._refresh()
        return self.state

    def restore(self) -> dict[str, Any]:
        """Put every head back (the intact model's numbers)."""
        self.removed = []
        self._refresh()
        return self.state

    def _refresh(self) -> None:
        abl = self.ablation()
        scores: CandidateScores = abl.run(self.removed)
        clean = abl.clean()
        m, c = scores.metrics, clean.metrics
        i = self.sample
        s = self.task.samples[i]
        n_c = len(s.candidates)
        probs = torch.softmax(scores.scores[i, :n_c].float(), -1).tolist()
        clean_probs = torch.softmax(clean.scores[i, :n_c].float(), -1).tolist()
        self.state = {"removed": [h.name for h in self.removed], "method": self.method,
                      "accuracy": m["accuracy"], "logit_diff": m["logit_diff"],
                      "clean_accuracy": c["accuracy"], "clean_logit_diff": c["logit_diff"],
                      "n_samples": m["n_samples"], "sample": i, "prompt": s.prompt,
                      "candidates": list(s.candidates), "gold": s.gold, "probs": probs, "clean_probs": clean_probs,
                      "pattern_heads": [h.name for h in self.removed]}
        if self._widget is not None:
            self._render()

    # ---- widget ------------------------------------------------------------------------------------------------
    @property
    def widget(self) -> Any:
        """The ipywidgets widget (built on first use)."""
        if self._widget is None:
            self._build()
        return self._widget

    def _build(self) -> None:
        import ipywidgets as w

        names = [h.name for h in self.heads]
        self._list = w.SelectMultiple(options=names, value=tuple(h.name for h in self.selected if h.name in names),
                                      rows=min(12, len(names)), description="heads")
        self._list.add_class("gna-explorer-heads")
        self._method = w.ToggleButtons(options=list(METHODS), value=self.method, description="method")
        self._sample = w.BoundedIntText(value=self.sample, min=0, max=len(self.task.samples) - 1, description="prompt")
        self._remove = w.Button(description="remove", button_style="danger",
                                tooltip="score the task with the selected heads removed together")
        self._restore = w.Button(description="restore all", tooltip="the intact model")
        self._remove.add_class("gna-explorer-remove")
        self._restore.add_class("gna-explorer-restore")
        self._metrics = w.HTML()
        self._metrics.add_class("gna-explorer-metrics")
        self._dist = w.HTML()
        self._dist.add_class("gna-explorer-dist")
        self._patterns = w.HTML()
        self._patterns.add_class("gna-explorer-patterns")
        self._list.observe(lambda ch: setattr(self, "selected", self.model.check_heads(list(ch["new"]))
                                              if ch["new"] else []), names="value")
        self._method.observe(lambda ch: setattr(self, "method", ch["new"]), names="value")
        self._sample.observe(lambda ch: self.set_sample(ch["new"]), names="value")
        self._remove.on_click(lambda _b: self._busy(self.apply))
        self._restore.on_click(lambda _b: self._busy(self.restore))
        controls = w.VBox([self._list, self._method, w.HBox([self._remove, self._restore]), self._sample])
        self._widget = w.VBox([w.HBox([controls, w.VBox([self._metrics, self._dist])]), self._patterns])
        self._widget.add_class("gna-explorer")
        self._render()

    def _busy(self, action: Any) -> None:
        self._remove.disabled = self._restore.disabled = True
        try:
            action()
        finally:
            self._remove.disabled = self._restore.disabled = False

    def _render(self) -> None:
        st = self.state
        removed = ", ".join(st["removed"]) or "none"
        self._metrics.value = render("explorer_metrics.html", method=st["method"], removed=removed,
                                     accuracy=_fmt(st["accuracy"]), clean_accuracy=_fmt(st["clean_accuracy"]),
                                     logit_diff=_fmt(st["logit_diff"]), clean_logit_diff=_fmt(st["clean_logit_diff"]),
                                     n_samples=st["n_samples"])
        rows = [(repr(cand), j == st["gold"], p, p0)
                for j, (cand, p, p0) in enumerate(zip(st["candidates"], st["probs"], st["clean_probs"]))]
        self._dist.value = render("explorer_candidates.html", sample=st["sample"], prompt=st["prompt"][-160:], rows=rows)
        if self.removed:
            pats = patterns(self.model, st["prompt"], self.removed)
            self._patterns.value = attention_heads(pats, self.removed)._repr_html_()
        else:
            self._patterns.value = part("note", "remove heads to see their patterns on this prompt")


def explore(model: Model, task: Task, heads: Sequence[HeadRef | str] | None = None, method: str = "zero",
            sample: int = 0) -> Any:
    """A live explorer widget: pick heads, press *remove*, and see the task's accuracy, logit difference,
    one prompt's candidate distribution and the removed heads' patterns update.

    ``heads`` limits the list (default: every head); ``method`` is ``"zero"`` or ``"mean"``. The returned
    ipywidgets widget carries its :class:`Explorer` as ``.explorer`` (call ``select``/``apply`` from code).
    """
    check_model(model)
    ex = Explorer(model, task, heads, method, sample)
    widget = ex.widget
    widget.explorer = ex
    return widget
