"""The figures and pages read cleanly: token labels are cut only between words, a graph's nodes and edge markers
never sit on one another, its layer axis is ticked at the layers, edges between the same two nodes are drawn apart,
a table column keeps one number format, counts agree with their nouns and each note is shown once."""

from __future__ import annotations

import json
import math
import re
from html import unescape
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from gna_interp.circuits import Circuit, WholeCircuit
from gna_interp.cli import main
from gna_interp.mixing.pattern_set import PatternSet
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import TokenBatch
from gna_interp.report.build import _cells, build_report
from gna_interp.tasks.segments import Segments, Span
from gna_interp.viz import compare_heads, ga_card
from gna_interp.viz.edge_graph import edge_graph
from gna_interp.viz.graph import graph_figure, graph_section, whole_figure
from gna_interp.viz.layout import Frame
from gna_interp.viz.text import ELLIPSIS, agree, clip, counted

LONG = ["Here", " is", " a", " dictionary", ":", "\n", "information", " retrieval", ":", "7", "\n",
        "extraordinary", " circumstances", ":", "3", "\n", "supercalifragilistic", ":", "5", "\n", "What", "?"]
NOTE = "no LM-loss control: the neutral text cannot be scored by this model's vocabulary"


def _traces(fig) -> dict:
    return {t.name: t for t in fig.data if t.name}


def _frame(fig) -> Frame:
    return Frame(tuple(fig.layout.xaxis.range), tuple(fig.layout.yaxis.range), int(fig.layout.height))


def _assert_apart(fig, node_traces: tuple[str, ...]) -> None:
    """No two edge markers within 12 px of each other, none on a node, no two nodes at one place."""
    area, t = _frame(fig), _traces(fig)
    marks = list(zip(t["edges"].x, t["edges"].y))
    nodes = [(p, s) for name in node_traces
             for p, s in zip(zip(t[name].x, t[name].y),
                             t[name].marker.size if isinstance(t[name].marker.size, tuple)
                             else [t[name].marker.size] * len(t[name].x))]
    assert len({p for p, _ in nodes}) == len(nodes)
    assert all(area.pixels(a, b) >= 12 for a, b in combinations(marks, 2)), marks
    assert all(area.pixels(m, p) >= size / 2 + 5 for m in marks for p, size in nodes)


def _lines_between(fig, a: tuple[float, float], b: tuple[float, float]) -> list:
    return [t for t in fig.data if t.mode == "lines" and t.x[0] is not None
            and (t.x[0], t.y[0], t.x[-1], t.y[-1]) == (*a, *b)]


def _middle(trace) -> tuple[float, float]:
    i = len(trace.x) // 2
    return trace.x[i], trace.y[i]


@pytest.fixture(scope="module")
def zoo_scan(tmp_path_factory) -> Path:
    """A `gna scan` folder of the zoo Transformer whose circuit.json also holds a whole circuit of one MLP (with a
    key and a query edge between the same two heads) and its notes twice; the report rebuilt from it."""
    folder = tmp_path_factory.mktemp("clean") / "run"
    assert main(["--device", "cpu", "--quiet", "scan", "--model", "zoo:transformer-kv", "--threads", "1",
                 "--template", "official", "--max-value", "9", "--pairs", "10", "--samples", "8", "--seeds", "1",
                 "--calibrate", "0", "--no-control", "--no-png", "--out", str(folder)]) == 0
    doc = json.loads((folder / "circuit.json").read_text())
    doc["notes"] = doc["notes"] + [NOTE, NOTE.replace(": ", ":  ")]
    doc["whole"] = _whole_doc()
    (folder / "circuit.json").write_text(json.dumps(doc))
    build_report(folder, png=False)
    return folder


def _whole_doc() -> dict:
    """A whole circuit of the zoo model: embeddings, L0H3, L1H3, one MLP, logits; L0H3 reaches L1H3's key and query."""
    def edge(s, r, inp, pos, score, effect=None):
        return {"sender": s, "receiver": r, "input": inp, "positions": pos, "score": score, "effect": effect,
                "low": None if effect is None else effect / 2, "high": None if effect is None else effect * 2}

    nodes = [{"name": "embed", "kind": "embed", "layer": -1, "role": ""},
             {"name": "L0H3", "kind": "head", "layer": 0, "role": "gather"},
             {"name": "MLP0", "kind": "mlp", "layer": 0, "role": ""},
             {"name": "L1H3", "kind": "head", "layer": 1, "role": "aggregate"},
             {"name": "logits", "kind": "logits", "layer": 2, "role": ""}]
    edges = [edge("embed", "L0H3", "v", "items", 0.3, 0.25), edge("embed", "MLP0", "mlp", "all", 0.2),
             edge("MLP0", "L1H3", "k", "items", 0.4, 0.35), edge("L0H3", "L1H3", "k", "items", 0.9, 0.8),
             edge("L0H3", "L1H3", "q", "decision", 0.3, 0.2), edge("L1H3", "logits", "logits", "all", 0.8, 0.9),
             edge("L0H3", "logits", "logits", "all", 0.1, 0.05)]
    return {"metric": "logit_diff", "method": "mean", "threshold": 0.8, "kept": 0.85, "low": 0.7, "high": 0.95,
            "nodes": nodes, "edges": edges}


def _label_ok(label: str, text: str) -> bool:
    """Whether ``label`` is ``text`` whole, or a start of it that ends between two words, then an ellipsis."""
    if label == text:
        return True
    head = label.removesuffix(ELLIPSIS)
    cut = len(head)
    return label.endswith(ELLIPSIS) and text.startswith(head) and not (text[cut - 1].isalnum() and text[cut].isalnum())


def test_clip_cuts_only_between_words():
    assert clip("extraordinary circumstances:3", 24) == f"extraordinary{ELLIPSIS}"
    assert clip("dictionary", 5) == "dictionary"  # one long word: kept whole
    assert clip("a b c d e f", 4) == f"a b{ELLIPSIS}" and clip("short", 24) == "short"
    for text in LONG + ["informationretrieval:7", " dictionary: apple:1 banana:2"]:
        for limit in range(1, 16):
            assert _label_ok(clip(text, limit), text), (text, limit)


def test_heatmap_token_labels_are_never_cut_inside_a_word():
    n = len(LONG)
    heads = [HeadRef(0, 1, "attn"), HeadRef(1, 2, "attn")]
    pat = torch.tril(torch.ones(2, n, n))
    pat = pat / pat.sum(-1, keepdim=True)
    ps = PatternSet(TokenBatch(torch.zeros(1, n, dtype=torch.long), torch.ones(1, n, dtype=torch.long)), [LONG],
                    heads, {(0, "attn"): ([heads[0]], pat[None, :1]), (1, "attn"): ([heads[1]], pat[None, 1:])})
    ticks = list(compare_heads(ps, heads[0], ps, heads[1]).data[0].x)
    assert "3: dictionary" in ticks and "16:supercalifragilistic" in ticks
    assert all(_label_ok(t.split(":", 1)[1], LONG[i].replace("\n", "\\n")) for i, t in enumerate(ticks))
    seg = Segments((Span(0, 6), Span(6, 11), Span(11, 16), Span(16, 20)), None, n - 1, n, True)
    labels = ga_card(ps, heads[0], heads[1], seg).layout.yaxis.ticktext
    for i, (label, span) in enumerate(zip(labels, seg.items)):
        shown = unescape(re.match(rf"{i}: (.*) \(\d+% in\)", label).group(1))
        assert _label_ok(shown, "".join(LONG[span.start:span.stop]).strip()), label
    assert f"2: extraordinary{ELLIPSIS} (" in labels[2]


def test_the_scan_report_graph_keeps_markers_off_nodes_and_each_other(zoo_scan):
    circuit = Circuit.load(zoo_scan)
    circuit.whole = None
    _, fig = graph_section(circuit)
    assert fig is not None and len(fig.data[0].x) >= 2
    _assert_apart(fig, ("heads",))
    assert list(fig.layout.xaxis.tickvals) == [0, 1, 2] and fig.layout.xaxis.ticktext[-1] == "logits"


def test_a_skip_edge_and_parallel_edges_stay_clear_of_the_nodes():
    frame = pd.DataFrame({"name": ["L0H0", "L0H1", "L1H0", "L1H1"], "layer": [0, 0, 1, 1],
                          "drop": [2.0, 1.0, 2.0, 0.5], "causal_role": ["gather", "none", "aggregate", "none"]})
    rows = [("L0H0", "L1H0", "k"), ("L0H0", "L1H0", "q"), ("L0H0", "L1H0", "v"), ("L0H1", "L1H0", "k"),
            ("L0H1", "L1H1", "k"), ("L0H0", "logits", "logits"), ("L1H0", "logits", "logits")]
    edges = pd.DataFrame([{"edge": f"{s}->{r}.{i}", "sender": s, "receiver": r, "input": i, "positions": "items",
                           "effect": 1.0, "low": 0.5, "high": 1.5} for s, r, i in rows])
    fig = graph_figure(frame, edges)
    _assert_apart(fig, ("heads",))
    area = _frame(fig)
    parallel = [_middle(t) for t in _lines_between(fig, (0.0, -0.5), (1.0, -0.5))]
    assert len(parallel) == 3 and all(area.pixels(a, b) >= 15 for a, b in combinations(parallel, 2))


def test_the_edge_graph_is_ticked_at_the_layers_and_draws_parallel_edges_apart():
    rows = [("embed", "L0H3", "v", 0.5), ("L0H3", "L1H3", "k", 0.9), ("L0H3", "L1H3", "q", 0.6),
            ("embed", "MLP0", "mlp", 0.3), ("MLP0", "L1H3", "k", 0.4), ("L1H3", "logits", "logits", 0.8)]
    table = pd.DataFrame([{"sender": s, "receiver": r, "input": i, "positions": "items", "score": v,
                           "effect": math.nan, "low": math.nan, "high": math.nan} for s, r, i, v in rows])
    fig = edge_graph(SimpleNamespace(table=table))
    assert list(fig.layout.xaxis.tickvals) == [-1, 0, 1, 2]
    assert list(fig.layout.xaxis.ticktext) == ["embed", "0", "1", "logits"]
    k, q = _lines_between(fig, (0.0, 0.0), (1.0, 0.0))
    assert _frame(fig).pixels(_middle(k), _middle(q)) >= 15
    assert counted(1, "strongest edge") in edge_graph(SimpleNamespace(table=table.head(1))).layout.title.text


def test_the_whole_circuit_graph_is_ticked_at_the_layers_with_its_edges_apart():
    fig = whole_figure(WholeCircuit.from_dict(_whole_doc()), {"L0H3": 1.0, "L1H3": 2.0})
    assert list(fig.layout.xaxis.tickvals) == [-1, 0, 1, 2]
    assert list(fig.layout.xaxis.ticktext) == ["embed", "0", "1", "logits"]
    _assert_apart(fig, ("heads", "nodes"))
    k, q = _lines_between(fig, (0.0, 0.0), (1.0, 0.0))
    assert _frame(fig).pixels(_middle(k), _middle(q)) >= 15


def test_a_table_column_keeps_one_number_format():
    frame = pd.DataFrame({"rank": [1, 2, 3], "aggregate": [0.01136, 1.887e-10, 0.8656], "drop": [18.05, -0.07899, 0.0],
                          "circuit_rank": [1.0, math.nan, 2.0], "source": ["exact", "exact", "estimate"]})
    cells = _cells(frame, list(frame.columns))
    assert [r[1] for r in cells] == ["0.011", "0.000", "0.866"]
    assert [r[2] for r in cells] == ["18.1", "-0.079", "0.000"]
    assert [r[0] for r in cells] == ["1", "2", "3"] and [r[3] for r in cells] == ["1", "", "2"]
    assert cells[2][4] == "estimate"


def test_the_report_has_one_format_per_column_agreeing_counts_and_each_note_once(zoo_scan):
    page = (zoo_scan / "report.html").read_text(encoding="utf-8")
    table = page[page.index("class='top-heads'"):]
    table = table[:table.index("</table>")]
    cells = [c.strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", table, re.S)]
    numbers = [c for c in cells if re.fullmatch(r"-?[\d.e+-]+", c)]
    assert numbers and all(re.fullmatch(r"-?\d+(\.\d{1,3})?", c) for c in numbers), numbers
    text = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # the words, not the bundled libraries
    assert "1 MLP)" in text and not re.search(r"(?<![\d.])1 (MLP|head|edge|node)s\b", text)
    assert unescape(text).count(NOTE) == 1
    assert agree("4 nodes (3 heads, 1 MLPs) and 1 edges; 11 heads") == "4 nodes (3 heads, 1 MLP) and 1 edge; 11 heads"

