"""Discovery algorithms behind one signature: each registered algorithm returns what the function it wraps returns,
the exact node scores are a plain ablate-and-evaluate loop's drops, the registry refuses unknown names and options
naming the closest, the circuit search reads any algorithm's scores as it reads the ranking it takes today, and a new
algorithm is one decorated function in one file."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

import gna_interp as gna
import gna_interp.circuits.algorithms as algorithms_pkg
from gna_interp.circuits.algorithms import GraphScores, algorithm, algorithms, score_graph, unregister_algorithm
from gna_interp.circuits.algorithms import registry
from gna_interp.circuits.edges.edge_circuit import EdgeCircuit
from gna_interp.models.graph import Edge
from gna_interp.circuits.edges.edge_screen import screen_edges
from gna_interp.circuits.scan import scan_heads
from gna_interp.circuits.search.sufficiency import edge_faithfulness, faithfulness
from gna_interp.engine.metrics import LOGIT_DIFF, results
from gna_interp.errors import HeadError, InputError, OptionError
from gna_interp.models.graph import node_kind

SHIPPED = ("exact", "attribution", "auto", "eap", "eap_ig", "edge_exact")


def _task(model=None):
    return gna.KVRetrieval(3, 6, seed=1, max_value=9, words=getattr(model, "kv_words", None))


@pytest.fixture(scope="module")
def zoo():
    return gna.load_model("zoo:transformer-kv")


def _screen_scores(screen) -> dict[str, float]:
    """The screen's rows by the names the edge algorithms give them, written out here."""
    out = {}
    for r in screen.table.itertuples():
        out[Edge(r.sender, r.receiver, r.input, r.positions).name] = r.score
    return out


def _some_wires(model, task) -> list[Edge]:
    """A few edges of every kind: out of the embeddings, heads and MLPs, into heads, MLPs and the logits."""
    every = EdgeCircuit(model, task, "zero", senders="all").wires()
    kinds: dict[tuple[str, str], list[Edge]] = {}
    for w in every:
        kinds.setdefault((node_kind(w.sender), w.input[:3]), []).append(w)
    return [w for ws in kinds.values() for w in ws[:2]]


def _direct(name: str, model, task):
    """What each shipped algorithm wraps, called directly: its scores and which names are measured exactly."""
    if name in ("exact", "attribution", "auto"):
        scan = scan_heads(model, task, strategy=name, progress=False)
        return {h.name: d for h, d in scan.drops().items()}, {h.name for h in scan.exact}
    if name in ("eap", "eap_ig"):
        return _screen_scores(screen_edges(model, task, verify=0, ig_steps=3 if name == "eap_ig" else 0)), set()
    wires = _some_wires(model, task)
    ec = EdgeCircuit(model, task, "zero", senders="all")
    intact = LOGIT_DIFF.value(results(ec.clean()))
    drops = [intact - LOGIT_DIFF.value(results(s)) for s in ec.run_without([[w] for w in wires])]
    return dict(zip((w.name for w in wires), drops)), {w.name for w in wires}


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("which", ["llama", "zoo"])
def test_each_algorithm_returns_what_it_wraps(name, which, tiny_models, zoo):
    model = tiny_models["llama"] if which == "llama" else zoo
    task = _task(model)
    options = {"exact": {"progress": False}, "attribution": {"progress": False}, "auto": {"progress": False},
               "eap": {}, "eap_ig": {"ig_steps": 3}, "edge_exact": {"wires": _some_wires(model, task)}}[name]
    got = score_graph(model, task, name, **options)
    want, exact = _direct(name, model, task)
    assert got.algorithm == name and got.unit == ("nodes" if name in SHIPPED[:3] else "edges")
    assert got.scores == want  # exactly: the same numbers, under the graph's names
    assert list(got.scores) == list(want) and got.exact == exact
    assert got.seconds > 0 and got.metric == "logit_diff"
    assert got.exact_runs == len(exact) and got.gradient_passes == {"attribution": 1, "auto": 1, "eap": 1,
                                                                       "eap_ig": 3}.get(name, 0)


@pytest.mark.parametrize("which", ["llama", "zoo"])
def test_exact_node_scores_are_the_drops_of_a_plain_loop(which, tiny_models, zoo):
    """Each head ablated with ``gna.ablate`` and the task evaluated with ``gna.evaluate``, one head at a time."""
    model = tiny_models["llama"] if which == "llama" else zoo
    task = _task(model)
    got = score_graph(model, task, "exact", progress=False)
    intact = gna.evaluate(model, task, progress=False).logit_diff
    for head in model.heads():
        with gna.ablate(model, [head]):
            ablated = gna.evaluate(model, task, progress=False).logit_diff
        assert got.scores[head.name] == pytest.approx(intact - ablated, abs=1e-4), head.name
    frame = got.to_frame()
    assert list(frame.columns) == ["name", "kind", "layer", "score", "exact", "abs_rank"]
    assert list(frame["name"]) == got.ranked() and frame["exact"].all() and set(frame["kind"]) == {"head"}
    assert list(frame["score"].abs()) == sorted(frame["score"].abs(), reverse=True)


def test_unknown_names_and_options_are_refused_naming_the_closest(tiny_models):
    model, task = tiny_models["llama"], _task()
    assert set(SHIPPED) <= set(algorithms())
    with pytest.raises(OptionError, match="unknown discovery algorithm 'eap_gi'; did you mean 'eap_ig'"):
        score_graph(model, task, "eap_gi")
    with pytest.raises(OptionError, match="Registered: .*edge_exact"):
        score_graph(model, task, "acdc")
    with pytest.raises(OptionError, match="did you mean 'verify'"):
        score_graph(model, task, "eap", verfy=3)
    with pytest.raises(OptionError, match="did you mean 'batch_size'"):  # the scan's own options, checked by it
        score_graph(model, task, "exact", batchsize=3)
    with pytest.raises(OptionError, match="ig_steps >= 1"):
        score_graph(model, task, "eap_ig", ig_steps=0)
    with pytest.raises(OptionError, match="already registered"):
        algorithm("eap")(lambda model, task: GraphScores("nodes", {}))
    with pytest.raises(OptionError, match="lower-case name"):
        algorithm("EAP-IG")(lambda model, task: GraphScores("nodes", {}))
    with pytest.raises(InputError, match="receiver input"):
        score_graph(model, task, "edge_exact", wires=["L0H0 -> L1H0@items"])


def test_graph_scores_rank_by_size_and_refuse_what_is_not_the_graph():
    s = GraphScores("nodes", {"L0H1": 0.5, "L1H0": -2.0, "MLP0": math.nan, "L0H0": 0.5, "embed": 1.0})
    assert s.ranked() == ["L1H0", "embed", "L0H1", "L0H0", "MLP0"] and s.ranked(2) == ["L1H0", "embed"]
    assert [h.name for h in s.heads()] == ["L1H0", "L0H1", "L0H0"]
    assert "5 nodes" in repr(s) and "L1H0 -2" in repr(s)
    e = GraphScores("edges", {"L0H0 -> logits": 0.1, "embed -> L1H0+L1H1.k@items": 0.3},
                    exact={"L0H0 -> logits"})
    assert [w.name for w in e.wires()] == ["embed -> L1H0+L1H1.k@items", "L0H0 -> logits"]
    assert e.to_frame()[["sender", "receiver", "input", "positions", "exact"]].values.tolist() == [
        ["embed", "L1H0+L1H1", "k", "items", False], ["L0H0", "logits", "logits", "all", True]]
    assert e.edge_rows().values.tolist() == [["L0H0", "logits", "logits", "all", 0.1],
                                             ["embed", "L1H0", "k", "items", 0.3]]
    for unit, scores, why in [("heads", {}, "unit must be"), ("nodes", {"X9": 1.0}, "malformed"),
                              ("nodes", {"L0H0 -> logits@all": 1.0}, "malformed"),
                              ("edges", {"L0H0": 1.0}, "not an edge name"),
                              ("edges", {"L0H0 -> MLPx@all": 1.0}, "malformed MLP"), ("nodes", ["L0H0"], "mapping"),
                              ("edges", {"logits -> MLP1@items": 1.0}, "send nothing"),
                              ("edges", {"L0H0 -> L1H0@items": 1.0}, "HEAD.INPUT")]:
        with pytest.raises((InputError, HeadError), match=why):
            GraphScores(unit, scores)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="have no score"):
        GraphScores("nodes", {"L0H0": 1.0}, exact={"L0H1"})
    with pytest.raises(InputError, match="edge scores"):
        e.heads()
    with pytest.raises(InputError, match="node scores"):
        s.wires()


def test_faithfulness_reads_node_scores_as_the_head_ranking_it_takes(models):
    model, task = models("llama"), _task()
    scores = score_graph(model, task, "auto", progress=False, certify=3)
    scan = scores.detail
    today = sorted(scan.heads, key=lambda h: -abs(scan.drop(h)))  # a scan's heads, largest |drop| first
    kw = dict(method="zero", sizes=[1, 2, 4], seeds=1, threshold=0.5, minimality=2, n_boot=200)
    a, b = faithfulness(model, task, scores, **kw), faithfulness(model, task, today, **kw)
    assert a.to_frame().equals(b.to_frame()) and a.smallest == b.smallest and a.minimality == b.minimality
    first = a.to_frame().query("series == 'ranked' and size == 1")["heads"].iloc[0]
    assert first == today[0].name != model.heads()[0].name  # the scores' order, not the model's
    with pytest.raises(InputError, match="needs node scores"):
        faithfulness(model, task, score_graph(model, task, "eap"), **kw)


def test_edge_faithfulness_reads_edge_scores_as_the_ranking_it_takes(models):
    model, task = models("llama"), _task()
    kw = dict(method="zero", sizes=[1, 4, 16], seeds=1, threshold=0.5, minimality=2, n_boot=200, batch_size=16)
    screen = screen_edges(model, task, verify=0)
    a = edge_faithfulness(model, task, score_graph(model, task, "eap"), **kw)
    b = edge_faithfulness(model, task, screen, **kw)
    assert a.to_frame().equals(b.to_frame()) and a.order == b.order and a.smallest == b.smallest
    assert a.scores == b.scores and a.minimality == b.minimality
    exact = score_graph(model, task, "edge_exact", wires=_some_wires(model, task))
    today = [w for w in exact.wires() if node_kind(w.sender) == "head"]  # the wires a circuit may leave out, ranked
    c = edge_faithfulness(model, task, exact, **kw)
    d = edge_faithfulness(model, task, today, **kw)
    assert c.order == d.order and c.to_frame().equals(d.to_frame()) and c.smallest == d.smallest
    with pytest.raises(InputError, match="needs edge scores"):
        edge_faithfulness(model, task, score_graph(model, task, "exact", progress=False), **kw)


def test_a_new_algorithm_is_one_decorated_function(tiny_models):
    model, task = tiny_models["llama"], _task()

    @algorithm("toy_layer_order")
    def toy(model, task, *, scale: float = 1.0) -> GraphScores:
        """Later heads first: a score that grows with the layer."""
        return GraphScores("nodes", {h.name: scale * (h.layer + 1) for h in model.heads()})

    try:
        assert "toy_layer_order" in algorithms()
        got = score_graph(model, task, "toy_layer_order", scale=2.0)
        assert got.algorithm == "toy_layer_order" and got.scores["L2H0"] == 6.0
        assert faithfulness(model, task, got, sizes=[1], seeds=0, minimality=0).smallest is not None
        with pytest.raises(OptionError, match="did you mean 'scale'"):
            score_graph(model, task, "toy_layer_order", scael=2.0)
    finally:
        unregister_algorithm("toy_layer_order")
    with pytest.raises(OptionError, match="did you mean 'toy_layer_order'|unknown discovery algorithm"):
        score_graph(model, task, "toy_layer_order")

    @algorithm("toy_wrong")
    def wrong(model, task):
        return {"L0H0": 1.0}

    try:
        with pytest.raises(InputError, match="returned a dict, not GraphScores"):
            score_graph(model, task, "toy_wrong")
    finally:
        unregister_algorithm("toy_wrong")


def test_the_registry_imports_every_file_of_the_package(tiny_models, tmp_path, monkeypatch):
    """Every module of the package is registered without being imported by hand, and a file dropped into the
    package's folder is found the same way."""
    folder = Path(algorithms_pkg.__file__).parent
    files = {p.stem for p in folder.glob("*.py")} - {"__init__", "registry", "scores"}
    assert files == set(SHIPPED)
    (tmp_path / "toy_file.py").write_text(
        "from gna_interp.circuits.algorithms import GraphScores, algorithm\n\n\n"
        "@algorithm('toy_file')\n"
        "def toy_file(model, task):\n"
        "    return GraphScores('nodes', {h.name: 1.0 for h in model.heads()})\n")
    monkeypatch.setattr(algorithms_pkg, "__path__", [*algorithms_pkg.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_LOADED", [])
    try:
        assert "toy_file" in algorithms()
        assert len(score_graph(tiny_models["llama"], _task(), "toy_file")) == len(tiny_models["llama"].heads())
    finally:
        unregister_algorithm("toy_file")
        sys.modules.pop("gna_interp.circuits.algorithms.toy_file", None)
