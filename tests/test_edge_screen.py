"""The whole-graph edge screen: each attribution score equals the derivative of the metric computed by brute force
through the plain Hugging Face model (the edge's write scaled by a small ε, finite differences), and the rows verified
exactly equal path patching run edge by edge."""

from __future__ import annotations

import math

import pytest
import torch

import test_paths as tp
from gna_interp import HeadRef, KVRetrieval
from gna_interp.circuits.edges.edge_screen import EDGE_SCREEN_COLUMNS, screen_edges
from gna_interp.circuits.edges.paths import Edge, PathPatcher, path_effects
from gna_interp.engine.metrics import LOGIT_DIFF, results

H = HeadRef.parse


def _task():
    return KVRetrieval(3, 4, seed=1, max_value=9)


def _objective(model, pp, edges, eps, monkeypatch):
    """The screen's objective (the weighted read log-probs, the mean logit difference) with ``edges`` removed by hand
    (tests/test_paths.py's brute force) with each sender's write scaled by ``eps``."""
    write = tp._write
    monkeypatch.setattr(tp, "_write", lambda *a: eps * write(*a))
    weights = LOGIT_DIFF.target_weights(pp.plan, pp.clean())
    total = 0.0
    for chunk in pp.chunks:
        logp = tp._brute(model, pp, chunk, edges).double()
        total += float((logp.detach() * weights[chunk.read_target].double()).sum())
    monkeypatch.setattr(tp, "_write", write)
    return total


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_scores_equal_the_derivative_through_hugging_face(models, family, monkeypatch):
    model = models(family)
    screen = screen_edges(model, _task(), verify=0, batch_size=1)
    pp = PathPatcher(model, _task(), batch_size=1)
    t = screen.table
    heads = t[t["kind"] == "head -> head"].head(3)
    rows = list(heads.itertuples()) + list(t[t["receiver"] == "logits"].head(1).itertuples())
    eps = 1e-2
    for row in rows:
        sender = H(row.sender)
        if row.receiver == "logits":
            edges = [Edge(sender, None)]
        else:
            edges = [Edge(sender, H(row.receiver), row.input, row.positions)]
        # central differences: the write taken out (eps) and put in twice (-eps), float32 noise ~1e-6 / eps
        derivative = (_objective(model, pp, edges, -eps, monkeypatch) - _objective(model, pp, edges, eps, monkeypatch)
                      ) / (2 * eps)
        assert row.score == pytest.approx(derivative, rel=1e-2, abs=1e-4), (row.sender, row.receiver, row.input)


def test_verified_rows_equal_path_patching_edge_by_edge(models):
    model = models("bamba")  # SSM -> attention and attention -> SSM edges
    screen = screen_edges(model, _task(), verify=12, batch_size=2)
    v = screen.verified()
    assert len(v) == 12 and list(screen.table.columns) == EDGE_SCREEN_COLUMNS
    assert set(v["kind"]) == {"head -> head", "head -> logits", "MLP", "embeddings"}
    for row in v.itertuples():
        edges = [Edge(row.sender, row.receiver, row.input, row.positions)]
        alone = path_effects(model, _task(), [edges], batch_size=3)
        assert row.effect == pytest.approx(alone.effects()[0], abs=1e-5)
    a = screen.agreement()
    assert a.loc["all", "n"] == 12 and math.isfinite(a.loc["all", "max_error"]) and a["n"].sum() == 2 * 12
    assert set(v["sample"]) == {"top", "kind", "random"} and (v["sample"] == "top").sum() == 6
    kinds = set(screen.table.loc[screen.table["verifiable"], "kind"])
    assert kinds <= set(v["kind"])  # every kind that can be verified is
    assert a.loc["all", "random"] == 12 - (v["sample"] != "random").sum() > 0
    # every sender kind and every receiver kind of the hybrid is in the table
    assert {"embed", "MLP0"} <= set(screen.table["sender"])
    assert {"logits", "MLP2"} <= set(screen.table["receiver"])
    assert {"q", "k", "v", "other", "mlp", "logits"} <= set(screen.table["input"])


def test_senders_come_before_receivers(models):
    model = models("llama")
    t = screen_edges(model, _task(), verify=0, batch_size=4).table
    for row in t.itertuples():
        if row.receiver == "logits":
            continue
        s_layer = -1 if row.sender == "embed" else (int(row.sender[3:]) + 0.5 if row.sender.startswith("MLP")
                                                     else H(row.sender).layer)
        r_layer = int(row.receiver[3:]) + 0.5 if row.receiver.startswith("MLP") else H(row.receiver).layer
        assert s_layer < r_layer, row


def test_mlp_and_embedding_edges_are_verified_by_path_patching(tiny_models):
    """Rows out of or into an MLP (or out of the embeddings) are measured by path patching, that one edge alone
    removed: where its receiver input is its own, the effect equals the intact metric minus that of an edge circuit
    with every other edge kept; rows into an input several heads share (a KV group) are measured too."""
    from gna_interp.circuits.edges.edge_circuit import EdgeCircuit
    from gna_interp.models.graph import Edge
    from gna_interp.tasks import KVRetrieval
    from gna_interp.engine.metrics import LOGIT_DIFF, results

    model = tiny_models["llama"]
    task = KVRetrieval(3, 3, seed=1, max_value=9)
    screen = screen_edges(model, task, "mean", task, verify=60)
    t = screen.verified()
    mlp = t[t.sender.str.startswith("MLP") | (t.sender == "embed") | (t.input == "mlp")]
    assert len(mlp) and mlp["low"].le(mlp["effect"]).all() and mlp["effect"].le(mlp["high"]).all()
    assert set(mlp["kind"]) == {"MLP", "embeddings"}
    assert mlp["input"].isin(["k", "v"]).any()  # into a KV group's shared channels, one head's path alone
    own = mlp[~mlp["input"].isin(["k", "v"])].head(4)
    wires = [[Edge(r.sender, r.receiver, r.input, r.positions)] for r in own.itertuples()]
    ec = EdgeCircuit(model, task, "mean", batch_size=16, senders="all")
    for row, scored in zip(own.itertuples(), ec.run_without(wires)):
        assert row.effect == pytest.approx(screen.intact - LOGIT_DIFF.value(results(scored)), abs=1e-5)


def test_the_verified_sample_covers_every_kind_and_draws_at_random():
    """Half the budget the strongest rows; then every kind the strongest rows left out (even when they all sit at
    the bottom of the ranking); the rest drawn at random among the rows not taken, the same draw for the same seed."""
    import pandas as pd

    from gna_interp.circuits.edges.edge_screen import verify_sample

    kinds = ["head -> head"] * 30 + ["head -> logits"] * 5 + ["MLP"] * 10 + ["embeddings"] * 3
    t = pd.DataFrame({"kind": kinds, "abs_rank": range(1, len(kinds) + 1), "verifiable": True})
    why = verify_sample(t, 16)
    assert (why == "top").sum() == 8 and list(t.index[why == "top"]) == list(range(8))
    assert set(t.loc[why != "", "kind"]) == set(kinds)  # the embeddings, ranked last, are checked
    assert (why == "random").sum() == 16 - (why == "top").sum() - (why == "kind").sum() > 0
    assert why.equals(verify_sample(t, 16)) and (why != "").sum() == 16
    t.loc[::2, "verifiable"] = False
    assert not (verify_sample(t, 16)[~t["verifiable"]] != "").any()  # only verifiable rows are taken


def test_a_screen_builds_no_edge_circuit(tiny_dirs, monkeypatch):
    """Every verified row, of every kind, is measured by path patching: a screen makes no edge circuit, and whether
    the edges of the MLPs and the embeddings can be measured is learnt once per model."""
    import gna_interp as gna
    from gna_interp.circuits.edges import edge_circuit, paths

    model = gna.load_model(tiny_dirs["llama"], device="cpu")
    made = []
    monkeypatch.setattr(edge_circuit.EdgeCircuit, "__init__", lambda *a, **k: made.append(1))
    first = screen_edges(model, _task(), verify=0)
    assert model.facts[paths.STREAMS] == ""
    again = screen_edges(model, _task(), verify=0)
    assert again.table.equals(first.table)
    t = again.table
    assert t[t["kind"].isin(["MLP", "embeddings"])]["verifiable"].all()
    measured = screen_edges(model, _task(), verify=40)
    assert not made and measured.verified()["kind"].isin(["MLP", "embeddings"]).any()


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_the_metrics_weights_come_from_the_screens_own_intact_forward(models, family, monkeypatch):
    """Each chunk's weights are read off its own intact forward when every chunk holds whole samples (no clean pass
    of the patcher is run), else off the patcher's clean pass (a sample's rows split over chunks: Mamba-2 rows one a
    chunk); the scores and the intact value equal those of one chunk holding every sample."""
    model = models(family)
    # several tokens a candidate: several rows a sample unpacked; seed 3: a sample's best other candidate is read after
    # a worse one, so weights read off a part of the sample would be wrong
    task = KVRetrieval(3, 4, seed=3, max_value=999)
    whole = screen_edges(model, task, verify=0, batch_size=64)
    cleans = []
    real = PathPatcher.clean
    monkeypatch.setattr(PathPatcher, "clean", lambda self: cleans.append(1) or real(self))
    split = screen_edges(model, task, verify=0, batch_size=1)
    pp = PathPatcher(model, task, batch_size=1)
    owners = [{pp.plan.targets[t].sample for t in c.read_target.tolist()} for c in pp.chunks]
    straddles = sum(map(len, owners)) > len(set().union(*owners))
    assert straddles == (family == "mamba2") and len(cleans) == int(straddles)
    assert split.intact == pytest.approx(LOGIT_DIFF.value(results(real(pp))), abs=1e-5)
    assert split.intact == pytest.approx(whole.intact, abs=1e-5)
    scores = whole.table["score"].to_numpy()  # float32 sums over other batch shapes: rounding at 1e-4 of the largest
    assert split.table["score"].to_numpy() == pytest.approx(scores, abs=1e-4 * float(abs(scores).max()))


def test_the_batched_products_back_to_the_stream_equal_one_product_each(models, monkeypatch):
    """The receivers of one stream are taken back to it by one batched vector-Jacobian product; where the backward
    cannot be batched (here: made to refuse) one product each gives the same scores."""
    from gna_interp.circuits.edges import edge_screen

    model = models("llama")
    batched = screen_edges(model, _task(), verify=0, batch_size=4)
    real = torch.autograd.grad
    refused = []

    def no_batches(*a, **k):
        if k.get("is_grads_batched"):
            refused.append(1)
            raise RuntimeError("vmap: this backward cannot be batched")
        return real(*a, **k)

    monkeypatch.setattr(edge_screen.torch.autograd, "grad", no_batches)
    each = screen_edges(model, _task(), verify=0, batch_size=4)
    assert refused and batched.table["score"].to_numpy() == pytest.approx(each.table["score"].to_numpy(), abs=1e-6)
