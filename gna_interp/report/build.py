"""`build_report(out_dir)`: the self-contained ``report.html`` of a `gna scan` output folder."""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.search.views import CardViews
from gna_interp.constants import FIGURES_DIR, REPORT_FILE, SCAN_CSV, SUMMARY_MD
from gna_interp.errors import InputError, ReportWarning
from gna_interp.run_folder import check_writable
from gna_interp.report.summary import circuit_summary, format_lines, md_escape
from gna_interp.store import atomic_write
from gna_interp.tasks.calibration import Calibration
from gna_interp.viz.attention import attention_heads
from gna_interp.viz.cards import ga_card
from gna_interp.viz.compare import compare_heads
from gna_interp.viz.curves import ablation_curve
from gna_interp.viz.delegation import delegation_figure
from gna_interp.viz.export import png_export_problem, write_pngs
from gna_interp.viz.graph import graph_section
from gna_interp.viz.head_view import HEATMAP_ID, head_explorer
from gna_interp.viz.html import IsolatedParts, figure_div, page, part
from gna_interp.viz.scores import score_heatmap
from gna_interp.viz.stability import stability_plot
from gna_interp.viz.text import agree, counted

N_TOP = 15
_TABLE_COLUMNS = ("rank", "circuit_rank", "name", "kind", "role", "offset", "drop", "ablated", "source", "est_drop",
                  "control_drop", "specificity", "gather", "aggregate", "gold_share", "sharpness")


def build_report(out_dir: str | Path, *, png: bool = True, circuit: Circuit | None = None) -> Path:
    """Write ``out_dir/report.html`` from the circuit saved in ``out_dir`` (:meth:`Circuit.save
    <gna_interp.circuits.search.circuit.Circuit.save>`); return its path. No model is loaded or run.

    The page holds the model and task summary, the baseline, the layer x head heatmap (click any cell: that
    head's pattern on the first card sample and its numbers, :func:`~gna_interp.viz.head_view.head_explorer`),
    the top heads with their roles, the ablation curve, G&A cards for the gather and aggregate heads and circuitsvis
    views of the top heads' patterns (from ``views.pt``, which discovery computed beside the model);
    plotly's and circuitsvis's JavaScript are embedded once each, so the file renders with no network.
    With ``png`` the figures are also written to ``out_dir/figures/*.png`` when the export path
    (kaleido + a Chromium) works; otherwise the page says why. ``out_dir/summary.md`` gets the Markdown summary
    (:func:`~gna_interp.report.summary.circuit_summary`). ``circuit``: the circuit just saved there, when the caller
    holds it (it is then not read back).
    """
    folder = Path(out_dir)
    if not (folder / SCAN_CSV).is_file():
        raise InputError(f"{folder} has no {SCAN_CSV}: run `gna scan --out {folder}` first (the report reads its output)")
    check_writable(folder, (REPORT_FILE, SUMMARY_MD), (FIGURES_DIR,), "the report folder")
    if circuit is not None and not isinstance(circuit, Circuit):
        raise InputError(f"circuit must be the Circuit saved in {folder} (or None: read it from there), got "
                         f"{type(circuit).__name__}")
    circuit = Circuit.load(folder) if circuit is None else circuit
    label = circuit.model
    figures: dict[str, Any] = {}
    parts = IsolatedParts()
    heads = _frame(circuit, parts)
    parts.add("Model and task", lambda: [_summary(circuit)])
    if circuit.calibration is not None:
        parts.add("Task form", lambda: [_h("Task form"), _calibration_table(circuit.calibration)])
    parts.add("Where the heads are", lambda: _into(figures, lambda f: _heatmap_section(circuit, heads, f)))
    parts.add("Top heads and their roles", lambda: [_h("Top heads and their roles"), _top_table(heads)])
    parts.add("How the heads work together", lambda: _into(figures, lambda f: _graph_section(circuit, f)))
    if circuit.formats:
        parts.add("Retrieval formats", lambda: [_h("Retrieval formats"), _formats_table(heads, circuit)])
    parts.add("Delegation", lambda: _into(figures, lambda f: _delegation_section(circuit, f)))
    parts.add("Ablation curve", lambda: _into(figures, lambda f: _curve_section(circuit, f)))
    parts.add("Rank stability", lambda: _into(figures, lambda f: _stability_section(circuit, f)))
    if circuit.views is None:
        parts.add("G&A cards and patterns", lambda: [
            _h("G&A cards and patterns"),
            _note("Not drawn: the circuit was saved without views (discover with n_cards >= 1 keeps them).")])
    else:
        parts.add("G&A cards and patterns", lambda: _into(figures, lambda f: _view_sections(circuit.views, f)))
    if png:
        _png_section(folder, figures, parts)
    out = folder / REPORT_FILE
    atomic_write(folder / SUMMARY_MD, _summary_md(circuit, parts))
    atomic_write(out, page(f"G&A report: {label}", parts.sections, circuitsvis=True, plotly=True))
    for failed in parts.failed:
        warnings.warn(f"report part not drawn ({failed}); report.html and summary.md say so", ReportWarning,
                      stacklevel=2)
    return out


def _into(figures: dict[str, Any], build: Any) -> list[str]:
    """``build(mine)`` with a figure dict of its own, merged into ``figures`` only when the part is built whole
    (a part that fails half-way leaves no figure behind for the PNG export)."""
    mine: dict[str, Any] = {}
    out = build(mine)
    figures.update(mine)
    return out


def _frame(circuit: Circuit, parts: IsolatedParts) -> pd.DataFrame:
    """The circuit frame the page's parts read; the scan's own frame when the circuit's (roles, control, edges
    merged in) cannot be built (noted)."""
    try:
        return circuit.to_frame()
    except Exception as e:  # noqa: BLE001 -- the page still shows the scan
        parts.fail("Roles and causal roles", e)
        return circuit.scan.to_frame().assign(role="unscored")


def _heatmap_section(circuit: Circuit, heads: pd.DataFrame, figures: dict[str, Any]) -> list[str]:
    fig = score_heatmap(heads, title=f"Ablation drop per head: {circuit.model}")
    out = [_h("Where the heads are"), _note(
        "Drop of the task metric when each head alone is ablated (red = the head matters). "
        "G / A mark heads labelled gather / aggregate; #k marks the top-ranked heads. Hover for numbers; click a "
        "cell for the head's pattern and numbers below."),
        figure_div(fig, div_id=HEATMAP_ID), head_explorer(heads, circuit.views)]
    figures["heatmap"] = fig
    return out


def _graph_section(circuit: Circuit, figures: dict[str, Any]) -> list[str]:
    graph, fig = graph_section(circuit)
    if fig is not None:
        figures["circuit_graph"] = fig
    if circuit.whole is not None:
        return [_h("How the heads work together: the whole circuit"), _note(circuit.whole.sentence()), _note(
            "Nodes: the embeddings (left), the heads at their layer (colour: causal role; size: the head's drop), "
            "the MLPs (squares, half a layer after their block's heads) and the answer logits (right). Each edge is "
            "the drop of the logit difference when only that path is removed (its width; the screen score where it "
            "was not measured exactly, drawn with an open diamond), coloured by the input it reaches (a head's "
            "query, key or value, an MLP's input, the logits) and dashed by where it acts (solid: the lines' tokens; "
            "dashed: the decision position; dotted: every position). Faint edges were only screened, or their 95% "
            "interval reaches 0."), graph]
    return [_h("How the heads work together"), _note(
        "Path patching among the top heads: each edge is the drop of the logit difference when only that path is "
        "removed -- the sender's write into one later head's keys or values at the lines' tokens (gather -> "
        "aggregate), into its query at the decision position, or straight into the answer logits -- with its 95% "
        "interval; dashed edges' intervals reach 0. Node colour: the causal role; size: the head's drop."), graph]


def _figure_section(title: str, key: str, fig: Any, note: str, figures: dict[str, Any]) -> list[str]:
    figures[key] = fig
    return [_h(title), _note(note), figure_div(fig)]


def _curve_section(circuit: Circuit, figures: dict[str, Any]) -> list[str]:
    if circuit.curve.empty:
        return [_h("Ablation curve"), _note("The circuit has no ablation curve (run `gna scan`, which computes it).")]
    return _figure_section("Ablation curve", "ablation_curve", ablation_curve(circuit), (
        "Task accuracy as the top-k circuit heads are removed together, beside k random heads (median and min-max "
        "over seeds) and the generic heads; the right panel, when present, is the LM loss on neutral text for the "
        "same removals (the control)."), figures)


def _stability_section(circuit: Circuit, figures: dict[str, Any]) -> list[str]:
    stability = circuit.scan.stability()
    if not stability:
        return []
    return _figure_section("Rank stability", "stability", stability_plot(stability), (
        "Each exactly run head's drop on the even samples against the odd samples: a ranking that holds up puts the "
        "same heads at the top of both halves. scan.csv's drop_lo / drop_hi give each drop's 95% bootstrap "
        "interval."), figures)


def _summary_md(circuit: Circuit, parts: IsolatedParts) -> str:
    """summary.md: :func:`circuit_summary`, then a note per page part that could not be drawn; a short summary
    saying why when the full one cannot be written."""
    try:
        text = circuit_summary(circuit)
    except Exception as e:  # noqa: BLE001 -- the rest of the report is still written
        parts.fail(SUMMARY_MD, e)
        text = f"# G&A circuit: {md_escape(str(circuit.model))}\n\n- the summary could not be written; the results files are complete\n"
    if parts.failed:
        text += "\n## Report notes\n\n" + "".join(f"- not drawn: {md_escape(f)}\n" for f in parts.failed)
    return text


def _formats_table(heads: pd.DataFrame, circuit: Circuit) -> str:
    """The circuit's first heads by consistent effect, with their relative drop in every format."""
    names = [circuit.task.get("name", "task"), *circuit.formats]
    top = heads[heads["circuit_rank"].notna()].sort_values("circuit_rank").head(N_TOP)
    cols = ["circuit_rank", "name", "consistent"] + [f"rel_drop_{n}" for n in names]
    return part("table", cols, _cells(top, cols)) + "".join(_note(t.lstrip("- ")) for t in format_lines(circuit))


def _calibration_table(cal: Calibration) -> str:
    """The grid of task forms the intact model was measured on, the chosen one in bold, and the rule."""
    keys = list(dict.fromkeys(k for r in cal.rows for k in r.form))
    rows = [[str(r.form.get(k, "")) for k in keys] + [r.task, f"{r.accuracy:.3f}", f"{r.chance:.3f}", f"{r.tokens:.0f}",
                                                      r.verdict] for r in cal.rows]
    styles = ["font-weight:bold" if r.verdict == "chosen" else None for r in cal.rows]
    return (part("table", keys + ["task", "accuracy", "chance", "prompt tokens", "verdict"], rows, styles=styles)
            + "".join(_note(t) for t in cal.sentences()))


def _h(text: str, level: int = 2) -> str:
    return part("heading", text, level)


def _note(text: str) -> str:
    """A note, its counts of one in the singular (sentences come from many modules)."""
    return part("note", agree(text))


def _kv_table(rows: Sequence[tuple[str, Any]]) -> str:
    return part("table", None, [[k, agree(_fmt(v))] for k, v in rows if v not in (None, "", {})], row_heads=True,
                left=True)


def _once(notes: Sequence[str]) -> list[str]:
    """``notes`` with each note once (a note repeated, whatever its spacing, is shown where it first stands)."""
    return list({" ".join(str(n).split()): None for n in notes})


def _number(v: float) -> str:
    """A measured value in fixed notation: three significant digits, at most three decimals (a value that rounds
    to 0 shows as 0.000, never in e-notation)."""
    if not math.isfinite(v):
        return str(v)
    size = abs(float(f"{v:.3g}"))  # rounded first: 9.996 is 10.0, not 10.00
    decimals = 3 if size == 0 else min(3, max(0, 2 - math.floor(math.log10(size))))
    text = f"{v:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text


def _is_number(v: Any) -> bool:
    """Whether ``v`` is a number (a Python or NumPy int or float; not a bool)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _cell(v: Any, whole: bool) -> str:
    """A table cell: blank where missing, a number as an integer (``whole``) or by :func:`_number`, else text."""
    if v is None or (_is_number(v) and v != v):
        return ""
    if _is_number(v):
        return str(int(v)) if whole else _number(float(v))
    return _fmt(v)


def _cells(frame: pd.DataFrame, cols: Sequence[str]) -> list[list[str]]:
    """The rows of ``frame``'s ``cols`` as table cells, one number format per column: integers where all the
    column's numbers are whole, else :func:`_number`."""
    out = []
    for c in cols:
        whole = all(float(v).is_integer() for v in frame[c] if _is_number(v) and v == v)
        out.append([_cell(v, whole) for v in frame[c]])
    return [list(row) for row in zip(*out)]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(map(_fmt, v))
    return str(v)


def _summary(circuit: Circuit) -> str:
    scan = circuit.scan
    kinds = dict(Counter(h.kind for h in scan.heads))
    pair = circuit.pair()
    rows: list[tuple[str, Any]] = [
        ("model", circuit.model), ("heads scanned", f"{len(scan.heads)} ({_fmt(kinds)})"),
        ("task", circuit.task.get("name")),
        ("scan", {"method": scan.method, "metric": scan.metric, "strategy": scan.strategy}),
        ("baseline", {k: v for k, v in circuit.baseline.items() if isinstance(v, (int, float))} or None),
        ("G&A pair", f"gather {pair[0].name} → aggregate {pair[1].name}" if pair else None),
        ("role rule", circuit.rule.to_dict()),
        ("generic heads", ", ".join(h.name for h in circuit.generic) or ("none" if circuit.control else None)),
        ("knowledge twin", {key: circuit.twin[key] for key in ("task", "k", "intact", "top", "random_median")}
         if circuit.twin else None),
        ("notes", " | ".join(_once(circuit.notes)) or None),
        ("written", time.strftime("%Y-%m-%d %H:%M"))]
    return _h("Model and task") + _kv_table(rows)


def _top_table(heads: pd.DataFrame) -> str:
    """The best-ranked heads; scan.csv keeps every column (hover the heatmap for all of them)."""
    top = heads.head(N_TOP)
    cols = [c for c in _TABLE_COLUMNS if c in top and top[c].notna().any()
            and not (c == "offset" and (top[c].fillna(0) == 0).all())]  # offsets only where some head reads late
    return part("table", cols, _cells(top, cols), cls="top-heads", scroll=True)


def _delegation_section(circuit: Circuit, figures: dict[str, Any]) -> list[str]:
    """The hybrid's roles per head kind and the cost of removing each kind's aggregate heads; nothing for a
    model of one kind."""
    d = circuit.delegation
    if d is None:
        if {h.adapter.normalized_rows for h in circuit.scan.heads} == {True, False}:
            return [_h("Delegation"), _note("Not measured: this circuit was saved without it (discover with "
                                                  "delegation=True, the default, measures it on hybrids; rerun `gna scan`).")]
        return []
    out = [_h("Delegation: which kind of head takes which role"), _note(
        "A hybrid's heads grouped by kind. Roles from the pattern scores, each head read at its summary offset "
        "(+d: the lines read d tokens after their end, where an SSM convolution carries them). Then each kind's "
        "aggregate heads are removed together (zero ablation), beside as many random heads of the same kind "
        "(median over the draws), on the retrieval task and on a knowledge task that needs no retrieval.")]
    kinds = d.kinds
    roles = d.roles
    rows = [("heads (scored)", lambda k: f"{int(k['heads'])} ({int(k['scored'])})"),
            ("aggregate / gather / other", lambda k: f"{int(k['aggregate_heads'])} / {int(k['gather_heads'])} / "
                                                     f"{int(k['other_heads'])}"),
            ("labelled heads", lambda k: ", ".join(
                f"{r['name']} {r['role'][0].upper()}" + (f" +{int(r['offset'])}" if r["offset"] else "")
                for _, r in roles[(roles["kind"] == k["kind"]) & roles["role"].isin(["gather", "aggregate"])].iterrows())
             or "none"),
            *[(f"{score}: mean / max", lambda k, score=score: f"{_number(k[score + '_mean'])} / "
                                                            f"{_number(k[score + '_max'])}")
              for score in ("aggregate", "selectivity", "gather")]]
    out.append(part("table", [""] + [str(k["title"]) for _, k in kinds.iterrows()],
                    [[name] + [fn(k) for _, k in kinds.iterrows()] for name, fn in rows], cls="delegation-roles",
                    row_heads=True))
    know = d.knowledge
    unit = ("LM loss, nats/token" if know["metric"] == "lm_loss" else know["metric"]) if know else ""
    cols = ["kind", "heads removed", "retrieval: intact", "removed", "random (median)"]
    if know:
        cols += [f"{know['name']} ({unit}): intact", "removed", "random (median)"]
    lines = []
    for _, k in kinds[kinds["aggregate_heads"] > 0].iterrows():
        cells = [str(k["title"]), str(k["removed"]).replace(",", ", "), _number(k["retrieval_intact"]),
                 _number(k["retrieval_removed"]),
                 f"{_number(k['retrieval_random'])} ({counted(int(k['random_draws']), 'draw')})"
                 if k["random_draws"] else "no draw"]
        if know:
            cells += [_number(k["knowledge_intact"]), _number(k["knowledge_removed"]),
                      _number(k["knowledge_random"]) if k["random_draws"] else ""]
        lines.append(cells)
    if lines:
        out += [_h("Removing each kind's aggregate heads", 3), part("table", cols, lines, cls="delegation-removal")]
        figures["delegation"] = delegation_figure(d)
        out.append(figure_div(figures["delegation"]))
    else:
        out.append(_note("No head of any kind is labelled aggregate: nothing to remove."))
    if d.notes:
        out.append(_note(" | ".join(_once(d.notes))))
    return out


def _view_sections(views: CardViews, figures: dict[str, Any]) -> list[str]:
    pair, ps = views.pair, views.patterns
    out = [_h("G&A cards"), _note(views.why + (" One card per sample." if pair else ""))]
    if pair is not None:
        for i, seg in enumerate(views.segments):
            name = f"ga_card_{i}"
            figures[name] = ga_card(ps, pair[0], pair[1], seg, sample=i, gold=views.gold[i], pred=views.pred[i],
                                    candidates=views.candidates[i])
            out.append(figure_div(figures[name]))
    view = views.view
    out += [_h("Patterns of the top heads"), _note(
        f"Sample 0, the {counted(len(view), 'best-ranked head')}. Attention heads: softmax pattern. SSM heads: "
        f"implicit attention (form={ps.options.form}) shown row-normalised, |M[t,s]| / sum_s |M[t,s]|. Hover a head to "
        f"enlarge it."), attention_heads(ps, view, sample=0).fragment]
    soft = [h for h in view if h.adapter.normalized_rows]
    implicit = [h for h in view if not h.adapter.normalized_rows]
    if soft and implicit:
        figures["compare"] = compare_heads(ps, soft[0], ps, implicit[0], sample=0)
        out += [_h("Attention vs SSM"), figure_div(figures["compare"])]
    return out


def _png_section(folder: Path, figures: dict[str, Any], parts: IsolatedParts) -> None:
    """The PNG files' links, or a note: why they were not written (no export path here: a note only; an export
    that failed, or wrote only some: a part not drawn)."""
    problem = png_export_problem()
    if problem is not None:
        parts.sections += [_h("PNG files"), _note(f"Not written: {problem}")]
        return
    try:
        paths = write_pngs(figures, folder / FIGURES_DIR)
    except Exception as e:  # noqa: BLE001 -- the HTML page has the same figures
        parts.fail("PNG files", e)
        return
    parts.sections += [_h("PNG files"), part("links", [(f"{FIGURES_DIR}/{p.name}", p.name) for p in paths])]
