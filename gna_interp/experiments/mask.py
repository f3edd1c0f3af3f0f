"""`mask_experiment`: keep only the Gather-and-Aggregate pattern of a model's G&A heads (the paper's
"masking shows SSMs use G&A" experiment), for attention and SSM heads alike.

Per sample, every G&A head gets a custom mask of its mixing pattern
(:class:`~gna_interp.interventions.PatternMask`: attention ``A ⊙ mask``, SSM ``(M ⊙ mask) x + D x``):

- a **Gather** head keeps only what each dictionary line reads inside its own line
  (``mask[q, k] = 1`` when ``k <= q`` lie in the same line; every other row sees nothing);
- an **Aggregate** head keeps only what the decision positions (the prompt's last token and the
  candidate tokens fed after it) read from the lines' *summary tokens* (each line's last token).

Conditions, each scored on the same KV-retrieval prompts:

===========================  ===================================================================
``intact``                   no mask
``ga_masked``                the G&A heads see nothing (all-zero mask: an attention head outputs 0,
                             an SSM head keeps only its skip term ``D x``)
``ga_pattern``               the G&A heads keep only their G&A pattern (the masks above)
``ga_pattern_unshifted``     (only when some head reads the lines shifted, see below) the same
                             masks at the literal summary tokens
``random_masked``            as many random heads (same kinds, same roles) see nothing, per seed
``random_pattern``           the random heads keep only the G&A pattern, per seed
===========================  ===================================================================

If the G&A heads carry retrieval, ``ga_masked`` falls to chance while ``ga_pattern`` recovers most of
``intact``; random heads move little either way.

**Where a head reads a line.** A Mamba mixer runs its ``x``, ``B`` and ``C`` through a causal
convolution of width ``w`` before the scan, so what the scan calls position ``s`` carries tokens
``s-w+1..s``: a line is visible at its summary token *and at the ``w-1`` tokens after it*, in this mixer
and in the residual stream every later layer reads. Measured on the zoo Mamba-2, its layer-1
aggregate heads read each line one token *after* its end (the next line's first token), and the zoo
hybrid's attention aggregate heads two tokens after it; at the literal summary tokens neither selects
the gold line. So each head reads the lines at a **summary offset** ``d`` in ``0..reach``
(:mod:`gna_interp.circuits.scan.offsets`, shared with the role scores: :func:`reach` is ``w - 1`` of the widest
convolution up to its layer, 0 in an attention-only model): with ``offset="auto"`` the smallest offset
within :data:`OFFSET_TOLERANCE` of its best role score (:func:`head_scores`), or the offset given. With ``d > 0`` a line's span and summary move ``d`` tokens
later (clipped at the prompt's end), for Gather and Aggregate masks alike, and the extra condition
``ga_pattern_unshifted`` shows what the literal summaries give.

**Which heads, which roles.** From a :class:`~gna_interp.circuits.search.circuit.Circuit` (``gna scan``'s
folder, or a discovery run here): its heads (generic heads left out) among the ``top_k`` best-ranked
whose removal hurts (``drop > 0``); a head labelled ``gather``/``aggregate`` keeps its label; a head
labelled ``other`` is scored here and becomes an aggregate head when, at some offset, its decision row
puts at least :data:`LEAN_AGGREGATE` of its mass on the gold summary and selects it at least
:data:`LEAN_AGGREGATE` above chance, a gather head when its summary rows read their own line at least
the circuit rule's ``gather_min``, and is left out otherwise. SSM patterns are smoother than attention
patterns (the paper's point) and often fall under the circuit's labelling thresholds; this relaxed
rule is recorded per head (``source``). Heads can also be given explicitly with roles
(``{"L1H3": "aggregate"}``), or without roles (scored as above).
"""

from __future__ import annotations

import functools
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.constants import CONTROL_CKPT, SCAN_CKPT
from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.scan.offsets import OFFSET_TOLERANCE, conv_width, pick_offset, reach, shifted_items
from gna_interp.circuits.scan.roles import RoleRule, ScoreOptions, offset_scores
from gna_interp.errors import HeadError, InputError, OptionError
from gna_interp.experiments.checkpoint import Checkpoint, fingerprint, stale_files
from gna_interp.experiments.options import RunOptions
from gna_interp.experiments.output import ExperimentResult, doc_table, table_html
from gna_interp.experiments.run import Discovery, Point, find_circuit, model_of, open_folder, run_points
from gna_interp.interventions.masking import MaskOptions, PatternMask
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.tasks.segments import segments_of
from gna_interp.options import check_counts, check_pairs_fit, options
from gna_interp.store import records
from gna_interp.tasks.base import Task
from gna_interp.tasks.calibration import ChanceVerdict
from gna_interp.tasks.choice import check_knobs
from gna_interp.tasks.options import TaskOptions
from gna_interp.engine.layout import Chunk
from gna_interp.engine.replay import FORWARDS, PlanRunner
from gna_interp.engine.plan import CandidateScores, ScoringPlan, plan_scoring
from gna_interp.tasks.segments import Segments
from gna_interp.viz.html import part

ROLES: tuple[str, ...] = ("gather", "aggregate")
CONDITIONS: tuple[str, ...] = ("intact", "ga_masked", "ga_pattern", "ga_pattern_unshifted", "random_masked",
                               "random_pattern")
COLUMNS = ["condition", "seed", "heads", "accuracy", "accuracy_se", "logit_diff", "gold_prob", "chance",
           "n_samples"]
SCORE_COLUMNS = ["name", "kind", "offset", "gather", "aggregate", "selectivity"]
LEAN_AGGREGATE = 0.1
CHECKPOINT = "mask.ckpt.json"
CIRCUIT_DIR = "circuit"
_LABELS = {"intact": "intact", "ga_masked": "G&A heads\nsee nothing", "ga_pattern": "G&A heads keep\nonly G&A pattern",
           "ga_pattern_unshifted": "G&A pattern at\nliteral summaries", "random_masked": "random heads\nsee nothing",
           "random_pattern": "random heads keep\nonly G&A pattern"}

__all__ = ["CONDITIONS", "COLUMNS", "LEAN_AGGREGATE", "OFFSET_TOLERANCE", "MaskConfig", "MaskResult", "MaskedHead",
           "checkpoint_files", "conv_width", "ga_mask", "head_scores", "mask_experiment", "mask_figure", "reach", "shifted_items"]


@dataclass(frozen=True)
class MaskedHead:
    """A head of the experiment: its ``role`` (``gather``/``aggregate``), the summary ``offset`` its lines
    are read at (0 for attention), and where the role came from (``source``: ``circuit``, ``given``,
    ``measured``, or ``random`` for a random head standing in for a G&A head)."""

    head: HeadRef
    role: str
    offset: int = 0
    source: str = "given"

    def to_dict(self) -> dict[str, Any]:
        return {"head": self.head.name, "role": self.role, "offset": self.offset, "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MaskedHead":
        return cls(HeadRef.parse(d["head"]), str(d["role"]), int(d["offset"]), str(d["source"]))

    @property
    def label(self) -> str:
        """``L1H3:a`` (``:g`` for gather; ``+1`` appended when read at offset 1)."""
        return f"{self.head.name}:{self.role[0]}" + (f"+{self.offset}" if self.offset else "")


# ---- masks ---------------------------------------------------------------------------------------

def ga_mask(seg: Segments, role: str, width: int, pad: int = 0, offset: int = 0) -> Float[Tensor, "q k"]:
    """The keep-only-G&A mask ``[width, width]`` of one prompt laid out behind ``pad`` padding tokens.

    ``gather``: ``mask[q, k] = 1`` when ``k <= q`` lie in the same line (rows outside the lines are 0);
    ``aggregate``: ``mask[q, k] = 1`` for every decision row ``q >= pad + final`` (the prompt's last
    token and any candidate tokens fed after it) and every summary key ``k = pad + summary`` of a line.
    Lines are read ``offset`` tokens later (:func:`shifted_items`).
    """
    if role not in ROLES:
        raise InputError(f"unknown G&A role {role!r}; choose one of {ROLES}")
    if pad < 0 or pad + seg.n_tokens > width:
        raise InputError(f"a prompt of {seg.n_tokens} tokens behind {pad} padding tokens does not fit in {width} "
                         f"positions")
    m = torch.zeros(width, width)
    items = shifted_items(seg, offset)
    if role == "gather":
        for sp in items:
            a, z = pad + sp.start, pad + sp.stop
            m[a:z, a:z] = torch.ones(z - a, z - a).tril()
    else:
        cols = torch.tensor([pad + sp.summary for sp in items], dtype=torch.long)
        if len(cols):
            m[pad + seg.final:, cols] = 1.0
    return m


# ---- role scores at an offset ----------------------------------------------------------------------

def head_scores(model: Model, task: Task, heads: Sequence[HeadRef | str], offsets: Sequence[int] | None = None,
                config: ScoreOptions | None = None, **overrides: Any) -> pd.DataFrame:
    """G&A scores of ``heads`` with the lines read at each summary offset (default: ``0..reach(head)``,
    :func:`~gna_interp.circuits.scan.offsets.reach`; given ``offsets``: those, for every head). Rows: ``name,
    kind, offset, gather, aggregate, selectivity`` (means over the first ``n_samples`` samples), the
    :func:`~gna_interp.circuits.scan.roles.offset_scores` columns ``gather``, ``summary_aggregate`` and
    ``summary_selectivity``: the role scores read at the summary tokens (what the aggregate mask keeps)
    rather than over whole lines. An offset that pushes a line past the prompt's end on some sample is not
    scored on that sample. ``config`` (:class:`~gna_interp.circuits.scan.roles.ScoreOptions`) or keyword ``overrides``
    of its fields: ``n_samples``, ``batch_size``, ``form``."""
    per = offset_scores(model, task, list(heads), offsets, ScoreOptions.build(config, **overrides))
    per = per.rename(columns={"aggregate": "line_aggregate", "selectivity": "line_selectivity",
                              "summary_aggregate": "aggregate", "summary_selectivity": "selectivity"})
    return per[SCORE_COLUMNS].reset_index(drop=True)


def _pick(rows: pd.DataFrame, role: str | None, rule: RoleRule) -> tuple[str | None, int]:
    """The role and offset of one head from its scores at every offset (module doc): a given role is read at
    the smallest offset where it is within :data:`OFFSET_TOLERANCE` of its strongest (aggregate:
    selectivity, gather: gather score); a head without one becomes an aggregate head where it qualifies
    as one, else a gather head where it qualifies as one (same choice of offset), else ``None``."""
    if rows.empty:
        return role, 0
    rows = rows.sort_values("offset")
    agg = rows[(rows["aggregate"] >= LEAN_AGGREGATE) & (rows["selectivity"] >= LEAN_AGGREGATE)]
    gat = rows[rows["gather"] >= rule.gather_min]
    if role is None:
        if len(agg):
            role, rows = "aggregate", agg
        elif len(gat):
            role, rows = "gather", gat
        else:
            return None, 0
    col = "selectivity" if role == "aggregate" else "gather"
    return role, pick_offset(dict(zip(rows["offset"], rows[col])))


def _assign(model: Model, task: Task, candidates: Sequence[tuple[HeadRef, str | None, str]], offset: int | str,
            rule: RoleRule, role_samples: int, batch_size: int) -> tuple[list[MaskedHead], pd.DataFrame, list[str]]:
    """Roles and offsets of the candidate heads ``(head, role or None, source)`` (module doc)."""
    if offset != "auto" and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0):
        raise InputError(f"offset must be 'auto' or an integer >= 0, got {offset!r}")
    heads = [h for h, _, _ in candidates]
    fixed = None if offset == "auto" else sorted({0, int(offset)})
    scores = head_scores(model, task, heads, fixed, n_samples=role_samples, batch_size=min(batch_size, 8))
    out: list[MaskedHead] = []
    left: list[str] = []
    for h, role, source in candidates:
        mine = scores[scores["name"] == h.name]
        if offset != "auto":
            mine = mine[mine["offset"] == offset]
        picked, d = _pick(mine, role, rule)
        if picked is None:
            left.append(h.name)
            continue
        out.append(MaskedHead(h, picked, d, source if role is not None else "measured"))
    notes: list[str] = []
    at = scores.set_index(["name", "offset"])
    moved = [mh for mh in out if mh.offset]
    if moved:
        col = {"aggregate": "selectivity", "gather": "gather"}
        notes.append("heads that read the lines after their last token (the causal convolutions of SSM mixers carry "
                      "a line into the tokens after it), their role score at that offset vs at the literal summary: "
                      + ", ".join(f"{mh.head.name} {mh.role} +{mh.offset} {col[mh.role]} "
                                  f"{at.loc[(mh.head.name, mh.offset), col[mh.role]]:.2f} vs "
                                  f"{at.loc[(mh.head.name, 0), col[mh.role]]:.2f}" for mh in moved
                                  if (mh.head.name, 0) in at.index))
    if left:
        notes.append(f"left out (neither role at any offset): {', '.join(left)}")
    return out, scores, notes


# ---- scoring under masks ---------------------------------------------------------------------------

@torch.no_grad()
def _score(model: Model, plan: ScoringPlan, segs: Sequence[Segments], heads: Sequence[MaskedHead], mode: str,
           batch_size: int, renormalize: bool) -> CandidateScores:
    """Every candidate's score with ``heads`` masked: ``none`` (no mask), ``zero`` (see nothing),
    ``pattern`` (keep-only-G&A at each head's offset) or ``unshifted`` (the same at offset 0)."""
    options = MaskOptions(renormalize=renormalize)

    def masked(chunk: Chunk) -> list[PatternMask]:
        return [PatternMask(_chunk_masks(model, chunk, segs, heads, mode), options)]

    return PlanRunner(model, plan, batch_size=batch_size, replays=FORWARDS).run_under(masked)


def _chunk_masks(model: Model, chunk: Chunk, segs: Sequence[Segments], heads: Sequence[MaskedHead],
                 mode: str) -> dict[HeadRef, Tensor]:
    """Each head's ``[batch, T, T]`` mask for one chunk under ``mode`` (none for ``none``); heads that share a
    role and offset share one tensor."""
    if mode == "none":
        return {}
    b, T = chunk.batch.ids.shape
    pads = chunk.pad.tolist()
    cache: dict[tuple[str, int], Tensor] = {}
    masks: dict[HeadRef, Tensor] = {}
    for mh in heads:
        off = 0 if mode == "unshifted" else mh.offset
        key = (mh.role, off)
        if key not in cache:
            m = torch.zeros(b, T, T)
            if mode != "zero":
                for k, row in enumerate(chunk.rows):
                    m[k] = ga_mask(segs[row.sample], mh.role, T, pads[k], off)
            cache[key] = m.to(model.device)
        masks[mh.head] = cache[key]
    return masks


def _row(condition: str, seed: int, heads: Sequence[MaskedHead], scores: CandidateScores) -> dict[str, Any]:
    m = scores.metrics
    n = m["n_samples"]
    se = math.sqrt(max(m["accuracy"] * (1 - m["accuracy"]), 0.0) / n) if n else math.nan
    return {"condition": condition, "seed": seed, "heads": ",".join(h.label for h in heads),
            "accuracy": m["accuracy"], "accuracy_se": se, "logit_diff": m["logit_diff"],
            "gold_prob": m["gold_prob"], "chance": m["chance"], "n_samples": n}


# ---- result ----------------------------------------------------------------------------------------

@dataclass
class MaskResult(ExperimentResult, format="mask"):
    """What :func:`mask_experiment` measured: a folder result (:meth:`save` / :meth:`load`) with a figure
    (:meth:`figure`, :meth:`plot`).

    Attributes:
        model: the model's name.
        task: the evaluation task (``Task.to_dict``).
        heads: the G&A heads with roles and offsets.
        random: per seed, the random heads standing in for them (same kinds, roles and offsets).
        frame: one row per condition (and seed), columns :data:`COLUMNS`.
        scores: the offset-aware role scores of the candidate heads (:func:`head_scores`).
        settings: the options the experiment ran with.
        notes: sentences on how heads, roles and offsets were chosen, and the chance check.
        circuit: where the circuit came from (a folder), or None when heads were given.
    """

    model: str
    task: dict[str, Any]
    heads: list[MaskedHead]
    random: dict[int, list[MaskedHead]]
    frame: pd.DataFrame
    scores: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SCORE_COLUMNS))
    circuit: str | None = None

    def to_frame(self) -> pd.DataFrame:
        """The condition table (columns :data:`COLUMNS`)."""
        return self.frame.copy()

    def accuracy(self, condition: str) -> float:
        """Accuracy of ``condition`` (the median over seeds for the random conditions; NaN when not run)."""
        part = self.frame[self.frame["condition"] == condition]["accuracy"]
        return float(part.median()) if len(part) else math.nan

    @property
    def metrics(self) -> dict[str, float]:
        """Accuracy per condition (random: median over seeds), chance, and ``recovered``: the part of the
        accuracy lost by masking the G&A heads that keeping their G&A pattern gives back,
        ``(ga_pattern - ga_masked) / (intact - ga_masked)``."""
        out = {c: self.accuracy(c) for c in CONDITIONS if c in set(self.frame["condition"])}
        out["chance"] = float(self.frame["chance"].iloc[0]) if len(self.frame) else math.nan
        lost = out.get("intact", math.nan) - out.get("ga_masked", math.nan)
        out["recovered"] = (out.get("ga_pattern", math.nan) - out.get("ga_masked", math.nan)) / lost \
            if lost > 1e-9 else math.nan
        return out

    def summary(self) -> str:
        """A few lines: heads, each condition's accuracy, the verdict."""
        m = self.metrics
        lines = [f"masking on {self.model}, {self.task.get('name')} ({self.task.get('n_samples')} samples), "
                 f"chance {m['chance']:.3f}",
                 "G&A heads: " + ", ".join(f"{h.head.name} {h.role}" + (f" (offset {h.offset})" if h.offset else "")
                                           + ("" if h.source == "circuit" else f" [{h.source}]") for h in self.heads)]
        lines += [f"  {n}" for n in self.notes]
        for c in CONDITIONS:
            part = self.frame[self.frame["condition"] == c]
            if part.empty:
                continue
            if c.startswith("random"):
                lines.append(f"  {c:22s} accuracy {part['accuracy'].median():.3f} (median of {len(part)} seeds: "
                             + ", ".join(f"{a:.3f}" for a in part["accuracy"]) + ")")
            else:
                r = part.iloc[0]
                lines.append(f"  {c:22s} accuracy {r['accuracy']:.3f} ± {r['accuracy_se']:.3f}, logit diff "
                             f"{r['logit_diff']:.2f}")
        if not math.isnan(m["recovered"]):
            lines.append(f"keeping only the G&A pattern gives back {m['recovered']:.0%} of the accuracy that masking "
                         f"the G&A heads takes away")
        return "\n".join(lines)

    def figure(self) -> Any:
        """The bar chart of :func:`mask_figure`."""
        return mask_figure(self)

    def to_dict(self) -> dict[str, Any]:
        """The ``mask`` document's body: task, heads, random draws, role scores, settings, notes, metrics and the
        condition table (``table``, last)."""
        return {"model": self.model, "task": self.task, "heads": [h.to_dict() for h in self.heads],
                "random": {str(s): [h.to_dict() for h in hs] for s, hs in self.random.items()},
                "scores": self.scores.to_dict(orient="records"), "settings": self.settings, "notes": self.notes,
                "circuit": self.circuit, "metrics": self.metrics, "table": records(self.frame)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MaskResult":
        """The result :meth:`to_dict` described."""
        return cls(d["model"], d["task"], [MaskedHead.from_dict(h) for h in d["heads"]],
                   {int(s): [MaskedHead.from_dict(h) for h in hs] for s, hs in d["random"].items()},
                   doc_table(d, COLUMNS), pd.DataFrame(d.get("scores") or [], columns=SCORE_COLUMNS),
                   d.get("circuit"), **cls.run_fields(d))

    def save(self, path: str | os.PathLike, png: bool = True) -> Path:
        """Write ``mask.csv``, ``mask.json``, ``report.html`` and ``figures/mask.png`` into the folder ``path`` (or
        the folder of ``path`` naming its ``mask.json``); return the folder. :meth:`load` reads the folder or the
        file."""
        heads = pd.DataFrame([{**h.to_dict(), "seed": -1} for h in self.heads]
                             + [{**h.to_dict(), "seed": s} for s, hs in self.random.items() for h in hs])
        sections = [part("heading", "Masked heads"), table_html(heads)]
        if len(self.scores):
            sections += [part("heading", "Role scores by summary offset"), table_html(self.scores)]
        return self.folder(path).write(
            self.frame, self.to_dict(), title=f"Keep-only-G&A masks: {self.model}",
            figures={"mask": self.figure}, notes=self.summary().splitlines(), sections=sections, png=png)

    def _repr_html_(self) -> str:  # offline: the summary and the table (``.figure()`` displays the chart)
        return part("pre", self.summary()) + table_html(self.frame)


def mask_figure(result: MaskResult) -> Any:
    """Plotly bars: accuracy per condition (random conditions: median over seeds, each seed a dot), with
    binomial standard errors and the chance level dashed."""
    import plotly.graph_objects as go

    df = result.frame
    order = [c for c in CONDITIONS if c in set(df["condition"])]
    colors = {"intact": "#2c7fb8", "ga_masked": "#c0392b", "ga_pattern": "#27ae60", "ga_pattern_unshifted": "#a3d9a5",
              "random_masked": "#95a5a6", "random_pattern": "#bdc3c7"}
    x = [_LABELS[c].replace("\n", "<br>") for c in order]
    acc = [float(df[df["condition"] == c]["accuracy"].median()) for c in order]
    se = [float(df[df["condition"] == c]["accuracy_se"].median()) for c in order]
    fig = go.Figure(go.Bar(x=x, y=acc, error_y=dict(type="data", array=se), marker_color=[colors[c] for c in order],
                           name="accuracy", hovertext=[str(df[df["condition"] == c]["heads"].iloc[0]) for c in order]))
    for xi, a, e in zip(x, acc, se):
        fig.add_annotation(x=xi, y=a + (0 if math.isnan(e) else e) + 0.02, text=f"{a:.2f}", showarrow=False,
                           yanchor="bottom")
    for c in order:
        part = df[df["condition"] == c]
        if c.startswith("random"):
            fig.add_trace(go.Scatter(x=[_LABELS[c].replace("\n", "<br>")] * len(part), y=part["accuracy"],
                                     mode="markers", marker=dict(color="#333", size=7), name="one random draw",
                                     showlegend=c == "random_masked", hovertext=list(part["heads"])))
    chance = result.metrics["chance"]
    fig.add_hline(y=chance, line=dict(color="#888", dash="dash"), annotation_text=f"chance {chance:.2f}",
                  annotation_position="top right")
    heads = ", ".join(h.label for h in result.heads)
    fig.update_layout(title=dict(text=f"Keep-only-G&A masks on {result.model}: KV accuracy<br><sup>G&A heads {heads}"
                                      f"</sup>"),
                      yaxis=dict(title="accuracy", range=[0, 1.12]), height=480, template="plotly_white",
                      showlegend=False, margin=dict(t=90))
    return fig


# ---- the experiment ----------------------------------------------------------------------------------

def _parse_heads(model: Model, heads: Any) -> list[tuple[HeadRef, str | None, str]]:
    """``{head: role}``, a list of heads, or ``"L1H3=aggregate,L0H3"``: ``(head, role or None, "given")``, each
    head checked against ``model``."""
    return [(model.check_head(h), role, source) for h, role, source in parse_head_roles(heads)]


def parse_head_roles(heads: Any) -> list[tuple[HeadRef, str | None, str]]:
    """:func:`_parse_heads` without a model: names parsed, roles known, no head twice (what ``gna mask --heads``
    checks before its model loads)."""
    if isinstance(heads, Mapping):
        items = list(heads.items())
    else:
        if isinstance(heads, str):
            parts = [p.strip() for p in heads.split(",") if p.strip()]
        else:
            parts = list(heads)
        items = []
        for p in parts:
            if isinstance(p, str) and "=" in p:
                name, _, role = p.partition("=")
                items.append((name.strip(), role.strip()))
            else:
                items.append((p, None))
    if not items:
        raise InputError("no heads given; name some, e.g. 'L0H3=gather,L1H3=aggregate'")
    out = []
    for name, role in items:
        h = HeadRef.parse(name)
        if role is not None and role not in ROLES:
            raise InputError(f"{h.name}={role!r}: unknown role; use gather or aggregate (or no role: it is measured)")
        out.append((h, role, "given" if role else "measured"))
    dup = [h.name for h, _, _ in out if sum(o[0] == h for o in out) > 1]
    if dup:
        raise HeadError(f"{dup[0]} is given twice")
    return out


def _from_circuit(circuit: Circuit, top_k: int) -> list[tuple[HeadRef, str | None, str]]:
    df = circuit.to_frame()
    if "circuit_rank" in df:
        df = df[df["circuit_rank"].notna()].sort_values("circuit_rank")
    est = circuit.edge_drops()  # an accuracy scan's own drops are NaN where not run exactly: its estimand's then
    drop = [d if d == d else est.get(n, float("nan")) for n, d in zip(df["name"], df["drop"])]
    df = df[[d > 0 for d in drop]].head(top_k)
    return [(HeadRef.parse(r["name"]), r["role"] if r["role"] in ROLES else None,
             "circuit" if r["role"] in ROLES else "measured") for _, r in df.iterrows()]


def _random_heads(model: Model, ga: Sequence[MaskedHead], pool: Sequence[HeadRef], seed: int) -> list[MaskedHead]:
    """One random head per G&A head: same kind and width, not a G&A head, drawn without replacement."""
    taken = {h.head for h in ga}
    rng = random.Random(f"gna-mask-random-{seed}")
    out = []
    for mh in ga:
        options = [h for h in pool if h.kind == mh.head.kind and h.width == mh.head.width and h not in taken]
        if not options:  # e.g. a Mamba-1 channel while the pool holds channel groups: every head of its size
            options = [h for h in model.heads(mh.head.kind, channel_group=mh.head.width)
                       if h.width == mh.head.width and h not in taken]
        if not options:
            raise InputError(f"no {mh.head.kind} head left to stand in for {mh.head.name} at random ({len(ga)} G&A "
                             f"heads of {len(pool)}); use fewer G&A heads (top_k) or seeds=0")
        h = rng.choice(sorted(options, key=lambda r: (r.layer, r.head)))
        taken.add(h)
        out.append(MaskedHead(h, mh.role, mh.offset, "random"))
    return out


@options
class MaskConfig(TaskOptions, RunOptions):
    """How :func:`mask_experiment` runs: the KV knobs of :class:`~gna_interp.tasks.options.TaskOptions`
    (``pairs``, ``max_value`` and ``template`` default to the circuit's KV task's, else 10, 9 and
    ``official``; the evaluation prompts use seed ``seed + 1``, prompts the circuit was not found on) and

    Attributes:
        top_k: best-ranked circuit heads considered; seeds: random draws.
        offset: ``"auto"`` or the SSM summary offset; renormalize: attention rows rescaled to sum to 1 after
            masking.
        role_samples: samples the role scores are measured on (the circuit's task, or the discovery task).
        scan_samples: discovery prompts when neither a circuit nor heads are given.
        allow_chance: run even when the intact model is near chance on the task (refused otherwise).

    and the run options of :class:`~gna_interp.experiments.options.RunOptions` (``batch_size``, ``resume``,
    ``fresh``, ``progress``, ``png``).
    """

    pairs: int | None = None
    samples: int = 48
    max_value: int | None = None
    template: str | None = None
    top_k: int = 16
    seeds: int = 3
    offset: int | str = "auto"
    renormalize: bool = False
    role_samples: int = 8
    scan_samples: int = 24
    allow_chance: bool = False

    def validate(self) -> None:
        check_counts(self, {"samples": 1, "top_k": 1, "seeds": 0, "role_samples": 1, "scan_samples": 1,
                            "batch_size": 1})
        check_knobs(self)
        if self.offset != "auto" and (isinstance(self.offset, bool) or not isinstance(self.offset, int)
                                      or self.offset < 0):
            raise OptionError(f"offset must be 'auto' or an integer >= 0, got {self.offset!r}")

    def resolve(self, kv_args: Mapping[str, Any]) -> "MaskConfig":
        """The config with ``pairs``, ``max_value`` and ``template`` not given taken from a circuit's KV task
        (``kv_args``), else 10, 9 and ``official``; refused when the values cannot fill the lines."""
        pairs = self.pairs if self.pairs is not None else int(kv_args.get("n_pairs", 10))
        max_value = self.max_value if self.max_value is not None else int(kv_args.get("max_value", 9))
        template = self.template if self.template is not None else str(kv_args.get("template", "official"))
        check_pairs_fit(pairs, max_value)
        return self.replace(pairs=pairs, max_value=max_value, template=template)


def mask_experiment(model: Model | str, circuit: Circuit | str | os.PathLike | None = None,
                    heads: Mapping[Any, str] | Sequence[Any] | str | None = None,
                    out: str | os.PathLike | None = None, config: MaskConfig | None = None,
                    **overrides: Any) -> MaskResult:
    """Score KV retrieval with the G&A heads masked fully, masked down to their G&A pattern, and the same
    for random heads (see the module doc for masks, roles and offsets).

    Args:
        model: a loaded :class:`Model` or a model spec.
        circuit: a :class:`Circuit` or a ``gna scan`` folder whose heads and roles to use; with neither
            ``circuit`` nor ``heads``, :func:`~gna_interp.circuits.search.discovery.discover` runs on a KV task of
            ``scan_samples`` prompts (seed ``seed``) and its circuit is saved in ``out/circuit``.
        heads: instead of a circuit: ``{head: role}``, heads without roles (measured), or
            ``"L0H3=gather,L1H3=aggregate"``.
        out: folder for ``mask.csv``, ``mask.json``, ``report.html``, ``figures/``; conditions are
            checkpointed in ``out/mask.ckpt.json`` as they finish.
        config: a :class:`MaskConfig`; keyword ``overrides`` of its fields (``samples=32``, ``seeds=2``, ...).
    """
    cfg = MaskConfig.build(config, **overrides)
    model = model_of(model)
    if circuit is not None and heads is not None:
        raise InputError("give a circuit or heads, not both")
    folder = Path(out) if out is not None else None
    if folder is not None:
        stale_files(folder, CHECKPOINT, cfg.resume, cfg.fresh, also=checkpoint_files(folder)[1:])  # refused early
    given = _parse_heads(model, heads) if heads is not None else None
    source = str(circuit) if isinstance(circuit, (str, os.PathLike)) else None
    if isinstance(circuit, (str, os.PathLike)):
        circuit = Circuit.load(circuit)
    kv = cfg.resolve(circuit.kv_args if circuit is not None else {})
    open_folder(folder, CHECKPOINT, cfg, also=checkpoint_files(folder)[1:] if folder is not None else ())
    notes: list[str] = []
    if given is None and circuit is None:
        circuit, source = _discover_here(model, kv, folder, notes)
    ga, scores, candidates_pool = _masked_heads(model, circuit, given, kv, notes)
    random_heads = {s: _random_heads(model, ga, candidates_pool, s) for s in range(kv.seeds)}
    task = kv.kv(model.kv_words, seed=kv.seed + 1)
    plan = plan_scoring(model, task.samples)
    segs = segments_of(model.tokenizer, task.samples)
    for i, (sg, ids) in enumerate(zip(segs, plan.prompt_ids)):
        if sg.n_tokens != len(ids):
            raise InputError(f"sample {i}: the segment annotation has {sg.n_tokens} tokens but the prompt tokenizes "
                             f"to {len(ids)}; cannot place the masks")
    settings = {"model": model.name, "task": task.to_dict(), "heads": [h.to_dict() for h in ga],
                "random": {str(s): [h.to_dict() for h in hs] for s, hs in random_heads.items()},
                "renormalize": kv.renormalize, "batch_size": kv.batch_size, "circuit": source}
    conditions: list[tuple[str, int, list[MaskedHead], str]] = [
        ("intact", -1, [], "none"), ("ga_masked", -1, ga, "zero"), ("ga_pattern", -1, ga, "pattern")]
    if any(h.offset for h in ga):
        conditions.append(("ga_pattern_unshifted", -1, ga, "unshifted"))
    for s, hs in random_heads.items():
        conditions += [("random_masked", s, hs, "zero"), ("random_pattern", s, hs, "pattern")]
    log = Checkpoint(folder / CHECKPOINT if folder is not None else None, "mask", fingerprint(model, settings))
    started = time.perf_counter()

    def measure(name: str, s: int, hs: list[MaskedHead], mode: str) -> dict[str, Any]:
        row = _row(name, s, hs, _score(model, plan, segs, hs, mode, kv.batch_size, kv.renormalize))
        if name == "intact":  # refused (not recorded) when the model is at chance
            _check_chance(row, task, kv.allow_chance, notes)
        return row

    run_points(log, [Point(f"{n}:{s}", functools.partial(measure, n, s, hs, mode), n + (f" seed {s}" if s >= 0 else ""))
                     for n, s, hs, mode in conditions], "mask conditions", kv.progress, "condition")
    if "intact:-1" in log and not any("intact model" in n for n in notes):
        _check_chance(log["intact:-1"], task, kv.allow_chance, notes)
    frame = pd.DataFrame([log[f"{n}:{s}"] for n, s, _, _ in conditions], columns=COLUMNS)
    settings.update(samples=kv.samples, pairs=kv.pairs, max_value=kv.max_value, template=kv.template, seed=kv.seed,
                    top_k=kv.top_k, seeds=kv.seeds, offset=kv.offset, role_samples=kv.role_samples,
                    seconds=round(time.perf_counter() - started, 2))
    result = MaskResult(model.name, task.to_dict(), ga, random_heads, frame, scores, source, settings=settings,
                        notes=notes)
    if folder is not None:
        result.save(folder, png=kv.png)
    return result


def _discover_here(model: Model, kv: MaskConfig, folder: Path | None, notes: list[str]) -> tuple[Circuit, str | None]:
    """The circuit of a run given neither a circuit nor heads: found by an earlier run in ``folder/circuit``
    (with ``resume``) or discovered here on a KV task of ``scan_samples`` prompts (saved there)."""
    saved = folder / CIRCUIT_DIR if folder is not None else None
    scan_task = kv.kv(model.kv_words, samples=kv.scan_samples)
    say = (f"no circuit given: discovering on {scan_task.name} ({kv.scan_samples} samples, seed {kv.seed}) ..."
           if kv.progress else None)
    found, origin = find_circuit(model, None, saved, Discovery(task=scan_task, batch_size=kv.batch_size,
                                                               progress=kv.progress, allow_chance=kv.allow_chance,
                                                               reuse=kv.resume, say=say))
    if origin == "saved":
        notes.append(f"circuit from the earlier discovery in {saved}")
    else:
        notes.append(f"circuit discovered here on {scan_task.name} ({kv.scan_samples} samples, seed {kv.seed})"
                     + (f", saved in {saved}" if saved is not None else ""))
    return found, str(saved) if saved is not None else None


def _masked_heads(model: Model, circuit: Circuit | None, given: Any, kv: MaskConfig, notes: list[str]
                  ) -> tuple[list[MaskedHead], pd.DataFrame, list[HeadRef]]:
    """The G&A heads with their roles and offsets, their role scores, and the pool random heads are drawn from."""
    words = model.kv_words
    if circuit is not None:
        if circuit.model != model.name:
            notes.append(f"the circuit was found on {circuit.model}; this run uses {model.name}")
        role_task = circuit.load_task()
        if not all(s.spans.items for s in role_task.samples[:kv.role_samples]):
            role_task = kv.kv(words, samples=kv.role_samples)
        elif circuit.task.get("kind") != "kv":
            notes.append(f"heads and roles come from a circuit found on {role_task.name} (roles measured there); the "
                         f"masks are evaluated on KV retrieval")
        candidates = _from_circuit(circuit, kv.top_k)
        pool, rule = list(circuit.scan.heads), circuit.rule
        if not candidates:
            raise InputError(f"the circuit has no head among its top {kv.top_k} whose removal hurts the task "
                             f"(drop > 0); nothing to mask")
    else:
        role_task = kv.kv(words, samples=kv.role_samples)
        candidates, pool, rule = given, model.default_heads(), RoleRule()
    ga, scores, role_notes = _assign(model, role_task, candidates, kv.offset, rule, kv.role_samples, kv.batch_size)
    notes += role_notes
    if not ga:
        raise InputError(f"none of the heads {[h.name for h, _, _ in candidates]} has a G&A role (gather or "
                         f"aggregate), labelled or measured; name heads with roles, e.g. heads='L0H3=gather,"
                         f"L1H3=aggregate' (gna mask --heads)")
    return ga, scores, pool


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoints a mask run may leave in ``folder``: its own and its discovery's."""
    return [folder / CHECKPOINT, folder / CIRCUIT_DIR / SCAN_CKPT,
            folder / CIRCUIT_DIR / CONTROL_CKPT]


def _check_chance(row: Mapping[str, Any], task: Task, allow_chance: bool, notes: list[str]) -> None:
    """Refuse (or note, with ``allow_chance``) an intact model near chance
    (:class:`~gna_interp.tasks.calibration.ChanceVerdict`): masking cannot show how a model retrieves when it
    does not."""
    verdict = ChanceVerdict.of(task, row["accuracy"])
    if verdict.near_chance and not allow_chance:
        raise InputError(f"the model is at chance on {task.name}: {verdict.line()}; masking cannot show how it "
                         f"retrieves. Use fewer pairs, or allow_chance=True (gna mask --allow-chance)")
    notes.append(verdict.line(near="the conditions below say nothing about retrieval"))
