"""`build_report(out_dir)`: the self-contained ``report.html`` of a `gna scan` output folder."""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from gna_interp.errors import GnaError
from gna_interp.models.heads import HeadRef
from gna_interp.report.inputs import ReportInputs, load_inputs
from gna_interp.viz.attention import attention_heads
from gna_interp.viz.cards import ga_card
from gna_interp.viz.compare import compare_heads
from gna_interp.viz.curves import ablation_curve
from gna_interp.viz.export import write_pngs
from gna_interp.viz.html import figure_div, page
from gna_interp.viz.scores import score_heatmap

REPORT_FILE = "report.html"
FIGURES_DIR = "figures"
N_TOP = 15
N_VIEW = 6
_TABLE_COLUMNS = ("rank", "name", "kind", "role", "drop", "ablated", "source", "est_drop", "gather", "aggregate",
                  "gold_share", "sharpness")


def build_report(out_dir: str | Path, *, model: Any = None, task: Any = None, png: bool = True,
                 n_cards: int = 2, form: str = "exact") -> Path:
    """Write ``out_dir/report.html`` from the ``scan.csv`` and ``circuit.json`` in ``out_dir``; return its path.

    The page holds the model and task summary, the baseline, the layer x head heatmap, the top heads
    with their roles, the ablation curve, G&A cards for the best gather and aggregate heads, and
    circuitsvis views of the top heads' patterns; plotly's and circuitsvis's JavaScript are embedded
    once each, so the file renders with no network. With ``png`` the figures are also written to
    ``out_dir/figures/*.png`` when the export path (kaleido + a Chromium) works; otherwise the page
    says why.

    **Model work.** Everything but the cards and pattern views is read from files. Those need
    patterns: the model named in ``circuit.json`` is loaded (unless ``model`` is passed, as
    `gna scan` does) and runs **one forward** over the first ``n_cards`` task samples (the task is
    rebuilt from ``circuit.json`` unless ``task`` is passed) for the patterns of the card and view
    heads (SSM heads in the ``form`` implicit-attention form), plus one scoring pass over the same
    samples for the predicted answers. When the model cannot be loaded, those sections say why and
    the rest of the report is still written.
    """
    inputs = load_inputs(out_dir)
    heads = inputs.heads
    model, task, problem = _resolve(inputs, model, task)
    figures: dict[str, Any] = {"heatmap": score_heatmap(heads, title=f"Ablation drop per head: {_model_label(inputs)}")}
    sections = [_summary(inputs, model, task)]
    sections += ["<h2>Where the heads are</h2>", _note(
        "Drop of the task metric when each head alone is ablated (red = the head matters). "
        "G / A mark heads labelled gather / aggregate; #k marks the top-ranked heads. Hover for numbers."),
        figure_div(figures["heatmap"])]
    sections += ["<h2>Top heads and their roles</h2>", _top_table(heads)]
    sections.append("<h2>Ablation curve</h2>")
    if inputs.circuit.get("curve"):
        figures["ablation_curve"] = ablation_curve(inputs.circuit)
        sections += [_note("Task accuracy as the top-k discovered heads are removed together, beside k random "
                           "heads (mean and min-max over seeds)."), figure_div(figures["ablation_curve"])]
    else:
        sections.append(_note("circuit.json has no ablation curve (run `gna scan`, which computes it)."))
    if problem:
        sections += ["<h2>G&amp;A cards and patterns</h2>", _note(f"Not drawn: {problem}.")]
    else:
        sections += _model_sections(heads, card_heads(heads, inputs.pair), figures, model, task, n_cards, form)
    if png:
        sections.append(_png_section(inputs.folder, figures))
    out = inputs.folder / REPORT_FILE
    out.write_text(page(f"G&A report: {_model_label(inputs)}", sections, circuitsvis=True, plotly=True), encoding="utf-8")
    return out


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _model_label(inputs: ReportInputs) -> str:
    return inputs.model_spec or inputs.folder.name


def _kv_table(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
                   f"{html.escape(_fmt(v))}</td></tr>" for k, v in rows if v not in (None, "", {}))
    return f"<table>{body}</table>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(map(_fmt, v))
    return str(v)


def _summary(inputs: ReportInputs, model: Any, task: Any) -> str:
    c = inputs.circuit
    scan = inputs.scan
    kinds = scan["kind"].value_counts().to_dict() if "kind" in scan else {}
    rows: list[tuple[str, Any]] = [("model", _model_label(inputs))]
    if model is not None:
        rows += [("architecture", model.architecture), ("blocks", f"{model.n_layers} ({_fmt(dict(pd.Series(model.layer_kinds()).value_counts()))})")]
    pair = inputs.pair
    rows += [("heads scanned", f"{len(scan)} ({_fmt(kinds)})"),
             ("task", c.get("task") or getattr(task, "name", None)),
             ("scan", {k: c[k] for k in ("method", "metric", "strategy") if k in c} or None),
             ("baseline", inputs.baseline or None),
             ("G&A pair", f"gather {pair[0].name} → aggregate {pair[1].name}" if pair else None),
             ("role rule", c.get("rule")),
             ("written", time.strftime("%Y-%m-%d %H:%M"))]
    return "<h2>Model and task</h2>" + _kv_table(rows)


def _top_table(heads: pd.DataFrame) -> str:
    """The best-ranked heads; scan.csv keeps every column (hover the heatmap for all of them)."""
    top = heads.head(N_TOP)
    cols = [c for c in _TABLE_COLUMNS if c in top and top[c].notna().any()]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r[c]) if r[c] == r[c] else '')}</td>" for c in cols) + "</tr>"
                   for _, r in top.iterrows())
    return f"<div style='overflow-x:auto'><table class='top-heads'><tr>{head}</tr>{body}</table></div>"


def card_heads(heads: pd.DataFrame, pair: tuple[HeadRef, HeadRef] | None = None
               ) -> tuple[tuple[HeadRef, HeadRef] | None, str]:
    """The (gather, aggregate) heads for G&A cards and a sentence saying why: the discovered ``pair``
    when there is one, else (no head passes the role rule) the heads of ``heads`` (a frame with
    ``name, gather, aggregate`` columns, e.g. ``circuit.heads()``) with the highest gather and
    aggregate scores, as candidates."""
    if pair:
        g, a = pair
        return pair, (f"Discovered pair: gather head {g.name} reads each line from the line's last token; "
                      f"aggregate head {a.name} reads the lines' last tokens from the final token.")
    if not {"gather", "aggregate"} <= set(heads.columns) or heads[["gather", "aggregate"]].isna().all().any():
        return None, "No role scores in scan.csv, so no head to draw a card for."
    a = heads.loc[heads["aggregate"].idxmax(), "name"]
    rest = heads[heads["name"] != a]
    if rest.empty or rest["gather"].isna().all():
        return None, "Only one scored head, so no gather/aggregate pair to draw."
    g = rest.loc[rest["gather"].idxmax(), "name"]
    return (HeadRef.parse(g), HeadRef.parse(a)), (
        f"No head passes the role rule (circuit.json's pair is empty): the cards show the heads with the highest "
        f"gather score ({g}) and aggregate score ({a}) as candidates.")


def task_from_circuit(circuit: dict[str, Any]) -> Any:
    """Rebuild the KV-retrieval task that ``circuit.json`` records (``task`` with ``kind: "kv"``, as
    :func:`gna_interp.circuits.discover.task_description` writes it); ``None`` for other tasks."""
    from gna_interp.tasks import KVRetrieval

    spec = circuit.get("task")
    if isinstance(spec, dict) and spec.get("kind") == "kv":
        keys = ("n_pairs", "n_samples", "seed", "template", "max_value", "value_suffix", "words")
        return KVRetrieval(**{k: spec[k] for k in keys if k in spec})
    return None


def _resolve(inputs: ReportInputs, model: Any, task: Any) -> tuple[Any, Any, str | None]:
    """The model and task for the cards (loaded / rebuilt from circuit.json when not given), or why not."""
    from gna_interp.models.loading import load_model

    try:
        if model is None:
            if not inputs.model_spec:
                raise GnaError("circuit.json names no model")
            model = load_model(inputs.model_spec)
        task = task if task is not None else task_from_circuit(inputs.circuit)
        if task is None:
            raise GnaError("circuit.json records no KV-retrieval task to rebuild the samples from")
    except GnaError as e:
        return model, None, str(e)
    return model, task, None


def _model_sections(heads: pd.DataFrame, cards: tuple[tuple[HeadRef, HeadRef] | None, str],
                    figures: dict[str, Any], model: Any, task: Any, n_cards: int, form: str) -> list[str]:
    from gna_interp.patterns import patterns
    from gna_interp.tasks.scoring import score_candidates

    pair, why = cards
    out = ["<h2>G&amp;A cards</h2>", _note(why + (" One card per sample." if pair else ""))]
    samples = list(task.samples[:max(1, n_cards)])
    view = [HeadRef.parse(n) for n in heads["name"].head(N_VIEW)]
    wanted = list(dict.fromkeys((list(pair) if pair else []) + view))
    ps = patterns(model, [s.prompt for s in samples], heads=wanted, form=form)
    preds = score_candidates(model, samples).pred.tolist()
    if pair is not None:
        for i, s in enumerate(samples):
            name = f"ga_card_{i}"
            figures[name] = ga_card(ps, pair[0], pair[1], s.segments(model.tokenizer), sample=i, gold=s.gold,
                                    pred=preds[i], candidates=s.candidates)
            out.append(figure_div(figures[name]))
    out += ["<h2>Patterns of the top heads</h2>", _note(
        f"Sample 0, the {len(view)} best-ranked heads. Attention heads: softmax pattern. SSM heads: implicit "
        f"attention (form={form}) shown row-normalised, |M[t,s]| / sum_s |M[t,s]|. Hover a head to enlarge it."),
        attention_heads(ps, view, sample=0)]
    kinds = {h.kind for h in view}
    if "attn" in kinds and kinds - {"attn"}:
        a = next(h for h in view if h.kind == "attn")
        s = next(h for h in view if h.kind != "attn")
        figures["compare"] = compare_heads(ps, a, ps, s, sample=0)
        out += ["<h2>Attention vs SSM</h2>", figure_div(figures["compare"])]
    return out


def _png_section(folder: Path, figures: dict[str, Any]) -> str:
    try:
        paths = write_pngs(figures, folder / FIGURES_DIR)
    except RuntimeError as e:
        return "<h2>PNG files</h2>" + _note(f"Not written: {e}")
    links = "".join(f"<li><a href='{FIGURES_DIR}/{p.name}'>{p.name}</a></li>" for p in paths)
    return f"<h2>PNG files</h2><ul>{links}</ul>"
