"""Results without a folder of their own save to one JSON file and load back equal: path effects and interactions."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from gna_interp.circuits.interactions import Interactions
from gna_interp.circuits.path_store import load_path_effects, save_path_effects
from gna_interp.circuits.paths import Edge, PathEffects
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef


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
