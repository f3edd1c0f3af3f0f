"""Interventions as values and the one runner: serialisation, the blocks each names, and PlanRunner.run_under
against the context managers with a plain forward, an independent route to the same numbers."""

from __future__ import annotations

import json

import pytest
import torch

from gna_interp.engine.forward import run_plan
from gna_interp.engine.replay import FORWARDS, PlanRunner, SetAblation
from gna_interp.errors import HeadError, InputError
from gna_interp.interventions import (HeadAblation, Intervention, LayerSkip, PatternMask, ablate, applied, from_dict,
                                      mask_pattern, skip_layers)
from gna_interp.tasks import KVRetrieval

TASK = KVRetrieval(n_pairs=3, n_samples=4, max_value=20, seed=3)


def _hooks(model) -> int:
    points = {id(hp): hp for hp in model.bridge.hook_dict.values()}.values()
    return sum(len(hp._forward_hooks) + len(hp._forward_pre_hooks) for hp in points)


def test_values_round_trip_through_json_and_name_their_blocks(tiny_models):
    model = tiny_models["bamba"]
    values = [HeadAblation("L0S1,L1H3"), HeadAblation(["L1H0"], "mean", ["a b c", "fig:12 owl:7"]),
              LayerSkip([2, 0]), LayerSkip(-1), PatternMask({"L1H2": torch.tril(torch.ones(5, 5)) * 0.5})]
    for v in values:
        back = from_dict(json.loads(json.dumps(v.to_dict())))
        assert type(back) is type(v) and back.to_dict() == v.to_dict()
        assert back.layers(model) == v.layers(model)
    assert [v.layers(model) for v in values] == [[0, 1], [1], [0, 2], [2], [1]]
    assert values[0].first_layer(model) == 0 and HeadAblation([]).first_layer(model) == model.n_layers
    assert [v.positional for v in values] == [False, False, False, False, True]
    assert HeadAblation(["L1H0"], "resample", ["x"]).positional  # reference rows align with the forward's rows


def test_bad_values_are_refused_clearly(tiny_models):
    model = tiny_models["llama"]
    with pytest.raises(InputError, match="unknown intervention kind 'warp'"):
        from_dict({"kind": "warp"})
    with pytest.raises(InputError, match="with a 'kind'"):
        from_dict(["head_ablation"])
    hostile = [({"kind": "layer_skip"}, "no 'layers' field"), ({"kind": "head_ablation", "heads": 3}, "cannot be read"),
               ({"kind": "layer_skip", "layers": ["1"]}, "must be integers"),
               ({"kind": "pattern_mask", "masks": "L0H1"}, "cannot be read"),
               ({"kind": "pattern_mask", "masks": {"L0H1": [[1, 0], [1]]}}, "cannot be read"),
               ({"kind": "head_ablation", "heads": ["L0H1"], "method": "mean"}, "needs a reference")]
    for data, why in hostile:
        with pytest.raises((InputError, HeadError), match=why):
            from_dict(data)
    with pytest.raises(InputError, match="needs a reference"):
        HeadAblation(["L0H1"], "mean")
    with pytest.raises(HeadError, match="malformed"):
        HeadAblation(["layer0"])
    with pytest.raises(InputError, match="cannot be written"):
        HeadAblation(["L0H1"], "mean", model.tokenize(["a b"])).to_dict()
    with pytest.raises(InputError, match="out of range"):
        LayerSkip([model.n_layers]).layers(model)
    with pytest.raises(HeadError, match="mapping"):
        PatternMask(["L0H1"])  # type: ignore[arg-type]
    runner = PlanRunner(model, TASK, replays=FORWARDS)
    with pytest.raises(InputError, match="list of Intervention values"):
        runner.run_under("L0H1")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="not interventions"):
        runner.run_under([["L0H1"]])  # type: ignore[list-item]


@pytest.mark.parametrize("family", ["llama", "bamba"])
def test_run_under_equals_the_context_managers_with_a_plain_forward(tiny_models, family):
    model = tiny_models[family]
    head = {"llama": "L0H1", "bamba": "L0S1"}[family]
    full = PlanRunner(model, TASK, batch_size=2, replays=FORWARDS)
    assert full.store is None and not full.fast
    got = full.run_under([LayerSkip([1]), HeadAblation([head])])
    with skip_layers(model, [1]), ablate(model, [head]):
        want = run_plan(model, full.plan, 2)
    assert torch.equal(got.scores, want.scores)
    clean = full.run_under([])
    assert float((got.scores - clean.scores).abs().max()) > 1e-4, "the interventions changed nothing"
    # a replaying runner scores head ablations by replays: the same numbers to float noise
    fast = PlanRunner(model, TASK, batch_size=2)
    torch.testing.assert_close(fast.run_under([HeadAblation([head])]).scores,
                               full.run_under([HeadAblation([head])]).scores, atol=1e-4, rtol=0)
    assert _hooks(model) == 0


def test_per_chunk_masks_match_the_ablation_they_amount_to(tiny_models):
    """A pattern mask of zeros over every position removes the head's mix, which is zeroing its output (no D term
    for attention): the per-chunk route and the head ablation agree."""
    model = tiny_models["llama"]
    runner = PlanRunner(model, TASK, batch_size=2, replays=FORWARDS)
    seen = []

    def zeros(chunk):
        seen.append(tuple(chunk.batch.ids.shape))
        t = chunk.batch.ids.shape[1]
        return [PatternMask({"L1H2": torch.zeros(t, t)})]

    masked = runner.run_under(zeros)
    assert len(seen) >= 2 and all(b <= 2 for b, _ in seen)  # one call per chunk of plain rows
    torch.testing.assert_close(masked.scores, runner.run_under([HeadAblation(["L1H2"])]).scores, atol=1e-5, rtol=0)
    ones = runner.run_under(lambda chunk: [PatternMask({"L1H2": torch.ones(chunk.batch.ids.shape[1],
                                                                           chunk.batch.ids.shape[1])})])
    torch.testing.assert_close(ones.scores, runner.run_under([]).scores, atol=1e-5, rtol=0)


def test_interventions_are_undone_when_a_forward_fails(tiny_models):
    model = tiny_models["llama"]
    runner = PlanRunner(model, TASK, batch_size=2, replays=FORWARDS)
    clean = runner.run_under([])
    with pytest.raises(InputError):  # a mask of the wrong size fails inside the forward
        runner.run_under([HeadAblation(["L0H0"]), PatternMask({"L1H2": torch.ones(3, 3)})])
    assert _hooks(model) == 0
    assert torch.equal(runner.run_under([]).scores, clean.scores)
    with pytest.raises(RuntimeError, match="boom"):
        with applied(model, [LayerSkip([0]), HeadAblation(["L2H1"])]):
            assert _hooks(model) > 0
            raise RuntimeError("boom")
    assert _hooks(model) == 0


def test_set_ablation_is_the_runner_of_head_ablations(tiny_models):
    model = tiny_models["llama"]
    sets = SetAblation(model, TASK, batch_size=2)
    on_runner = PlanRunner(model, TASK, batch_size=2)
    assert torch.equal(sets.run(["L1H2", "L2H0"]).scores,
                       on_runner.run_under([HeadAblation(["L1H2"]), HeadAblation(["L2H0"])]).scores)
    sets.stack = 3
    sub = sets.on(KVRetrieval(n_pairs=3, n_samples=2, max_value=20, seed=3))
    assert isinstance(sub, SetAblation) and len(sub.plan.samples) == 2 and sub.stack == 3
    with mask_pattern(model, {}):  # an empty mask is no intervention
        assert torch.equal(sets.run([]).scores, sets.clean().scores)
    assert issubclass(HeadAblation, Intervention)
