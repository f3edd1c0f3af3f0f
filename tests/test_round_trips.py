"""Every result type shares one face: it saves to one file or a folder and loads back equal, displays itself with
every text escaped, and draws its figure with ``plot()`` (or says it has none and names what draws it)."""

from __future__ import annotations

import dataclasses
import html
import inspect
import json
import math
import re
import types
from typing import Any

import pandas as pd
import pytest
import torch

import gna_interp as gna
from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.search.comparison import CircuitComparison
from gna_interp.circuits.search.curve import CURVE_COLUMNS
from gna_interp.circuits.scan.delegation import KIND_COLUMNS, REMOVAL_COLUMNS, ROLE_COLUMNS, Delegation
from gna_interp.circuits.scan.interactions import Interactions
from gna_interp.circuits.edges.path_store import load_path_effects, save_path_effects
from gna_interp.circuits.edges.paths import Edge, PathEffects
from gna_interp.circuits.scan.result import HeadScan
from gna_interp.circuits.search.sufficiency import Faithfulness
from gna_interp.circuits.search.views import CardViews, HeadPatterns, row_normalised
from gna_interp.errors import InputError
from gna_interp.experiments.eval import TABLE_COLUMNS as EVAL_COLUMNS, EvalResult
from gna_interp.experiments.families import (CURVE_COLUMNS as FAMILY_CURVE_COLUMNS, TABLE_COLUMNS as FAMILY_COLUMNS,
                                             FamilyComparison)
from gna_interp.experiments.hybrid_build import COLUMNS as HYBRID_COLUMNS, HybridBuild
from gna_interp.experiments.mask import COLUMNS as MASK_COLUMNS, SCORE_COLUMNS, MaskedHead, MaskResult
from gna_interp.experiments.prune import COLUMNS as PRUNE_COLUMNS, KEEP_COLUMNS, PruneResult
from gna_interp.experiments.sweep import COLUMNS as SWEEP_COLUMNS, Sweep
from gna_interp.mixing.pattern_set import PatternSet
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import TokenBatch
from gna_interp.results import REPR_ROWS, Result
from gna_interp.store import clean_json
from gna_interp.tasks.calibration import Calibration, FormResult
from gna_interp.tasks.evaluation import Evaluation
from gna_interp.tasks.sample import Sample
from gna_interp.engine.plan import CandidateScores
from gna_interp.tasks.segments import Segments, Span
from made_up import made_up_circuit

HOSTILE = "<script>alert('x')</script>&<b>"


def _results(gen: torch.Generator, n: int = 13) -> dict[str, torch.Tensor]:
    ld = torch.randn(n, generator=gen, dtype=torch.float64)
    gold = torch.randn(n, generator=gen, dtype=torch.float64)
    gold[3] = math.nan  # a value missing for one sample travels as null
    return {"logit_diff": ld, "correct": ld > 0, "gold_score": gold, "n_gold": torch.randint(1, 3, (n,), generator=gen)}


def _same_results(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].nan_to_num(7.5), b[k].nan_to_num(7.5)), k


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(11)


def test_path_effects_round_trip(gen, tmp_path):
    a, b, c = (HeadRef.parse(n) for n in ("L1H0", "L2H1", "L3H2"))
    sets = [[Edge(a, b, "k", "summary")], [Edge(b, c, "v", "items"), Edge(a, c, "q", "decision")], [Edge(c)]]
    fx = PathEffects("logit_diff", _results(gen), sets, [_results(gen) for _ in sets], level=0.9)
    path = save_path_effects(fx, tmp_path)                       # a folder: its path_effects.json
    assert path == tmp_path / "path_effects.json"
    back = load_path_effects(tmp_path)
    assert back.metric == fx.metric and back.level == fx.level and back.sets == fx.sets
    _same_results(back.baseline, fx.baseline)
    for p, q in zip(back.patched, fx.patched):
        _same_results(p, q)
    assert back.effects() == fx.effects()
    assert back.intervals() == fx.intervals()
    pd.testing.assert_frame_equal(back.to_frame(), fx.to_frame())
    assert load_path_effects(path).sets == fx.sets               # the file itself loads too


def test_path_effects_methods_round_trip(gen, tmp_path):
    """`PathEffects.save` / `.load` write and read the document the store's functions do: each reads the other's."""
    a, b = HeadRef.parse("L1H0"), HeadRef.parse("L2H1")
    sets = [[Edge(a, b, "k", "summary")], [Edge(a, b, "v", "items"), Edge(b)]]
    fx = PathEffects("accuracy", _results(gen), sets, [_results(gen) for _ in sets], level=0.8)
    path = fx.save(tmp_path)                                     # a folder: its path_effects.json
    assert path == tmp_path / "path_effects.json"
    for back in (PathEffects.load(tmp_path), PathEffects.load(path), load_path_effects(path)):
        assert back.metric == fx.metric and back.level == fx.level and back.sets == fx.sets
        _same_results(back.baseline, fx.baseline)
        for p, q in zip(back.patched, fx.patched):
            _same_results(p, q)
        assert back.effects() == fx.effects() and back.intervals() == fx.intervals()
        pd.testing.assert_frame_equal(back.to_frame(), fx.to_frame())
    other = save_path_effects(fx, tmp_path / "fx.json")
    assert PathEffects.load(other).sets == fx.sets
    assert PathEffects.from_dict(fx.to_dict()).sets == fx.sets
    with pytest.raises(InputError, match="not a path-effects document"):
        PathEffects.from_dict({"metric": "logit_diff"})


def test_interactions_round_trip(gen, tmp_path):
    heads = [HeadRef.parse(n) for n in ("L1H0", "L2H1", "L3H2")]
    pairs = {(i, j): _results(gen) for i in range(3) for j in range(i + 1, 3)}
    it = Interactions("m", "kv6", "logit_diff", "mean", heads, _results(gen), [_results(gen) for _ in heads], pairs,
                      level=0.9, n_boot=300, seconds=1.5)
    path = it.save(tmp_path / "pairs.json")
    back = Interactions.load(path)
    assert (back.model, back.task, back.metric, back.method, back.heads, back.level, back.n_boot, back.seconds) == \
        (it.model, it.task, it.metric, it.method, it.heads, it.level, it.n_boot, it.seconds)
    _same_results(back.baseline, it.baseline)
    assert back.pairs.keys() == it.pairs.keys()
    pd.testing.assert_frame_equal(back.to_frame(), it.to_frame())
    assert back.intervals() == it.intervals() and back.metrics == it.metrics
    assert torch.equal(back.matrix(), it.matrix())
    it.save(tmp_path)
    assert Interactions.load(tmp_path).heads == heads            # a folder: its interactions.json


def test_a_file_of_another_kind_is_refused(gen, tmp_path):
    heads = [HeadRef.parse("L1H0"), HeadRef.parse("L2H1")]
    it = Interactions("m", "t", "logit_diff", "zero", heads, _results(gen), [_results(gen), _results(gen)],
                      {(0, 1): _results(gen)})
    path = it.save(tmp_path / "it.json")
    with pytest.raises(InputError, match="not a gna_interp path_effects file"):
        load_path_effects(path)


# ---- Evaluation ---------------------------------------------------------------------------------------------------


def _evaluation(task: str = "kv3", dtype: torch.dtype = torch.float64) -> Evaluation:
    """Three samples of two and three candidates: the padding score of a two-candidate sample is -inf."""
    samples = (Sample("a: 1\nb: 2\nThe value of a is", (" 1", " 2"), 0, meta={"key": "a", "value": 1}),
               Sample("Pick one:", (" x", " y", " z"), 2, meta={"key": "<b>", "value": 2.5}),
               Sample("Again:", (" p", " q"), 1))
    scores = torch.tensor([[-0.5, -2.0, -math.inf], [-3.0, -1.25, -0.75], [-0.1, -4.0, -math.inf]], dtype=dtype)
    n_tokens = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 2, 0]])
    return Evaluation(task, CandidateScores(samples, scores, n_tokens, "full", 4), 0.25)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_evaluation_round_trip(tmp_path, dtype):
    ev = _evaluation(dtype=dtype)
    path = ev.save(tmp_path)                                     # a folder: its evaluation.json
    assert path == tmp_path / "evaluation.json"
    assert json.loads(path.read_text())["format"] == "evaluation"
    back = Evaluation.load(path)
    assert back.task == ev.task and back.seconds == ev.seconds and back.scores.samples == ev.scores.samples
    assert back.scores.scores.dtype == dtype and torch.equal(back.scores.scores, ev.scores.scores)
    assert torch.equal(back.scores.n_tokens, ev.scores.n_tokens)
    pd.testing.assert_frame_equal(back.to_frame(), ev.to_frame())
    assert back.metrics == ev.metrics and back.to_dict() == ev.to_dict()
    assert Evaluation.load(tmp_path).to_dict() == ev.to_dict()


def test_evaluation_of_a_tiny_model_round_trips(tiny_models, tmp_path):
    ev = gna.evaluate(tiny_models["llama"], gna.KVRetrieval(n_pairs=3, n_samples=4, seed=0), progress=False)
    back = Evaluation.load(ev.save(tmp_path / "ev.json"))
    pd.testing.assert_frame_equal(back.to_frame(), ev.to_frame())
    assert back.metrics == ev.metrics and back.to_dict() == ev.to_dict()


def test_a_malformed_evaluation_is_refused_naming_the_file(tmp_path):
    doc = _evaluation().to_dict()
    with pytest.raises(InputError, match="not an evaluation document"):
        Evaluation.from_dict({k: v for k, v in doc.items() if k != "scores"})
    path = _evaluation().save(tmp_path / "ev.json")
    bad = json.loads(path.read_text())
    bad["scores"] = bad["scores"][:2]                             # a sample without its row of scores
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match="ev.json.*do not give each of its 3 samples a row"):
        Evaluation.load(path)


# ---- Calibration --------------------------------------------------------------------------------------------------


def _calibration(task: str = "kv10-completion") -> Calibration:
    rows = [FormResult({"template": "official", "max_value": 9}, "kv10-official", 0.40, 0.1, 16, 120.0, "solved"),
            FormResult({"template": "completion", "max_value": 99}, task, 0.8125, 0.01, 16, 140.5, "chosen"),
            FormResult({"template": "official", "max_value": 99}, "kv10-x", 0.0625, 0.01, 16, 150.0, "at chance")]
    return Calibration(rows, 1, {"n_pairs": 10}, seconds=12.34, skipped=[{"n_pairs": 20}])


def test_calibration_round_trip(tmp_path):
    cal = _calibration()
    frame = cal.to_frame()
    assert list(frame["form"]) == [0, 1, 2] and list(frame["chosen"]) == [False, True, False]
    assert list(frame.columns[1:3]) == ["template", "max_value"] and frame["accuracy"][1] == 0.8125
    path = cal.save(tmp_path)                                    # a folder: its calibration.json
    assert path == tmp_path / "calibration.json"
    back = Calibration.load(path)
    assert back == cal and back.to_dict() == cal.to_dict()
    pd.testing.assert_frame_equal(back.to_frame(), frame)
    path.write_text(path.read_text().replace('"chosen": 1', '"chosen": 7'))
    with pytest.raises(InputError, match="calibration.json.*chooses form 7 of 3"):
        Calibration.load(path)


# ---- the shared face ----------------------------------------------------------------------------------------------


def _safe(page: str) -> None:
    """No hostile markup got through, and it is there escaped."""
    assert "<script" not in page.lower() and HOSTILE not in page
    assert html.escape(HOSTILE, quote=True) in page


def test_every_display_escapes_its_text(gen):
    heads = [HeadRef.parse("L1H0"), HeadRef.parse("L2H1")]
    it = Interactions(HOSTILE, HOSTILE, "logit_diff", "zero", heads, _results(gen), [_results(gen), _results(gen)],
                      {(0, 1): _results(gen)})
    for shown in (_evaluation(HOSTILE), _calibration(HOSTILE), it):
        _safe(shown._repr_html_())
    page = it._repr_html_()
    assert "redundancy" in page and "super-additive" in page and "L1H0" in page and "L2H1" in page


def test_path_effects_display_its_edges_escaped(gen):
    a, b = HeadRef.parse("L1H0"), HeadRef.parse("L2H1")
    sets = [[Edge(a, b, "k", "summary")], [Edge(b)]]
    fx = PathEffects("logit_diff", _results(gen), sets, [_results(gen) for _ in sets])
    page = fx._repr_html_()
    assert "L1H0 -&gt; L2H1.k@summary" in page and "L2H1 -&gt; logits" in page and "->" not in page
    assert "Path effects on logit_diff" in page and f"{fx.effects()[0]:.3f}" in page


@dataclasses.dataclass
class _Note(Result):
    """A result made outside the package: a name and a table of numbers."""

    name: str
    values: list[float]

    FORMAT = "path_effects"  # a format the store knows; the document's body is this class's own
    FILE = "note.json"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "n": len(self.values), "values": list(self.values)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "_Note":
        return cls(str(d["name"]), [float(v) for v in d["values"]])

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"value": self.values})


def test_a_result_made_outside_the_package_saves_loads_and_displays(tmp_path):
    note = _Note(HOSTILE, [0.5 * i for i in range(REPR_ROWS + 5)])
    assert _Note.load(note.save(tmp_path)) == note               # a folder: its FILE
    assert (tmp_path / "note.json").is_file()
    page = note._repr_html_()
    _safe(page)
    assert "_Note" in page and f"first {REPR_ROWS} of {REPR_ROWS + 5} rows" in page
    assert page.count("<tr") == 2 + 1 + REPR_ROWS              # two facts (name, n), the header, the rows shown
    assert Result.to_frame(note).to_dict("records") == [{"name": HOSTILE, "n": REPR_ROWS + 5}]


# ---- every result type: made up by hand, saved, loaded, displayed and drawn -----------------------------------------

NAMES = ("L0H0", "L0H1", "L1H0", "L1H1")


def _heads() -> list[HeadRef]:
    return [HeadRef.parse(n) for n in NAMES]


def _scan(gen: torch.Generator, name: str) -> HeadScan:
    """Three heads run exactly, one estimated by attribution."""
    heads = _heads()
    return HeadScan(name, "kv4", "zero", "logit_diff", "auto", heads, _results(gen),
                    {h: _results(gen) for h in heads[:3]}, estimates={heads[3]: 0.25},
                    sizes={h: 0.1 for h in heads}, seconds=1.5)


def _views(gen: torch.Generator, text: str) -> CardViews:
    """Patterns of two heads on two samples of five tokens, with ``text`` as a token and a candidate."""
    heads = [HeadRef.parse("L0H0"), HeadRef.parse("L1H0")]
    b, t = 2, 5
    raw = torch.rand(b, 2, t, t, generator=gen).tril()
    pat = raw / raw.sum(-1, keepdim=True)
    ps = PatternSet(TokenBatch(torch.arange(b * t).view(b, t), torch.ones(b, t, dtype=torch.long)),
                    [[text, *(f" t{i}" for i in range(1, t))], [f" u{i}" for i in range(t)]], heads,
                    {(h.layer, h.kind): ([h], pat[:, i:i + 1]) for i, h in enumerate(heads)})
    seg = Segments((Span(0, 2), Span(2, 4)), Span(4, 5), 4, 5, True)
    return CardViews(ps, [seg, seg], [0, 1], [0, 0], [(" 1", text), (" 2", " 3")], (heads[0], heads[1]), text, heads,
                     HeadPatterns.encode(row_normalised(ps.sample(0), heads), heads))


def _circuit(gen: torch.Generator, name: str) -> Circuit:
    """:func:`made_up_circuit` of four heads, its curve with every column a discovered one has."""
    circuit = made_up_circuit(types.SimpleNamespace(name=name), _heads(), n_cards=0)
    circuit.curve = circuit.curve.reindex(columns=CURVE_COLUMNS)
    return circuit


def _faithfulness(gen: torch.Generator, method: str) -> Faithfulness:
    """The ranked circuits of every size, two random ones and the smallest (two heads)."""
    heads = _heads()
    points = [("ranked", 0, heads[:k], _results(gen)) for k in range(len(heads) + 1)]
    points += [("random", s, heads[s:s + 2], _results(gen)) for s in (1, 2)] + [("smallest", 0, heads[:2], _results(gen))]
    return Faithfulness("logit_diff", method, len(heads), _results(gen), _results(gen), points, smallest=heads[:2],
                        minimality={heads[0]: 0.5, heads[1]: 0.25}, n_boot=200)


def _delegation(gen: torch.Generator, name: str) -> Delegation:
    """A hybrid whose attention heads hold its one aggregate head."""
    roles = pd.DataFrame([{"name": n, "layer": int(n[1]), "head": int(n[3]), "kind": "attn", "offset": 0,
                           "gather": 0.1 * i, "aggregate": 0.9 - 0.2 * i, "selectivity": 0.5,
                           "role": "aggregate" if i == 0 else "other"} for i, n in enumerate(NAMES)],
                         columns=ROLE_COLUMNS)
    kind = {"kind": "attn", "title": "attention heads", "attention": "yes", "heads": 4, "scored": 4, "gather_heads": 0,
            "aggregate_heads": 1, "other_heads": 3, "gather_mean": 0.15, "gather_max": 0.3, "aggregate_mean": 0.6,
            "aggregate_max": 0.9, "selectivity_mean": 0.5, "selectivity_max": 0.5, "removed": "L0H0",
            "retrieval_intact": 0.9, "retrieval_removed": 0.3, "retrieval_random": 0.85, "knowledge_intact": 3.5,
            "knowledge_removed": 3.6, "knowledge_random": 3.55, "random_draws": 2}
    removal = pd.DataFrame([{"kind": "attn", "series": s, "seed": seed, "n_heads": n, "heads": hs, "accuracy": acc,
                             "logit_diff": 2 * acc, "knowledge": 3.5 + acc / 10}
                            for s, seed, n, hs, acc in (("intact", 0, 0, "", 0.9), ("aggregate", 0, 1, "L0H0", 0.3),
                                                        ("random", 0, 1, "L1H0", 0.8), ("random", 1, 1, "L1H1", 0.9))],
                           columns=REMOVAL_COLUMNS)
    return Delegation(name, {"name": "kv4", "n_samples": 8}, {"name": "prose", "metric": "lm_loss", "n_samples": 4},
                      0.25, roles, pd.DataFrame([kind], columns=KIND_COLUMNS), removal, {"seeds": 2}, ["made up"], 3.0)


def _comparison(gen: torch.Generator, name: str) -> CircuitComparison:
    rows = [{"task": f"{t}: {task}", "removed": removed, "accuracy": acc, "drop": 0.9 - acc, "heads": heads}
            for t, task in (("A", name), ("B", "mc"))
            for removed, acc, heads in (("none", 0.9, "none"), ("A top 2", 0.3, "L0H0,L0H1"),
                                        ("B top 2", 0.4, "L0H0,L1H0"), ("random 2 (median of 2)", 0.85, "the draws"))]
    metrics = {"top_k_overlap": 1, "shared_top_k": ["L0H0"], "top10_overlap": 4, "spearman": 0.5, "n_ranked": 4,
               "ranked_on": "heads run exactly in both scans", "random_draws": [{"heads": "L1H1,L0H1", "A": 0.85}]}
    return CircuitComparison((name, "mc"), 2, metrics, rows)


def _sweep(gen: torch.Generator, name: str) -> Sweep:
    heads = _heads()
    conditions = (("intact", 0, 0.9, ""), ("top1", 0, 0.6, "L0H0"), ("topk", 0, 0.4, "L0H0,L0H1"),
                  ("random", 0, 0.85, "L1H0,L1H1"), ("random", 1, 0.8, "L1H1,L0H1"))
    rows = [{"pairs": n, "condition": c, "seed": s, "k": len(hs.split(",")) if hs else 0, "accuracy": acc - n / 100,
             "logit_diff": 2 * acc, "gold_prob": acc / 2, "chance": 1 / n, "n_samples": 8, "heads": hs}
            for n in (4, 8) for c, s, acc, hs in conditions]
    return Sweep(name, [4, 8], heads[:2], [heads[2:], [heads[3], heads[1]]], pd.DataFrame(rows, columns=SWEEP_COLUMNS),
                 source="made up", seconds=2.0, settings={"samples": 8, "max_value": 9, "seed": 0, "bootstrap": 0})


def _prune(gen: torch.Generator, name: str) -> PruneResult:
    base = {"skipped_kinds": "attn", "task": "kv", "chance": 0.25, "n_samples": 8, "task_kind": "retrieval"}
    rows = [{**base, "mode": "from_end", "k": k, "layer": -1, "skipped": ",".join(str(3 - i) for i in range(k)),
             "accuracy": 0.9 - 0.3 * k, "logit_diff": 2.0 - k, "gold_prob": 0.5, "accuracy_drop": 0.3 * k,
             "logit_diff_drop": float(k)} for k in range(3)]
    rows += [{**base, "mode": "single", "k": 0 if layer < 0 else 1, "layer": layer, "skipped": str(max(layer, 0)),
              "accuracy": 0.9 - 0.1 * (layer + 1), "logit_diff": 1.5, "gold_prob": 0.5, "accuracy_drop": 0.1 * (layer + 1),
              "logit_diff_drop": 0.5} for layer in (-1, 0, 1)]
    keep = pd.DataFrame([{"row": row, "series": series, "seed": 0, "kept_heads": kept, "skipped": "2,3", "n_ablated": 6,
                          "task": "kv", "task_kind": "retrieval", "accuracy": acc, "logit_diff": 1.0, "chance": 0.25,
                          "n_samples": 8} for row, series, kept, acc in (("top heads", "top", "L0H0", 0.7),
                                                                          ("random heads", "random", "L1H1", 0.3))],
                        columns=KEEP_COLUMNS)
    tasks = {"kv": {"kind": "retrieval", "chance": 0.25, "intact": 0.9, "n_samples": 8, "task": {"name": "kv4"}}}
    return PruneResult(name, pd.DataFrame(rows, columns=PRUNE_COLUMNS), keep, tasks, 4, settings={"tasks": ["kv"]},
                       notes=["made up"])


def _mask(gen: torch.Generator, name: str) -> MaskResult:
    heads = _heads()
    rows = [{"condition": c, "seed": s, "heads": hs, "accuracy": acc, "accuracy_se": 0.05, "logit_diff": 2 * acc,
             "gold_prob": acc / 2, "chance": 0.25, "n_samples": 8}
            for c, s, hs, acc in (("intact", -1, "", 0.9), ("ga_masked", -1, "L0H0,L1H0", 0.3),
                                  ("ga_pattern", -1, "L0H0,L1H0", 0.8), ("random_masked", 0, "L0H1,L1H1", 0.85),
                                  ("random_masked", 1, "L1H1,L0H1", 0.9))]
    scores = pd.DataFrame([{"name": n, "kind": "attn", "offset": 0, "gather": 0.5, "aggregate": 0.4, "selectivity": 0.3}
                           for n in NAMES[:2]], columns=SCORE_COLUMNS)
    ga = [MaskedHead(heads[0], "gather", 0, "circuit"), MaskedHead(heads[2], "aggregate", 1, "measured")]
    random = {s: [MaskedHead(h, m.role, m.offset, "random") for h, m in zip(draw, ga)]
              for s, draw in ((0, heads[1::2]), (1, heads[::-2]))}
    return MaskResult(name, {"name": "kv4", "n_samples": 8}, ga, random, pd.DataFrame(rows, columns=MASK_COLUMNS),
                      scores, None, settings={"samples": 8}, notes=["made up"])


def _eval(gen: torch.Generator, name: str) -> EvalResult:
    rows = [{"condition": c, "seed": s, "task": "kv", "metric": "acc", "filter": "none", "value": v, "stderr": 0.02,
             "n_samples": 50, "higher_is_better": True, "n_heads": 2, "heads": hs}
            for c, s, v, hs in (("intact", 0, 0.9, ""), ("removed", 0, 0.4, "L0H0,L0H1"), ("random", 0, 0.85, "L1H0,L1H1"),
                                ("random", 1, 0.8, "L1H1,L0H1"))]
    return EvalResult(name, ["kv"], pd.DataFrame(rows, columns=EVAL_COLUMNS), ["L0H0", "L0H1"],
                      [["L1H0", "L1H1"], ["L1H1", "L0H1"]], {"intact": 1.0, "removed": 1.5},
                      settings={"method": "zero", "lm_eval": "0.4", "limit": 50}, notes=["made up"])


def _hybrid_build(gen: torch.Generator, name: str) -> HybridBuild:
    rows = [{"condition": c, "seed": s, "k": 0 if c == "none" else 2, "kept": "" if c == "none" else kept,
             "pairs": n, "accuracy": acc - n / 100 - s / 50, "logit_diff": 2 * acc, "gold_prob": acc / 2, "chance": 1 / n,
             "n_samples": 8, "final_loss": 0.5, "train_seconds": 10.0}
            for c, kept, acc in (("top", "L0H0,L0H1", 0.9), ("random", "L1H0,L1H1", 0.5), ("none", "", 0.3))
            for s in (0, 1) for n in (4, 8)]
    reference = pd.DataFrame({"pairs": [4, 8], "teacher": [0.95, 0.9], "teacher_top_only": [0.6, 0.5],
                              "chance": [0.25, 0.125]})
    return HybridBuild(name, 2, [4, 8], pd.DataFrame(rows, columns=HYBRID_COLUMNS), reference, list(NAMES), "made up",
                       {"top/0": "students/top-0"}, 12.0,
                       settings={"seeds": 2, "samples": 8, "config": {"steps": 10, "loss": "kl", "train_teacher_parts": False}},
                       notes=["made up"])


def _families(gen: torch.Generator, name: str) -> FamilyComparison:
    models = [name, "mamba"]
    table = pd.DataFrame([{"model": m, "architecture": "made up", "mixers": "attn x2", "heads": 4, "k": 2,
                           "intact": 0.9, "chance": 0.25, "top_heads": "L0H0,L0H1", "cost_1": 0.3 + i / 10,
                           "cost_k": 0.6, "random_cost_k": 0.1, "heads_to_half": 2.0, "aggregate_head": "L0H0",
                           "aggregate_kind": "attn", "shift": 0, "aggregate": 0.8, "gold_share": 0.7 - i / 10,
                           "line_entropy": 0.4, "final_entropy": 0.5} for i, m in enumerate(models)],
                         columns=FAMILY_COLUMNS)
    curve = pd.DataFrame([{"model": m, "j": j, "series": series, "seed": s, "accuracy": 0.9 - cost, "cost": cost,
                           "heads": ",".join(NAMES[:j])}
                          for m in models for series, s, step in (("top", 0, 0.3), ("random", 0, 0.05), ("random", 1, 0.1))
                          for j in range(0 if series == "top" else 1, 3) for cost in (step * j,)],
                         columns=FAMILY_CURVE_COLUMNS)
    scores = {"kind": "attn", "shift": 0, "aggregate": 0.8, "to_lines": 0.9, "gold_share": 0.7, "line_entropy": 0.4,
              "final_entropy": 0.5, "final_top1": 0.6}
    heads = pd.DataFrame([{"model": m, "rank": 1, "drop": 0.3, "name": "L0H0", "layer": 0, "head": 0, **scores}
                          for m in models])
    samples = pd.DataFrame([{"model": m, "name": "L0H0", "layer": 0, "head": 0, **scores, "gold_share": g, "sample": i}
                            for m in models for i, g in enumerate((0.6, 0.7, 0.8))])
    kinds = pd.DataFrame([{"model": m, "kind": "attn", "heads": 4, "scored": 1, "best_aggregate_head": "L0H0",
                           "shift": 0, "aggregate": 0.8, "gold_share": 0.7, "line_entropy": 0.4, "top_drop_head": "L0H0",
                           "top_drop": 0.3, "top_drop_accuracy": 0.6} for m in models])
    return FamilyComparison(models, table, curve, heads, samples, kinds, {m: "made up" for m in models}, 4.0,
                            settings={"pairs": 4, "samples": 8, "shifts": [0]}, notes=["made up"])


def _interactions(gen: torch.Generator, name: str) -> Interactions:
    heads = _heads()[:3]
    return Interactions(name, "kv4", "logit_diff", "zero", heads, _results(gen), [_results(gen) for _ in heads],
                        {(i, j): _results(gen) for i in range(3) for j in range(i + 1, 3)}, n_boot=200)


# a made-up result of every type, from a generator and a text that lands in a name or task field
MADE_UP = {"HeadScan": _scan, "CardViews": _views, "PatternSet": lambda gen, text: _views(gen, text).patterns,
           "Circuit": _circuit, "Faithfulness": _faithfulness, "Delegation": _delegation,
           "CircuitComparison": _comparison, "Sweep": _sweep, "PruneResult": _prune, "MaskResult": _mask,
           "EvalResult": _eval, "HybridBuild": _hybrid_build, "FamilyComparison": _families,
           "Interactions": _interactions}
WITH_FIGURE = {"Sweep", "PruneResult", "MaskResult", "EvalResult", "HybridBuild", "FamilyComparison"}
TENSORS = {"CardViews", "PatternSet"}  # tensor bundles: no JSON document (to_dict)


def _data(result: Result) -> Any:
    """What must survive a round trip: ``to_dict`` as strict JSON (NaN as null), or a tensor bundle's state."""
    if isinstance(result, CardViews):
        return [_data(result.patterns), [s.to_dict() for s in result.segments], result.gold, result.pred,
                result.candidates, result.pair, result.why, result.view, _data_of(result.all_heads.to_state())]
    if isinstance(result, PatternSet):
        return _data_of(result.to_state())
    return json.dumps(clean_json(result.to_dict()), sort_keys=True)


def _data_of(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


@pytest.mark.parametrize("kind", sorted(MADE_UP))
def test_every_result_type_saves_to_a_folder_or_a_file_and_loads_back_equal(kind, gen, tmp_path):
    result = MADE_UP[kind](gen, "m")
    assert isinstance(result, Result) and type(result).__name__ == kind
    cls = type(result)
    folder = tmp_path / "folder"
    folder.mkdir()
    no_png = {"png": False} if "png" in inspect.signature(result.save).parameters else {}  # PNGs: the report's tests
    written = result.save(folder, **no_png)                      # a folder: its FILE, or its files
    assert written in (folder, folder / cls.FILE)
    named = result.save(tmp_path / "named" / cls.FILE, **no_png)  # the file itself: the same place in another folder
    assert named.parent == tmp_path / "named" or named == tmp_path / "named"
    for path in (written, folder, named, tmp_path / "named"):
        back = cls.load(path)
        assert _data(back) == _data(result), path
        pd.testing.assert_frame_equal(back.to_frame(), result.to_frame())
    if kind not in TENSORS:  # a circuit's document names its scan's file: the scan comes beside it
        parts = (result.scan,) if isinstance(result, Circuit) else ()
        assert _data(cls.from_dict(json.loads(json.dumps(result.to_dict())), *parts)) == _data(result)
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in (tmp_path / "named").iterdir())


@pytest.mark.parametrize("kind", sorted(MADE_UP))
def test_every_result_type_displays_its_text_escaped(kind, gen):
    _safe(MADE_UP[kind](gen, HOSTILE)._repr_html_())


@pytest.mark.parametrize("kind", sorted(MADE_UP))
def test_every_result_type_plots_or_says_it_has_no_figure(kind, gen):
    import plotly.graph_objects as go

    result = MADE_UP[kind](gen, "m")
    if kind in WITH_FIGURE:
        fig = result.plot()
        assert isinstance(fig, go.Figure) and len(fig.data) >= 1
        assert fig.to_json() == result.figure().to_json()         # plot is the figure
        return
    with pytest.raises(NotImplementedError, match=rf"^{kind} has no figure of its own: its numbers are in \.to_frame\(\)"):
        result.plot()


@pytest.mark.parametrize("kind", ["HeadScan", "Circuit", "Faithfulness", "Delegation", "Interactions"])
def test_the_function_a_result_without_a_figure_names_draws_it(kind, gen):
    """A result of a lower layer has no figure of its own; the function of gna_interp.viz that its plot error names
    takes it and draws it."""
    import importlib

    import plotly.graph_objects as go

    result = MADE_UP[kind](gen, "m")
    with pytest.raises(NotImplementedError) as err:
        result.plot()
    named = re.findall(r"(gna_interp[\w.]+)\((\w+)\)", str(err.value))
    assert named and [n for n, _ in named] == re.findall(r"gna_interp[\w.]+(?=\()", type(result).DRAWN_BY)
    for name, _ in named:
        module, attr = name.rsplit(".", 1)
        fig = getattr(importlib.import_module(module), attr)(result)
        assert isinstance(fig, go.Figure) and len(fig.data) >= 1, name


@pytest.mark.parametrize("kind", sorted(TENSORS))
def test_a_tensor_result_names_a_function_that_exists(kind, gen):
    import importlib

    for name in re.findall(r"gna_interp[\w.]+(?=\()", type(MADE_UP[kind](gen, "m")).DRAWN_BY):
        module, attr = name.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), attr)), name
