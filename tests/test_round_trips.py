"""Results without a folder of their own save to one JSON file and load back equal (path effects, interactions,
evaluations, calibrations), and display themselves through the shared face with every text escaped."""

from __future__ import annotations

import dataclasses
import html
import json
import math
from typing import Any

import pandas as pd
import pytest
import torch

import gna_interp as gna
from gna_interp.circuits.interactions import Interactions
from gna_interp.circuits.path_store import load_path_effects, save_path_effects
from gna_interp.circuits.paths import Edge, PathEffects
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.results import REPR_ROWS, Result
from gna_interp.tasks.calibration import Calibration, FormResult
from gna_interp.tasks.evaluation import Evaluation
from gna_interp.tasks.sample import Sample
from gna_interp.engine.plan import CandidateScores

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
