"""Properties checked on generated inputs (hypothesis): head names round-trip, patterns do not depend on left
padding, and an ablation always leaves the model as it found it, exceptions included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gna_interp import HeadRef, ablate, patterns
from gna_interp.models.registry import adapter, kinds
from gna_interp.tasks import word_list

SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def head_refs(draw: st.DrawFn) -> HeadRef:
    kind = draw(st.sampled_from(sorted(kinds())))
    width = draw(st.integers(1, 64)) if adapter(kind).groupable else 1
    return HeadRef(draw(st.integers(0, 999)), draw(st.integers(0, 99_999)), kind, width)


@settings(max_examples=300)
@given(head_refs())
def test_head_names_round_trip(h):
    assert HeadRef.parse(h.name) == h
    assert HeadRef.parse(h) is h
    assert h.name.startswith(f"L{h.layer}{h.adapter.letter}{h.head}")


words = st.lists(st.sampled_from(word_list()[:200]), min_size=1, max_size=8).map(" ".join)


@pytest.mark.parametrize("family", ["llama", "mamba2"])
@SLOW
@given(short=words, long=words)
def test_patterns_do_not_depend_on_left_padding(tiny_models, family, short, long):
    """The patterns of a prompt alone equal its rows in a batch where a longer prompt pads it on the left."""
    model = tiny_models[family]
    heads = model.heads()[:: max(1, len(model.heads()) // 4)]
    long = long + " " + short + " and more words"
    alone = patterns(model, short, heads=heads)
    batch = patterns(model, [short, long], heads=heads)
    n = alone[heads[0].name].shape[-1]
    for h in heads:
        padded = batch[h.name][0]
        pad = padded.shape[-1] - n
        torch.testing.assert_close(padded[pad:, pad:], alone[h.name][0], atol=1e-5, rtol=1e-4)
        assert padded[:pad].abs().sum() == 0 and padded[:, :pad].abs().sum() == 0


class Boom(Exception):
    pass


@pytest.mark.parametrize("family", ["llama", "bamba"])
@SLOW
@given(data=st.data(), method=st.sampled_from(["zero", "mean"]), fail=st.booleans())
def test_ablation_restores_the_model(tiny_models, family, data, method, fail):
    """Whatever heads are ablated and however the block is left (normally or by an exception), the model's
    logits, hooks and parameters afterwards are those from before."""
    model = tiny_models[family]
    prompt = "Memorize the following dictionary:\napple:12\nriver:7\nThe value of the key 'apple' is"
    heads = data.draw(st.lists(st.sampled_from(model.heads()), min_size=1, max_size=5, unique=True))
    before = model.forward(prompt)
    params = [p.detach().clone() for p in model.hf_model.parameters()]
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.bridge.modules())
    reference = ["The river is 7 and the apple is 12."] if method == "mean" else None
    try:
        with ablate(model, heads, method, reference):
            changed = model.forward(prompt)
            if fail:
                raise Boom
    except Boom:
        pass
    assert not torch.equal(changed, before) or method == "mean"
    torch.testing.assert_close(model.forward(prompt), before, atol=0, rtol=0)
    assert all(torch.equal(p, q) for p, q in zip(model.hf_model.parameters(), params))
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.bridge.modules()) == hooks
