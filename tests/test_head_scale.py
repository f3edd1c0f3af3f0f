"""`HeadScale`: heads' outputs multiplied by a factor, against by-hand computations -- factor 0 is zero ablation,
1 the intact model, 0.5 a forward hook written here that halves the head's channels (and, for attention, the copy of
the model whose output-projection columns are halved) -- for every head kind, undone on exit."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch

import gna_interp as gna
from gna_interp.errors import HeadError, InputError
from gna_interp.engine.metrics import LOGIT_DIFF, results
from gna_interp.engine.replay import FORWARDS, PlanRunner
from gna_interp.interventions import applied, from_dict
from gna_interp.interventions.scaling import HeadScale, scale_heads
from gna_interp.models.hf import unwrap

PROMPTS = ["fig:12 owl:7 The value of owl is", "a b c"]
HEADS = {"llama": ["L0H1", "L1H0", "L1H3"], "mamba2": ["L0S1", "L1S0"], "mamba": ["L0C3", "L1C0+4"]}


def _by_hand(model, heads, factor):
    """Forward hooks written out here: each head's channels ``start:stop`` of its site, times ``factor``."""
    def hook_for(site):
        def hook(x, hook=None):
            y = x.clone()
            flat = y.reshape(*y.shape[:2], -1)  # a view of the clone: [batch, pos, channels]
            flat[..., site.start:site.stop] = flat[..., site.start:site.stop] * factor
            return y
        return hook

    return [(s.hook, hook_for(s)) for s in (model.head_site(h) for h in heads)]


@pytest.mark.parametrize("family", sorted(HEADS))
def test_scaling_equals_ablation_the_intact_model_and_a_hook_by_hand(models, family):
    model = models(family)
    heads = HEADS[family]
    intact = model.forward(PROMPTS)
    with gna.ablate(model, heads):
        zeroed = model.forward(PROMPTS)
    with scale_heads(model, heads, 0.0) as parsed:
        assert [h.name for h in parsed] == heads
        assert torch.equal(model.forward(PROMPTS), zeroed)
    with scale_heads(model, heads, 1):
        assert torch.equal(model.forward(PROMPTS), intact)
    with model.hooks(_by_hand(model, heads, 0.5)):
        halved = model.forward(PROMPTS)
    with scale_heads(model, heads, 0.5):
        assert torch.equal(model.forward(PROMPTS), halved)
    assert not torch.allclose(halved, intact, atol=1e-4) and not torch.allclose(halved, zeroed, atol=1e-4)
    assert torch.equal(model.forward(PROMPTS), intact)  # nothing left behind


def test_half_a_head_is_half_its_output_projection(models):
    """Attention: scaling a head's output is scaling its columns of ``o_proj`` (a copy of the model, edited)."""
    model = models("llama")
    hf = copy.deepcopy(model.hf_model)
    for name in HEADS["llama"]:
        site = model.head_site(name)
        with torch.no_grad():
            hf.model.layers[site.head.layer].self_attn.o_proj.weight[:, site.columns] *= 0.5
    assert unwrap(hf.model.layers[0].self_attn.o_proj).weight.shape[1] == site.width
    edited = gna.load_model(hf, model.tokenizer)
    with scale_heads(model, HEADS["llama"], 0.5):
        got = model.forward(PROMPTS)
    assert torch.allclose(got, edited.forward(PROMPTS), atol=1e-5)


def test_a_task_scored_under_the_value_and_the_value_as_data(tiny_models):
    model = tiny_models["llama"]
    task = gna.KVRetrieval(3, 4, seed=1, max_value=9)
    value = HeadScale(("L0H1", "L2H2"), 0)
    runner = PlanRunner(model, task, replays=FORWARDS)
    with gna.ablate(model, ["L0H1", "L2H2"]):
        ablated = gna.evaluate(model, task, progress=False).logit_diff
    with value.applied(model):
        assert gna.evaluate(model, task, progress=False).logit_diff == pytest.approx(ablated, abs=1e-5)
    scores = runner.run_under([value])
    assert LOGIT_DIFF.value(results(scores)) == pytest.approx(ablated, abs=1e-5)
    back = from_dict(json.loads(json.dumps(HeadScale("L1H0,L0H2", 2).to_dict())))
    assert back == HeadScale(["L1H0", "L0H2"], 2.0) and back.to_dict()["heads"] == ["L1H0", "L0H2"]
    assert value.layers(model) == [0, 2] and HeadScale([], 0.5).layers(model) == [] and not value.positional
    with applied(model, [HeadScale([], 3.0)]):
        assert torch.equal(model.forward(PROMPTS), model.forward(PROMPTS))


def test_bad_values_are_refused_and_a_failed_forward_leaves_nothing(tiny_models):
    model = tiny_models["llama"]
    for factor in (float("nan"), float("inf"), True, "0.5", None):
        with pytest.raises(InputError, match="finite number"):
            HeadScale(["L0H1"], factor)  # type: ignore[arg-type]
    with pytest.raises(HeadError, match="malformed"):
        HeadScale(["layer0"], 0.5)
    with pytest.raises(HeadError):
        HeadScale(["L9H0"], 0.5).layers(model)
    with pytest.raises(InputError, match="no 'factor' field"):
        from_dict({"kind": "head_scale", "heads": ["L0H1"]})
    intact = model.forward(PROMPTS)
    with pytest.raises(RuntimeError, match="boom"):
        with scale_heads(model, ["L0H1"], 0.0):
            raise RuntimeError("boom")
    assert torch.equal(model.forward(PROMPTS), intact)


def test_the_architecture_guide_shows_this_very_file():
    """docs/architecture.md lists the module as shipped, so the worked example cannot drift from the code."""
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    shown = re.search(r'^```python title="gna_interp/interventions/scaling.py"\n(.*?)^```', page, flags=re.S | re.M)
    assert shown is not None, "the guide shows no gna_interp/interventions/scaling.py"
    assert shown.group(1) == (root / "gna_interp" / "interventions" / "scaling.py").read_text(encoding="utf-8")
