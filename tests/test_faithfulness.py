"""Faithfulness of head circuits: every number against a direct construction -- a copy of the plain Hugging Face
model whose every head outside the circuit has its output-projection columns zeroed, evaluated as a model of its
own."""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch

import gna_interp as gna
from gna_interp import allocator
from gna_interp.circuits.search.sufficiency import Faithfulness, faithfulness, size_grid
from gna_interp.errors import GnaError
from gna_interp.models.hf import unwrap


def _task():
    return gna.KVRetrieval(3, 6, seed=1, max_value=9)


def _zeroed(model, keep):
    """``model`` with every head outside ``keep`` removed by hand: its columns of ``o_proj`` set to zero in a copy
    of the HF model, loaded as a separate gna model."""
    hf = copy.deepcopy(model.hf_model)
    for h in model.heads():
        if h in keep:
            continue
        spec = model.layer_spec(h.layer, h.kind)
        path = spec.bridge_path
        attn = hf.model.layers[h.layer].self_attn
        assert unwrap(model.hf_module(path)).o_proj.weight.shape == attn.o_proj.weight.shape
        with torch.no_grad():
            attn.o_proj.weight[:, model.head_site(h).columns] = 0
    return gna.load_model(hf, model.tokenizer)


def test_fractions_equal_models_with_the_other_heads_zeroed_by_hand(models):
    model = models("llama")
    heads = model.heads()
    ranked = [heads[5], heads[2], heads[9]]
    fx = faithfulness(model, _task(), ranked, method="zero", sizes=[1, 2, 3], seeds=1, threshold=0.5)
    ev = {k: gna.evaluate(_zeroed(model, set(ranked[:k])), _task(), progress=False) for k in (0, 1, 2, 3)}
    intact = gna.evaluate(model, _task(), progress=False)
    frame = fx.to_frame()
    for k in (1, 2, 3):
        row = frame[(frame.series == "ranked") & (frame["size"] == k)].iloc[0]
        want = (ev[k].logit_diff - ev[0].logit_diff) / (intact.logit_diff - ev[0].logit_diff)
        assert row.fraction == pytest.approx(want, abs=1e-5)
        assert row.logit_diff == pytest.approx(ev[k].logit_diff, abs=1e-5)
        assert row.low <= row.fraction <= row.high
    ranked_ends = frame[frame.series == "ranked"].set_index("size").fraction
    assert ranked_ends[0] == pytest.approx(0.0) and ranked_ends[len(heads)] == pytest.approx(1.0)
    # random circuits: the same sizes, each a different draw
    rand = frame[frame.series == "random"]
    assert sorted(rand["size"]) == [1, 2, 3]


def test_smallest_circuit_and_minimality(models):
    model = models("llama")
    fx = faithfulness(model, _task(), [], method="zero", seeds=0, threshold=0.5)
    assert fx.smallest is not None
    k = len(fx.smallest)
    assert fx.fraction(next(r for s, _, h, r in fx.points if s == "smallest")) >= 0.5
    if k > 1:  # one head fewer (in the ranked order) does not keep the threshold
        fewer = faithfulness(model, _task(), fx.smallest, method="zero", sizes=[k - 1], seeds=0)
        row = fewer.to_frame().query("series == 'ranked' and size == @k - 1").iloc[0]
        assert row.fraction < 0.5
    # minimality: each head's own contribution is m(C) - m(C without it), by hand
    full = gna.evaluate(_zeroed(model, set(fx.smallest)), _task(), progress=False).logit_diff
    assert set(fx.minimality) == set(fx.smallest[:30])
    for h in fx.smallest[:30]:
        alone = gna.evaluate(_zeroed(model, set(fx.smallest) - {h}), _task(), progress=False).logit_diff
        assert fx.minimality[h] == pytest.approx(full - alone, abs=1e-5)


def test_the_search_starts_inside_its_bracket_and_leaves_members_out_on_the_smallest_circuits_replay(models,
                                                                                                     monkeypatch):
    """The bisection keeps each circuit's replay: a step starts on the kept replay of the smallest circuit containing
    it (never more than two kept), and the smallest circuit's members are left out on its own replay, not a new one;
    the numbers are those of the search without any of it."""
    from gna_interp.circuits.search.sufficiency import _Passes
    from gna_interp.engine.replay import SetAblation

    model = models("llama")
    starts, bases = [], []
    real_trail, real_added = SetAblation.run_trail, SetAblation.run_added
    monkeypatch.setattr(SetAblation, "run_trail", lambda self, heads, start=None: starts.append(start is not None)
                        or real_trail(self, heads, start))
    monkeypatch.setattr(SetAblation, "run_added", lambda self, base, extras, trail=None: bases.append(trail)
                        or real_added(self, base, extras, trail))
    n = len(model.heads())
    fx = faithfulness(model, _task(), [], method="zero", sizes=[n], seeds=0, threshold=0.5, minimality=2)
    assert fx.smallest is not None and 0 < len(fx.smallest) < n  # found by the bisection
    assert len(starts) >= 2 and not starts[0] and any(starts[1:])
    assert len(bases) == 1 and bases[0] is not None and bases[0].heads == frozenset(
        h for h in model.heads() if h not in set(fx.smallest))
    monkeypatch.undo()
    plain = faithfulness(model, _task(), [], method="zero", sizes=[n], seeds=0, threshold=0.5, minimality=2)
    assert plain.smallest == fx.smallest and plain.minimality == pytest.approx(fx.minimality, abs=1e-6)
    passes = _Passes()  # what is kept: the latest circuit and the smallest kept one around it
    passes.add("abcd", 1)
    passes.add("ab", 2)
    assert set(passes.kept) == {frozenset("ab"), frozenset("abcd")}
    passes.add("abc", 3)  # a bisection's failed lower end serves nothing after it
    assert set(passes.kept) == {frozenset("abc"), frozenset("abcd")} and passes.around("ab") == 3
    passes.add("a", 4)
    assert passes.of("a") == 4 and passes.around("a") == 4 and passes.of("abcd") is None


def test_areas_save_and_load(models, tmp_path):
    model = models("llama")
    fx = faithfulness(model, _task(), model.heads()[:3], method="mean", sizes=[1, 3], seeds=2)
    a = fx.areas()
    assert 0 <= a["cmd"] and math.isfinite(a["cpr"])
    curve = fx.curve()
    x = curve["size"].to_numpy() / fx.n_heads
    assert a["cpr"] == pytest.approx(float(((curve.fraction.to_numpy()[1:] + curve.fraction.to_numpy()[:-1]) / 2
                                            * (x[1:] - x[:-1])).sum()))
    back = Faithfulness.load(fx.save(tmp_path))
    assert back.to_frame().equals(fx.to_frame()) and back.summary() == fx.summary()


def test_random_circuits_start_at_their_share_of_the_heads_and_their_curve_spans_the_ends(models):
    model = models("llama")
    n = len(model.heads())
    fx = faithfulness(model, _task(), model.heads()[:3], method="zero", sizes=[1, 2, 3, 4], seeds=2,
                      random_least=3 / n, minimality=0)
    frame = fx.to_frame()
    assert sorted(set(frame[frame.series == "random"]["size"])) == [3, 4]
    assert sorted(frame[frame.series == "ranked"]["size"]) == [0, 1, 2, 3, 4, n]
    # the random curve runs from the empty circuit (fraction 0) to the whole model (1), the ends both series share
    curve = fx.curve("random")
    assert list(curve["size"]) == [0, 3, 4, n]
    assert curve.fraction.iloc[0] == pytest.approx(0.0) and curve.fraction.iloc[-1] == pytest.approx(1.0)
    mid = frame[frame.series == "random"].groupby("size").fraction.median()
    assert list(curve.fraction.iloc[1:3]) == pytest.approx(list(mid[[3, 4]]))
    x, y = curve["size"].to_numpy() / n, curve.fraction.to_numpy()
    assert fx.areas("random")["cpr"] == pytest.approx(float(((y[1:] + y[:-1]) / 2 * (x[1:] - x[:-1])).sum()))
    every = faithfulness(model, _task(), model.heads()[:3], method="zero", sizes=[1, 2], seeds=1, random_least=0,
                         minimality=0)
    assert sorted(every.to_frame().query("series == 'random'")["size"]) == [1, 2]
    none = faithfulness(model, _task(), model.heads()[:3], method="zero", sizes=[1], seeds=0, minimality=0)
    assert none.curve("random").empty and math.isnan(none.areas("random")["cpr"])  # no random curve of the ends alone


def test_bad_arguments_are_refused(models):
    model = models("llama")
    for bad in (dict(method="resample"), dict(threshold=0), dict(threshold=1.5), dict(n_boot=0), dict(seeds=-1),
                dict(sizes=[-1]), dict(random_least=1.0), dict(random_least=-0.1), dict(random_least=True),
                dict(random_least="0.1"), dict(precision="x")):
        with pytest.raises(GnaError):
            faithfulness(model, _task(), [], **bad)
    with pytest.raises(GnaError):
        faithfulness(model, _task(), [], sizes=[10_000])
    assert size_grid(3) == [0, 1, 2, 3] and size_grid(30)[-1] == 30


def test_gna_circuit_writes_its_folder(tiny_models, tmp_path):
    """``gna circuit`` on a scan folder: the curve, the smallest circuit, the edge table, the whole-graph screen and
    both figures, every file readable."""
    import pandas as pd

    from gna_interp.cli import main
    from made_up import write_scan_folder

    model = tiny_models["llama"]
    scan = write_scan_folder(tmp_path / "scan", model, model.heads())
    out = tmp_path / "circuit"
    entered, real = [], allocator.heap_temporaries

    @contextlib.contextmanager
    def counted():
        with real() as applied:
            entered.append(applied)
            yield applied

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(allocator, "heap_temporaries", counted)
        assert main(["circuit", str(scan), "--out", str(out), "--sizes", "1,2", "--seeds", "1", "--edges", "3",
                     "--verify", "5", "--threshold", "0.5"]) == 0
    assert len(entered) == 5  # every stage takes its temporaries from the heap: faithfulness to the whole circuit
    fx = Faithfulness.load(out)
    assert fx.n_heads == len(model.heads()) and {s for s, *_ in fx.points} >= {"ranked", "random"}
    screen = pd.read_csv(out / "edge_screen.csv")
    assert screen["effect"].notna().sum() == 5 and {"embed", "MLP0"} <= set(screen["sender"])
    assert len(pd.read_csv(out / "edges.csv")) and len(pd.read_csv(out / "roles.csv"))
    for page in ("faithfulness.html", "edge_graph.html", "edge_faithfulness.html"):
        assert "plotly" in (out / page).read_text(encoding="utf-8")[:200000]
    efx = Faithfulness.load(out / "edge_faithfulness.json")
    assert efx.unit == "edges" and efx.n_heads == len(efx.order)
    if efx.smallest is not None:  # the whole circuit: its own scan-like folder, its report
        import json

        whole = json.loads((out / "whole_circuit" / "circuit.json").read_text())["whole"]
        assert whole["n_edges"] == len(efx.smallest) and len(whole["edges"]) >= whole["n_edges"]
        assert {e["sender"] for e in whole["edges"]} <= {n["name"] for n in whole["nodes"]}
        assert (out / "whole_circuit" / "report.html").exists()
    assert main(["circuit", str(scan), "--out", str(scan)]) == 2  # the scan's own folder holds another command's results


def test_the_edges_stage_takes_the_scans_own_rows_and_measures_the_rest(tiny_models, tmp_path):
    """Where the scan measured its edge table as the edges stage does (zero ablation, the logit difference, the same
    prompts), its rows are read, not measured again (a row changed in the scan comes back as changed), and the rows it
    lacks (k/v at the decision) equal path patching of them alone; a scan of mean ablation gives nothing to read."""
    import pandas as pd

    from gna_interp.circuits.edges.causal import measure_edges
    from gna_interp.cli import main
    from made_up import made_up_circuit

    model = tiny_models["llama"]
    circuit = made_up_circuit(model, model.heads())
    task, heads = circuit.load_task(), circuit.heads[:3]
    own = measure_edges(model, task, heads, batch_size=4)
    own.loc[0, ["effect", "low", "high"]] = 0.123456
    circuit.edges = own
    scan = circuit.save(tmp_path / "scan")
    light = ["--sizes", "1", "--seeds", "0", "--minimality", "0", "--edges", "3", "--verify", "0"]
    assert main(["circuit", str(scan), "--out", str(tmp_path / "c"), *light]) == 0
    got = pd.read_csv(tmp_path / "c" / "edges.csv").set_index("edge")
    assert got.loc[own.loc[0, "edge"], "effect"] == 0.123456
    assert set(own["edge"]) < set(got.index)
    alone = measure_edges(model, task, heads, decision_kv=True, batch_size=4).set_index("edge")
    new = sorted(set(got.index) - set(own["edge"]))
    assert new and all("@decision" in e for e in new)
    assert (got.loc[new, "effect"] - alone.loc[new, "effect"]).abs().max() < 1e-6
    circuit.scan.method = "mean"
    scan = circuit.save(tmp_path / "mean_scan")
    assert main(["circuit", str(scan), "--out", str(tmp_path / "m"), *light]) == 0
    again = pd.read_csv(tmp_path / "m" / "edges.csv").set_index("edge")
    assert abs(again.loc[own.loc[0, "edge"], "effect"] - alone.loc[own.loc[0, "edge"], "effect"]) < 1e-6


def test_gna_circuit_quick_takes_the_light_counts_unless_given(tiny_models, tmp_path):
    """``--quick``: the first 10 prompts, one random series, no minimality, the scan's own
    edge table, 20 verified edges, no random edge series; an option given beside it keeps its value; ``--samples N``
    measures on N prompts."""
    import pandas as pd

    from gna_interp.circuits import Circuit
    from gna_interp.cli import main
    from made_up import write_scan_folder

    model = tiny_models["llama"]
    scan = write_scan_folder(tmp_path / "scan", model, model.heads())
    out = tmp_path / "quick"
    assert main(["circuit", str(scan), "--out", str(out), "--quick", "--sizes", "1,2", "--edge-minimality", "1",
                 "--threshold", "0.5"]) == 0
    fx = Faithfulness.load(out)
    assert fx.minimality == {} and {seed for s, seed, *_ in fx.points if s == "random"} == {0}
    assert not (out / "edges.csv").exists()
    screen = pd.read_csv(out / "edge_screen.csv")
    assert screen["effect"].notna().sum() == min(20, len(screen))
    efx = Faithfulness.load(out / "edge_faithfulness.json")
    assert not any(s == "random" for s, *_ in efx.points)
    assert len(efx.minimality) == (1 if efx.smallest else 0)
    report = (out / "faithfulness.md").read_text()
    assert "nan" not in report and "not measured (minimality 0)" in report  # what was not drawn says so
    assert "random circuits: none drawn" in (out / "edge_faithfulness.md").read_text()
    n = len(Circuit.load(scan).load_task())
    assert len(next(iter(fx.intact.values()))) == min(10, n)  # --quick measures on the first 10 prompts at most
    few = tmp_path / "few"
    assert main(["circuit", str(scan), "--out", str(few), "--sizes", "1", "--seeds", "0", "--minimality", "0",
                 "--edges", "0", "--verify", "0", "--samples", "2"]) == 0
    assert len(next(iter(Faithfulness.load(few).intact.values()))) == 2


def test_edge_circuits_curve_smallest_minimality_and_round_trip(models, tmp_path):
    """The edge form: each point is the edge circuit measured on its own (EdgeCircuit, itself checked against a
    by-hand forward); the smallest circuit keeps the threshold and one edge fewer does not; minimality and the
    saved file agree with direct runs."""
    from gna_interp.circuits.edges.edge_circuit import EdgeCircuit
    from gna_interp.models.graph import Edge
    from gna_interp.circuits.search.sufficiency import edge_faithfulness, shuffled
    from gna_interp.engine.metrics import get_metric, results

    model = models("llama")
    ec = EdgeCircuit(model, _task(), "mean", batch_size=16)
    every = ec.wires()
    ranked = [w for w in every if w.receiver == "logits"] + [w for w in every if w.receiver != "logits"][:40]
    fx = edge_faithfulness(model, _task(), ranked, threshold=0.6, seeds=1, minimality=3, batch_size=16)
    assert fx.unit == "edges" and fx.n_heads == len(every)
    frame = fx.to_frame()
    assert "edges" in frame.columns and "heads" not in frame.columns
    ranked_pts = frame[frame.series == "ranked"].set_index("size")
    assert ranked_pts.fraction[0] == pytest.approx(0.0) and ranked_pts.fraction[len(every)] == pytest.approx(1.0)
    ld = get_metric("logit_diff")

    def fraction(wires):
        return fx.fraction(results(ec.run([wires])[0]))

    k = 4
    assert ranked_pts.fraction[k] == pytest.approx(fraction(ranked[:k]), abs=1e-5)
    rand = frame[(frame.series == "random") & (frame["size"] == k)].iloc[0]
    assert rand.fraction == pytest.approx(fraction(shuffled(every, 0)[:k]), abs=1e-5)
    assert fx.smallest is not None
    n = len(fx.smallest)
    assert fraction(fx.smallest) >= 0.6 > fraction(fx.order[:n - 1])
    first = fx.smallest[0]
    full = ld.value(results(ec.run([fx.smallest])[0]))
    without = ld.value(results(ec.run([[w for w in fx.smallest if w != first]])[0]))
    assert fx.minimality[first] == pytest.approx(full - without, abs=1e-5)
    back = Faithfulness.load(fx.save(tmp_path))
    assert back.unit == "edges" and back.smallest == fx.smallest and isinstance(back.smallest[0], Edge)
    pd_equal = back.to_frame().drop(columns="edges").equals(frame.drop(columns="edges"))
    assert pd_equal
    assert [len(m) for _, _, m, _ in back.points] == [len(m) for _, _, m, _ in fx.points]
    assert "edges" in fx.report() and f"{n} edges" in fx.report()
    # first: the edges out of the named senders lead the order, each part in its own order
    lead = fx.smallest[-1].sender
    led = edge_faithfulness(model, _task(), ranked, sizes=[1], seeds=0, minimality=0, batch_size=16, first=[lead])
    k = sum(w.sender == lead for w in every)
    assert {w.sender for w in led.order[:k]} == {lead} and lead not in {w.sender for w in led.order[k:]}
    assert [w for w in led.order if w.sender != lead] == [w for w in fx.order if w.sender != lead]


@pytest.mark.parametrize("method", ["mean", "zero"])
def test_the_edge_curves_size_0_is_every_head_ablated_so_a_node_curves_point_stands_for_it(models, method):
    """Every edge out of a head ablated (the embeddings' and MLPs' kept, each MLP reading its own ablated stream) is
    every head ablated: the edge curve's own size-0 pass equals the node curve's to 1e-5, and handed the node
    curve's point (``empty=``) the edge curve reads it instead of a pass."""
    from gna_interp.circuits.search.sufficiency import edge_faithfulness
    from gna_interp.engine.metrics import get_metric

    model = models("llama")
    ld = get_metric("logit_diff")
    node = faithfulness(model, _task(), [], method=method, sizes=[0], seeds=0, minimality=0, batch_size=16)
    edge = edge_faithfulness(model, _task(), [], method=method, sizes=[0], seeds=0, minimality=0, batch_size=16)
    for name in ("logit_diff", "accuracy"):
        m = get_metric(name)
        assert m.value(edge.empty) == pytest.approx(m.value(node.empty), abs=1e-5)
    marked = {k: v + 1.0 for k, v in node.empty.items()}  # a stand-in that no pass gives
    read = edge_faithfulness(model, _task(), [], method=method, sizes=[0], seeds=0, minimality=0, batch_size=16,
                             empty=marked)
    assert ld.value(read.empty) == pytest.approx(ld.value(marked))
    every = edge_faithfulness(model, _task(), [], method=method, sizes=[0], seeds=0, minimality=0, batch_size=16,
                              senders="all", empty=marked)  # with every edge ablated, the MLPs' too: measured
    assert ld.value(every.empty) != pytest.approx(ld.value(marked))


def test_the_edge_grid_is_powers_of_4_from_a_ten_thousandth_of_the_graph():
    from gna_interp.circuits.search.sufficiency import edge_grid

    assert edge_grid(110) == [0, 1, 4, 16, 64, 110]  # a small graph: from one edge
    assert edge_grid(189_000) == [0, 64, 256, 1024, 4096, 16384, 65536, 189_000]  # SmolLM2's: 19 edges and more
    assert edge_grid(1) == [0, 1]
