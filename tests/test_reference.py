"""The public reference scan (a plain loop: ablate one head, score the task from scratch) against the fast exact
scan (cached prefixes, replay of the later blocks only), on every tiny family; and HeadScan.drop / drops."""

from __future__ import annotations

import math

import pytest
import torch

from gna_interp import ablate, evaluate, reference_scan, scan_heads
from gna_interp.errors import InputError
from gna_interp.tasks import KVRetrieval


@pytest.mark.parametrize("family", ["llama", "mamba", "mamba2", "bamba"])
def test_exact_scan_equals_the_reference_loop(family, tiny_models):
    model = tiny_models[family]
    heads = model.heads()[:6]
    task = KVRetrieval(n_pairs=3, n_samples=4, seed=1, max_value=20)
    fast = scan_heads(model, task, heads=heads, strategy="exact", progress=False)
    ref = reference_scan(model, task, heads=heads)
    assert ref.strategy == "reference" and set(ref.exact) == set(heads)
    for h in heads:
        assert fast.drop(h) == pytest.approx(ref.drop(h), abs=1e-5)
        assert fast.drop(h, "accuracy") == pytest.approx(ref.drop(h, "accuracy"), abs=1e-9)
    assert list(fast.drops()) == heads


def test_reference_drop_is_the_evaluation_difference(tiny_models):
    """drop(h) is the intact mean logit difference minus the one with h removed, as evaluate measures them."""
    model = tiny_models["llama"]
    task = KVRetrieval(n_pairs=3, n_samples=4, seed=2, max_value=20)
    h = model.heads()[3]
    ref = reference_scan(model, task, heads=[h])
    intact = evaluate(model, task).logit_diff
    with ablate(model, [h]):
        removed = evaluate(model, task).logit_diff
    assert ref.drop(h) == pytest.approx(intact - removed, abs=1e-5)


def test_drop_of_an_attribution_only_head_is_its_estimate(tiny_models):
    model = tiny_models["llama"]
    task = KVRetrieval(n_pairs=3, n_samples=4, seed=1, max_value=20)
    scan = scan_heads(model, task, strategy="attribution", progress=False)
    h = scan.heads[0]
    assert h not in scan.exact and scan.drop(h) == pytest.approx(scan.est_drop(h))
    assert math.isnan(scan.drop(h, "accuracy"))


def test_reference_scan_refuses_what_it_cannot_do(tiny_models):
    model = tiny_models["llama"]
    task = KVRetrieval(n_pairs=3, n_samples=2, seed=1, max_value=20)
    with pytest.raises(InputError, match="method 'zero' or 'mean'"):
        reference_scan(model, task, heads="L0H0", method="resample")
    with pytest.raises(InputError, match="needs a Task"):
        reference_scan(model, ["a prompt"], heads="L0H0")  # type: ignore[arg-type]
    w = next(model.bridge.parameters()).clone()
    reference_scan(model, task, heads="L0H0")
    assert torch.equal(next(model.bridge.parameters()), w)  # every ablation undone
