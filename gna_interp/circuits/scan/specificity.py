"""Specificity: what makes a head a G&A head and not just an important head.

Removing a G&A head collapses retrieval while ordinary language modelling barely moves; some heads
(typically in layers 0-2) are needed by everything, and removing them hurts retrieval only as a side
effect. Every scanned head therefore also gets a **control** measurement that needs no in-context
retrieval: the rise of the LM loss on neutral prose (:class:`~gna_interp.tasks.text.NeutralText`,
nats per token) when the head is removed the same way. The control scan is an ``auto`` scan of
``metric="logprob"``: attribution estimates for every head, then exact runs of the heads that can
enter the circuit (the task scan's best-ranked ``2 * max(certify, k)``) whose rise could pass the
generic threshold, and of the curve's top ``k``; the other heads keep their estimates
(``control_source`` says which, and the summary marks an estimated generic label).

Columns added to a circuit's frame (:func:`specificity_frame`):

- ``control_drop``: LM-loss rise in nats/token (exact where ``control_source`` is ``exact``);
- ``control_rel``: that rise relative to the intact model's LM loss;
- ``specificity``: ``(r − c) / (|r| + |c|)`` with ``r`` the retrieval drop relative to the intact
  model's logit difference and ``c = control_rel``: +1 hurts only retrieval, −1 only language modelling,
  0 both alike;
- ``generic``: ``control_rel >= generic_fraction`` (default 2 % of the LM loss: on SmolLM2-135M that is
  0.064 nats/token, which the four layer-1 heads L1H3, L1H5, L1H4, L1H0 pass (0.07-0.19) and every
  other head stays below). Generic heads are labelled ``generic`` and kept out of the circuit unless asked.
"""

from __future__ import annotations

import math

import pandas as pd

from gna_interp.circuits.scan.result import HeadScan
from gna_interp.errors import InputError
from gna_interp.models.model import Model
from gna_interp.engine.plan import plan_scoring
from gna_interp.tasks.text import NeutralText
from gna_interp.engine.metrics import LOGIT_DIFF

DEFAULT_GENERIC_FRACTION = 0.02

__all__ = ["DEFAULT_GENERIC_FRACTION", "control_task", "specificity_frame"]


def control_task(model: Model) -> tuple[NeutralText | None, str]:
    """The neutral-text control for ``model`` and a sentence about it; ``None`` (with the reason) when the
    model cannot represent the text (a word-level zoo vocabulary) or it does not fit its context."""
    task = NeutralText()
    try:
        plan_scoring(model, task.samples)
    except InputError as e:
        return None, f"no LM-loss control for {model.name}: the neutral text cannot be scored ({e})"
    return task, f"LM loss on {len(task)} paragraphs of neutral prose ({task.name})"


def specificity_frame(scan: HeadScan, control: HeadScan, generic_fraction: float = DEFAULT_GENERIC_FRACTION
                      ) -> pd.DataFrame:
    """Per head of ``scan``: ``name, control_drop, control_source, control_rel, specificity, generic``
    (see the module docstring); ``control`` is a ``logprob`` scan of the control task."""
    base_loss = -control.baseline_value
    base_ld = abs(LOGIT_DIFF.value(scan.baseline)) or 1.0
    rows = []
    for h in scan.heads:
        if h in control.exact:
            c, src = control.drop(h), "exact"
        elif h in control.estimates:
            c, src = control.est_drop(h), "attribution"
        else:
            c, src = math.nan, "none"
        r = scan.drop(h, "logit_diff") / base_ld  # NaN if unmeasured
        rel = c / base_loss if base_loss > 0 else math.nan
        spec = (r - rel) / (abs(r) + abs(rel)) if abs(r) + abs(rel) > 0 else 0.0
        rows.append({"name": h.name, "control_drop": c, "control_source": src, "control_rel": rel,
                     "specificity": spec, "generic": bool(rel >= generic_fraction) if not math.isnan(rel) else False})
    return pd.DataFrame(rows)
