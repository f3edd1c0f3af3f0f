"""SSM implicit attention: reconstruction of the mixer output, the scan recurrence, the formulas of
DESIGN §4, TransformerLens's own computation, padding, and computing only what is asked for.

The tiny random models' SSM mixers are "livened" (in_proj / x_proj / conv weights re-drawn at unit
scale): with the default 0.02-std initialisation ``M x`` is ~1e-5 of ``D x`` in Bamba, so a test
could pass with ``M = 0``. Every reconstruction test asserts that ``M x`` carries real weight.
"""

from __future__ import annotations

import pytest
import torch

from gna_interp import patterns
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.models.ssm import layer_terms
from gna_interp.models.ssm_kernel import SSMTerms, implicit_attention, mix, mixer_output

PROMPTS = ["Memorize the following dictionary:\nscallops:84\npear:12\nThe value of the key 'pear' is",
           "the quick brown fox jumps"]


def _layer_io(model, spec, batch):
    names = [f"{spec.bridge_path}.hook_in", f"{spec.bridge_path}.hook_out"]
    _, cache = model.run_with_cache(batch, names_filter=lambda n: n in names)
    return cache[names[0]], cache[names[1]]


def _rel(a, b):
    return float((a - b).detach().norm() / b.detach().norm())


def _ssm_specs(model):
    return [s for s in model.layers if s.kind in ("ssm1", "ssm2")]


# ---- proof by reconstruction ------------------------------------------------------------------


@pytest.mark.parametrize("family", ["mamba", "mamba2", "bamba", "jamba"])
def test_exact_pattern_reproduces_mixer_output(models, family):
    """M x + D x through gate / gated norm / out_proj == the bridge's mixer output (padded batch)."""
    model = models(family)
    batch = model.tokenize(PROMPTS)
    assert batch.padded and batch.ids.shape[1] > 32  # several HF chunks, several query blocks
    keep = batch.attention_mask.bool()
    specs = _ssm_specs(model)
    assert specs
    for spec in specs:
        hidden, ref = _layer_io(model, spec, batch)
        terms = layer_terms(model, spec, hidden, batch.attention_mask)
        heads = model.heads(kind=spec.kind, layers=[spec.layer])
        M = patterns(model, batch, heads, form="exact").stack()  # [b, units, T, T]
        mx = torch.einsum("bnqk,bknp->bqnp", M, terms.x)
        dx = terms.x * terms.D[None, None, :, None]
        assert mx[keep].norm() > 0.2 * dx[keep].norm(), "M x must carry real weight for the test to mean anything"
        out = mixer_output(model.hf_module(spec.bridge_path), terms, mx + dx)
        assert _rel(out[keep], ref[keep]) <= 1e-4, (family, spec.layer)
        # The blocked mixer (no full M) agrees too, with small query blocks crossing HF's chunks.
        out2 = mixer_output(model.hf_module(spec.bridge_path), terms, mix(terms, range(terms.n_units), query_block=7))
        assert _rel(out2[keep], ref[keep]) <= 1e-4


@pytest.mark.parametrize("family", ["mamba", "mamba2"])
def test_matches_recurrent_scan(models, family):
    """M x + D x equals the step-by-step recurrence h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t, y_t = C_t h_t + D x_t."""
    model = models(family)
    batch = model.tokenize(PROMPTS)
    spec = _ssm_specs(model)[-1]
    hidden, _ = _layer_io(model, spec, batch)
    t = layer_terms(model, spec, hidden, batch.attention_mask)
    b, T = t.shape
    x, dt, A = t.x.double(), t.dt.double(), t.A.double()  # [b,T,u,P], [b,T,u], [u,Na]
    g = torch.arange(t.n_units) // t.units_per_group
    B, C = t.B.double()[:, :, g], t.C.double()[:, :, g]  # [b, T, u, N]
    h = torch.zeros(b, t.n_units, x.shape[-1], B.shape[-1], dtype=torch.float64)
    ys = []
    for i in range(T):
        decay = torch.exp(dt[:, i, :, None] * A[None])  # [b, u, Na]
        h = decay[:, :, None, :] * h + (dt[:, i, :, None, None] * x[:, i, :, :, None] * B[:, i, :, None, :])
        ys.append(torch.einsum("bupn,bun->bup", h, C[:, i]) + t.D.double()[None, :, None] * x[:, i])
    y_scan = torch.stack(ys, 1)
    y = mix(t, range(t.n_units))
    assert _rel(y.double(), y_scan) <= 1e-5
    M = implicit_attention(t, list(range(t.n_units)))
    y_m = torch.einsum("bnqk,bknp->bqnp", M.double(), x) + t.D.double()[None, None, :, None] * x
    assert _rel(y_m, y_scan) <= 1e-5


# ---- the formulas of DESIGN §4, brute force -----------------------------------------------------


def _brute(t: SSMTerms, unit: int, form: str) -> torch.Tensor:
    """M[b, t, s] straight from the formula, float64, one (t, s) product at a time over the state."""
    b, T = t.shape
    g = unit // t.units_per_group
    dt = t.dt[:, :, unit].double()
    A = t.A[unit].double()
    B, C = t.B[:, :, g].double(), t.C[:, :, g].double()
    out = torch.zeros(b, T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            decay = torch.exp(A[None, :] * dt[:, j + 1:i + 1].sum(1, keepdim=True))  # [b, Na]
            val = (C[:, i] * decay * B[:, j]).sum(-1)
            out[:, i, j] = val * dt[:, j] if form == "exact" else val
    return out


@pytest.mark.parametrize("family", ["mamba2", "jamba"])
@pytest.mark.parametrize("form", ["exact", "attention"])
def test_matches_brute_force_formula(models, family, form):
    model = models(family)
    spec = _ssm_specs(model)[0]
    batch = model.tokenize([PROMPTS[1], "fox"])
    hidden, _ = _layer_io(model, spec, batch)
    t = layer_terms(model, spec, hidden, batch.attention_mask)
    units = [0, t.n_units - 1, 1]
    ref = torch.stack([_brute(t, u, form) for u in units], 1)
    for qb, elems in [(None, 1 << 22), (5, 1 << 22), (3, 50)]:  # tiny block_elems: one unit per chunk
        got = implicit_attention(t, units, form=form, query_block=qb, block_elems=elems)
        assert _rel(got.double(), ref) <= 1e-5, (qb, elems)


def test_channel_group_is_mean_of_channels(models):
    model = models("jamba")
    batch = model.tokenize(PROMPTS[1])
    pset = patterns(model, batch, ["L0C4+3", "L0C4", "L0C5", "L0C6", "L2C0+2"])
    mean = (pset["L0C4"] + pset["L0C5"] + pset["L0C6"]) / 3
    assert torch.allclose(pset["L0C4+3"], mean, atol=1e-6)
    spec = model.layer_spec(0, "ssm1")
    hidden, _ = _layer_io(model, spec, batch)
    t = layer_terms(model, spec, hidden)
    got = implicit_attention(t, [[4, 5, 6], 4], group_reduce="abs_mean", query_block=5)
    singles = implicit_attention(t, [4, 5, 6])
    assert torch.allclose(got[:, 0], singles.abs().mean(1), atol=1e-6)
    assert torch.allclose(got[:, 1], singles[:, 0], atol=1e-7)  # a lone channel stays signed


# ---- TransformerLens cross-check ------------------------------------------------------------


@pytest.mark.parametrize("family", ["mamba", "mamba2", "bamba", "jamba"])
def test_agrees_with_transformer_lens(models, family):
    """TL's ``compute_ssm_effective_attention`` reads ``conv1d.hook_out`` (and ``dt_proj.hook_out`` for
    Mamba-1), which never fire on the default path: the HF mixers call ``causal_conv1d_fn`` with the
    raw weights and ``dt_proj.weight @ ...`` instead of the modules, so on CPU TL raises "needs
    ...conv1d.hook_out in cache". They fire on TL's opt-in ``eager_scan`` path, which only runs
    without a cache (``use_cache=False``); there both of its forms match ours. One unpadded sequence:
    TL's eager Mamba-2 scan masks padding only for batch > 1, and TL declares pad positions out of contract.
    """
    model = models(family)
    spec = _ssm_specs(model)[0]
    batch = model.tokenize(PROMPTS[0])
    _, cache = model.run_with_cache(batch)
    with pytest.raises(RuntimeError, match="hook_out"):
        cache.compute_ssm_effective_attention(layer=spec.layer, include_dt_scaling=True)
    mixer = model.bridge.get_submodule(spec.bridge_path)
    mixer.eager_scan = True
    try:
        _, cache = model.run_with_cache(batch, use_cache=False)
    finally:
        mixer.eager_scan = False
    heads = model.heads(kind=spec.kind, layers=[spec.layer])
    for tl_flag, form in [(True, "exact"), (False, "attention")]:
        ours = patterns(model, batch, heads, form=form).stack()
        theirs = cache.compute_ssm_effective_attention(layer=spec.layer, include_dt_scaling=tl_flag)
        assert theirs.shape == ours.shape
        assert _rel(ours, theirs.float()) <= 1e-5, form


# ---- padding, selection, the PatternSet -----------------------------------------------------


@pytest.mark.parametrize("family", ["mamba2", "jamba"])
def test_left_padding_does_not_change_real_patterns(models, family):
    model = models(family)
    heads = model.heads(kind=_ssm_specs(model)[0].kind)[:3]
    padded = patterns(model, PROMPTS, heads)
    alone = patterns(model, PROMPTS[1], heads)
    assert padded.batch.padded
    assert torch.allclose(padded.sample(1), alone.sample(0), atol=1e-5, rtol=1e-4)
    pad = ~padded.batch.attention_mask[1].bool()
    assert padded.stack()[1][:, pad].abs().sum() == 0 and padded.stack()[1][:, :, pad].abs().sum() == 0


def test_unrequested_units_are_never_touched(models):
    """Poison every other head's Δ and A: the requested heads come out finite and unchanged."""
    model = models("mamba2")
    spec = model.layer_spec(1, "ssm2")
    batch = model.tokenize(PROMPTS)
    hidden, _ = _layer_io(model, spec, batch)
    t = layer_terms(model, spec, hidden, batch.attention_mask)
    clean = implicit_attention(t, [2])
    poisoned_dt, poisoned_a = t.dt.clone(), t.A.clone()
    others = [u for u in range(t.n_units) if u != 2]
    poisoned_dt[:, :, others] = float("nan")
    poisoned_a[others] = float("nan")
    bad = SSMTerms(t.kind, t.x, poisoned_dt, poisoned_a, t.B, t.C, t.D, t.gate, t.attention_mask)
    got = implicit_attention(bad, [2])
    assert got.shape == (2, 1, t.shape[1], t.shape[1])
    assert torch.isfinite(got).all() and torch.equal(got, clean)


def test_patterns_mixes_attention_and_ssm_heads(models):
    model = models("bamba")
    pset = patterns(model, PROMPTS, ["L0S1", "L1H2", "L2S3"], form="attention")
    assert [h.name for h in pset.heads] == ["L0S1", "L1H2", "L2S3"]
    assert set(pset.by_layer) == {(0, "ssm2"), (1, "attn"), (2, "ssm2")}
    T = pset.batch.ids.shape[1]
    for h in pset.heads:
        p = pset[h]
        assert p.shape == (2, T, T) and torch.isfinite(p).all()
        assert torch.triu(p, diagonal=1).abs().max() == 0  # causal
    assert pset.options.form == "attention"
    assert pset.sample(1, ["L0S1"]).shape[-1] == int(pset.batch.attention_mask[1].sum())
    # exact = attention form times Δ_s per column
    exact = patterns(model, PROMPTS, ["L0S1"])["L0S1"]
    spec = model.layer_spec(0, "ssm2")
    hidden, _ = _layer_io(model, spec, pset.batch)
    dt = layer_terms(model, spec, hidden, pset.batch.attention_mask).dt[:, :, 1]
    assert torch.allclose(exact, pset["L0S1"] * dt[:, None, :], atol=1e-6, rtol=1e-5)


def test_bad_options_and_heads_fail_clearly(models):
    model = models("mamba2")
    with pytest.raises(InputError, match="form='softmax'"):
        patterns(model, "hi", ["L0S0"], form="softmax")
    spec = model.layer_spec(0, "ssm2")
    hidden, _ = _layer_io(model, spec, model.tokenize("hi"))
    t = layer_terms(model, spec, hidden)
    with pytest.raises(InputError, match="out of range"):
        implicit_attention(t, [7])
    with pytest.raises(InputError, match="group_reduce"):
        implicit_attention(t, [0], group_reduce="max")
    assert HeadRef.parse("L0S0") in patterns(model, "hi", ["L0S0"])
