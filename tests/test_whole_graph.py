"""The whole circuit (circuit.json's ``whole``): embeddings, heads, MLPs and logits joined by edges of an input and a
position class, with the share of the intact logit difference it keeps. It loads and saves with its circuit, is
refused in one line when it does not mean anything, is drawn as the report's graph (MLP squares, edges coloured by
input and dashed by position) and its nodes and edges answer clicks in Chromium."""

from __future__ import annotations

import json

import pytest

from gna_interp.circuits import Circuit, WholeCircuit
from gna_interp.cli import main
from gna_interp.errors import InputError
from gna_interp.viz.graph import POSITION_DASHES, whole_figure
from browser import CHROMIUM, click_point, graph_page
from made_up import edited_copy



def whole_doc(gather: str, aggregate: str, early: str, n_layers: int) -> dict:
    """A whole circuit over three heads of a model (``early`` and ``gather`` in earlier layers than ``aggregate``),
    two MLPs, the embeddings and the logits: exact edges with intervals, one screened only, both position classes."""
    g, a, e = (int(n[1:n.index("H")]) for n in (gather, aggregate, early))
    heads = [{"name": n, "kind": "head", "layer": layer, "role": role}
             for n, layer, role in ((early, e, ""), (gather, g, "gather"), (aggregate, a, "aggregate"))]
    nodes = [{"name": "embed", "kind": "embed", "layer": -1, "role": ""}, *heads,
             {"name": f"MLP{e}", "kind": "mlp", "layer": e, "role": ""},
             {"name": f"MLP{a}", "kind": "mlp", "layer": a, "role": ""},
             {"name": "logits", "kind": "logits", "layer": n_layers, "role": ""}]

    def edge(s, r, inp, pos, score, effect=None, low=None, high=None):
        return {"sender": s, "receiver": r, "input": inp, "positions": pos, "score": score, "effect": effect,
                "low": low, "high": high}

    edges = [edge("embed", early, "v", "items", 0.3, 0.25, 0.1, 0.4),
             edge(early, f"MLP{e}", "mlp", "items", 0.2),  # screened only
             edge(f"MLP{e}", aggregate, "k", "items", 0.4, 0.35, 0.2, 0.5),
             edge(gather, aggregate, "k", "items", 0.71, 0.99, 0.70, 1.29),
             edge(gather, aggregate, "q", "decision", 0.1, 0.05, -0.02, 0.12),
             edge(aggregate, f"MLP{a}", "mlp", "decision", 0.3, 0.4, 0.3, 0.5),
             edge(f"MLP{a}", "logits", "logits", "all", 0.5, 0.6, 0.5, 0.7),
             edge(aggregate, "logits", "logits", "all", 0.8, 0.9, 0.8, 1.0)]
    return {"metric": "logit_diff", "method": "mean", "threshold": 0.8, "kept": 0.85, "low": 0.76, "high": 0.97,
            "nodes": nodes, "edges": edges}


@pytest.fixture(scope="module")
def zoo_whole(tmp_path_factory):
    """A `gna scan` folder of the zoo Transformer whose circuit.json got a ``whole`` over its real heads (the scan's
    gather -> aggregate pair and another early head), and the report `gna report` rebuilds from it."""
    folder = tmp_path_factory.mktemp("whole") / "run"
    with pytest.MonkeyPatch.context() as mp:  # the scan's own report: no PNG export needed here
        mp.setattr("gna_interp.report.build.png_export_problem", lambda: "not needed by this test")
        assert main(["--device", "cpu", "scan", "--model", "zoo:transformer-kv", "--threads", "1", "--template",
                     "official", "--max-value", "9", "--pairs", "10", "--samples", "8", "--top-k", "1", "--seeds", "1",
                     "--no-control", "--out", str(folder)]) == 0
    circuit = Circuit.load(folder)
    gather, aggregate = circuit.pair()
    early = next(h for h in circuit.scan.heads if h.layer == gather.layer and h != gather)
    doc = json.loads((folder / "circuit.json").read_text())
    doc["whole"] = whole_doc(gather.name, aggregate.name, early.name, 2)
    (folder / "circuit.json").write_text(json.dumps(doc))
    assert main(["report", str(folder), "--no-png"]) == 0  # `gna report` rebuilds the page from the folder
    return folder


def test_the_whole_circuit_round_trips_with_its_circuit(zoo_whole, tmp_path):
    circuit = Circuit.load(zoo_whole)
    whole = circuit.whole
    assert isinstance(whole, WholeCircuit) and (whole.kept, whole.low, whole.high) == (0.85, 0.76, 0.97)
    assert whole.count("head") == 3 and whole.count("mlp") == 2 and len(whole.edges) == 8
    assert sum(e.measured for e in whole.edges) == 7
    doc = json.loads((zoo_whole / "circuit.json").read_text())["whole"]
    assert whole.to_dict() == doc
    again = Circuit.load(circuit.save(tmp_path / "again"))
    assert again.whole == whole
    again.whole = None
    assert "whole" not in again.to_dict()  # a plain scan's circuit.json has no such key
    assert "whole circuit" in circuit._repr_html_() and "keeps 85%" in circuit._repr_html_()
    text = whole.sentence()
    assert "keeps 85% (95% interval 76% to 97%)" in text and "7 nodes (3 heads, 2 MLPs) and 8 edges" in text


@pytest.mark.parametrize("change, needle", [
    (lambda w: w["edges"][0].update(receiver="L0H9"), "not one of the circuit's nodes"),
    (lambda w: w["edges"][3].update(sender=w["edges"][3]["receiver"], receiver=w["edges"][3]["sender"]),
     "does not come later"),
    (lambda w: w["edges"][1].update(input="k"), "reads ['mlp']"),
    (lambda w: w["edges"][3].update(low=2.0), "interval is reversed"),
    (lambda w: w["edges"].append(dict(w["edges"][0])), "listed twice"),
    (lambda w: w["nodes"][1].update(layer=1), "do not agree"),
    (lambda w: w["nodes"][4].update(name="MLP7"), "'MLP<layer>' at its layer"),
    (lambda w: w["nodes"].append({"name": "L1H7", "kind": "head", "layer": 1}), "not among the 8 scanned heads"),
    (lambda w: w["edges"][0].update(positions="lines"), "field 'whole/edges/0/positions'"),
    (lambda w: w.update(kept="most"), "field 'whole/kept'"),
    (lambda w: w["nodes"][0].update(kind="norm"), "field 'whole/nodes/0/kind'"),
])
def test_a_whole_circuit_without_meaning_is_refused_in_one_line(change, needle, zoo_whole, tmp_path, capsys):
    folder = edited_copy(zoo_whole, tmp_path / "run", lambda doc: change(doc["whole"]))
    with pytest.raises(InputError, match="whole"):
        Circuit.load(folder)
    assert main(["report", str(folder), "--no-png"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_the_whole_figure_draws_every_node_and_edge_styled_by_input_and_position():
    whole = WholeCircuit.from_dict(whole_doc("L2H1", "L5H0", "L1H3", 8))
    fig = whole_figure(whole, {"L2H1": 0.5, "L5H0": 1.0})
    traces = {t.name: t for t in fig.data if t.name}
    assert list(traces["heads"].customdata) == ["L1H3", "L2H1", "L5H0"]
    assert list(traces["nodes"].customdata) == ["embed", "MLP1", "MLP5", "logits"]
    assert list(traces["nodes"].marker.symbol) == ["triangle-right", "square", "square", "circle"]
    assert list(traces["edges"].customdata) == list(range(8))
    assert list(traces["edges"].marker.symbol).count("diamond-open") == 1  # the screened edge
    lines = [t for t in fig.data if t.mode == "lines" and t.x[0] is not None]
    assert len(lines) == 8
    assert [t.line.dash for t in lines] == [POSITION_DASHES[e.positions][0] for e in whole.edges]
    assert {t.line.dash for t in lines} == {"solid", "dash", "dot"}
    assert len({t.line.color for t in lines}) == 5  # v, mlp, k, q, logits
    widths = [t.line.width for t in lines]
    assert widths[3] == max(widths) == 10  # the strongest exact effect
    legend = {t.name for t in fig.data if t.x[0] is None}
    assert {"MLP", "embeddings", "logits", "-> mlp", "at the lines' tokens", "at the decision position",
            "at every position", "gather (causal)", "aggregate (causal)"} <= legend
    assert fig.layout.xaxis.ticktext[0] == "embed" and fig.layout.xaxis.ticktext[-1] == "logits"


def test_the_report_states_what_the_whole_circuit_keeps(zoo_whole):
    page = (zoo_whole / "report.html").read_text(encoding="utf-8")
    assert "How the heads work together: the whole circuit" in page
    assert "keeps 85% (95% interval 76% to 97%) of the intact logit difference" in page
    start = page.index('id="gna-graph-data">') + len('id="gna-graph-data">')
    data = json.loads(page[start:page.index("</script>", start)])
    assert len(data["edges"]) == 8 and data["nodes"]["MLP1"]["kind"] == "mlp"
    assert data["edges"][1]["effect"] is None and data["edges"][1]["score"] == 0.2
    summary = (zoo_whole / "summary.md").read_text(encoding="utf-8")
    assert "- whole circuit: The whole circuit keeps 85%" in summary and "Strongest edges: " in summary


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
def test_clicks_on_the_whole_graph_show_edges_heads_and_mlps(zoo_whole):
    """Real mouse clicks: an edge's diamond draws the sender's pattern beside the receiver's row; an MLP square lists
    its edges in and out with their effects; a head circle shows the head in the head box."""
    circuit = Circuit.load(zoo_whole)
    target = 3  # gather -> aggregate along the keys
    e = circuit.whole.edges[target]
    errors = []
    with graph_page(zoo_whole / "report.html", errors) as page:
        click_point(page, "edges", target, "document.querySelectorAll('#gna-edge-detail .js-plotly-plot').length >= 2")
        edge = page.evaluate("[document.getElementById('gna-edge-detail').dataset.edge, "
                             "document.getElementById('gna-edge-detail').innerText]")
        page.screenshot(path=str(zoo_whole / "whole_edge.png"))
        click_point(page, "nodes", "MLP0", "document.getElementById('gna-edge-detail').dataset.node === 'MLP0'")
        mlp = page.evaluate("document.getElementById('gna-edge-detail').innerText")
        click_point(page, "heads", e.receiver, "document.getElementById('gna-head-detail').dataset.head !== undefined")
        head = page.evaluate("document.getElementById('gna-head-detail').dataset.head")
        page.screenshot(path=str(zoo_whole / "whole_graph.png"))
    assert not errors, errors
    assert edge[0] == e.name and "0.990" in edge[1] and "0.700 to 1.290" in edge[1]
    assert "into MLP0 (1)" in mlp and "out of MLP0 (1)" in mlp and "screened only: screen score 0.200" in mlp
    assert head == e.receiver
    print(f"screenshots: {zoo_whole / 'whole_edge.png'} {zoo_whole / 'whole_graph.png'}")


def test_a_whole_circuit_as_gna_circuit_writes_it_loads():
    """The search's own count of edges (a shared key/value input is one edge there, one per head here) and edges at
    the other tokens are read, kept and said."""
    doc = whole_doc("L2H1", "L5H0", "L1H3", 8)
    doc["n_edges"] = 7
    doc["edges"].append({"sender": "L1H3", "receiver": "L5H0", "input": "other", "positions": "other", "score": 0.1,
                         "effect": None, "low": None, "high": None})
    whole = WholeCircuit.from_dict(doc)
    assert whole.n_edges == 7 and whole.to_dict() == doc
    assert "from 7 edges of the searched graph" in whole.sentence()
    lines = [t for t in whole_figure(whole).data if t.mode == "lines" and t.x[0] is not None]
    assert lines[-1].line.dash == POSITION_DASHES["other"][0]


def test_a_whole_circuit_of_thousands_of_edges_draws_its_strongest(monkeypatch):
    """Past MAX_DRAWN_EDGES the graph draws the strongest edges by |weight| (a 16,384-edge circuit of SmolLM2 took
    11 minutes to draw whole); each marker still names its edge's index in whole.edges, and the title says how many
    of how many are drawn."""
    from dataclasses import replace

    from gna_interp.viz import graph

    whole = WholeCircuit.from_dict(whole_doc("L2H1", "L5H0", "L1H3", 8))
    monkeypatch.setattr(graph, "MAX_DRAWN_EDGES", 3)
    strongest = sorted(range(8), key=lambda i: -abs(whole.edges[i].weight))[:3]
    fig = whole_figure(whole)
    traces = {t.name: t for t in fig.data if t.name}
    assert list(traces["edges"].customdata) == sorted(strongest)
    assert len([t for t in fig.data if t.mode == "lines" and t.x[0] is not None]) == 3
    assert "3 strongest edges of 8" in fig.layout.title.text
    assert "strongest" not in whole_figure(replace(whole, edges=whole.edges[:3])).layout.title.text
