"""`mask_pattern`: identity with all-ones masks, the diagonal-only SSM head, attention masks on both
kinds of attention bridge (pattern seam: Llama/Bamba; delegated to HF: Jamba), clean restoration."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gna_interp.errors import HeadError, InputError
from gna_interp.interventions import mask_pattern
from gna_interp.models.hf import unwrap
from gna_interp.models.ssm import layer_terms

PROMPTS = ["Memorize the following dictionary:\nscallops:84\npear:12\nThe value of the key 'pear' is",
           "the quick brown fox jumps"]


def hook_count(model) -> int:
    """Every torch hook on every module of the bridge (HF modules included) plus TL hook handles."""
    n = 0
    for mod in model.bridge.modules():
        n += len(mod._forward_hooks) + len(mod._forward_pre_hooks) + len(mod._backward_hooks)
        n += len(getattr(mod, "fwd_hooks", [])) + len(getattr(mod, "bwd_hooks", []))
    return n


HEADS = {
    "llama": ["L0H1", "L2H3"],
    "mamba": ["L0C0", "L1C5+3"],
    "mamba2": ["L0S1", "L1S3"],
    "bamba": ["L0S0", "L0S3", "L1H1", "L2S2"],
    "jamba": ["L0C3", "L0C8+4", "L1H0", "L2C100"],
}


@pytest.mark.parametrize("family", sorted(HEADS))
def test_all_ones_causal_mask_leaves_logits_unchanged(models, family):
    model = models(family)
    batch = model.tokenize(PROMPTS)
    T = batch.ids.shape[1]
    keep = batch.attention_mask.bool()
    base = model.forward(batch)
    ones = torch.ones(T, T).tril()
    for renormalize in (False, True):
        with mask_pattern(model, {h: ones for h in HEADS[family]}, renormalize=renormalize):
            out = model.forward(batch)
        assert (out - base)[keep].abs().max() <= 1e-5
    # ... while a real mask on the same heads does change them (the hooks are live).
    with mask_pattern(model, {h: torch.eye(T) for h in HEADS[family]}):
        assert (model.forward(batch) - base)[keep].abs().max() > 1e-3


@pytest.mark.parametrize("family,head", [("mamba2", "L1S2"), ("bamba", "L2S1"), ("mamba", "L1C7"),
                                         ("jamba", "L2C9+3")])
def test_diagonal_mask_gives_diagonal_scan(models, family, head):
    """Diagonal-only mask: y_t = (M_tt + D) x_t with M_tt = (C_t·B_t) Δ_t, other units untouched."""
    model = models(family)
    h = model.check_head(head)
    spec = model.layer_spec(h.layer, h.kind)
    target = f"{spec.bridge_path}.{'inner_norm' if h.kind == 'ssm2' else 'out_proj'}.hook_in"
    names = [target, f"{spec.bridge_path}.hook_in"]
    batch = model.tokenize(PROMPTS)
    T = batch.ids.shape[1]
    _, base = model.run_with_cache(batch, names_filter=lambda n: n in names)
    with mask_pattern(model, {h: torch.eye(T)}):
        _, masked = model.run_with_cache(batch, names_filter=lambda n: n in names)
    assert torch.equal(masked[names[1]], base[names[1]])  # the layer's input is upstream of the mask
    t = layer_terms(model, spec, masked[names[1]], batch.attention_mask)
    got, ref = masked[target], base[target]
    P = t.x.shape[-1]
    units = list(h.channels) if h.kind == "ssm1" else [h.head]
    touched = torch.zeros(got.shape[-1], dtype=torch.bool)
    for u in units:
        g = u // t.units_per_group
        m_tt = (t.C[:, :, g] * t.B[:, :, g]).sum(-1) * t.dt[:, :, u]  # [b, T]
        y = (m_tt + t.D[u])[..., None] * t.x[:, :, u]  # [b, T, P]
        if h.kind == "ssm1":
            y = y[..., 0:1] * F.silu(t.gate[..., u:u + 1])
        sl = slice(u * P, (u + 1) * P)
        assert torch.allclose(got[..., sl], y, atol=1e-6, rtol=1e-5)
        assert not torch.allclose(ref[..., sl], y, atol=1e-3)  # the unmasked scan is not diagonal
        touched[sl] = True
    assert torch.equal(got[..., ~touched], ref[..., ~touched])


@pytest.mark.parametrize("family,head", [("llama", "L1H2"), ("bamba", "L1H3"), ("jamba", "L1H1")])
def test_zero_mask_equals_zeroing_the_heads_output_columns(models, family, head):
    """A zero pattern is the official ablation: the head's columns of o_proj set to zero."""
    model = models(family)
    h = model.check_head(head)
    spec = model.layer_spec(h.layer, "attn")
    batch = model.tokenize(PROMPTS)
    T = batch.ids.shape[1]
    with mask_pattern(model, {h: torch.zeros(T, T)}):
        masked = model.forward(batch)
    o_proj = unwrap(unwrap(model.bridge.get_submodule(spec.bridge_path)).o_proj)
    saved = o_proj.weight.detach().clone()
    try:
        with torch.no_grad():
            o_proj.weight[:, h.head * spec.head_dim:(h.head + 1) * spec.head_dim] = 0
        ablated = model.forward(batch)
    finally:
        with torch.no_grad():
            o_proj.weight.copy_(saved)
    keep = batch.attention_mask.bool()
    assert (masked - ablated)[keep].abs().max() <= 1e-5
    assert (masked - model.forward(batch))[keep].abs().max() > 1e-3


@pytest.mark.parametrize("family,head", [("llama", "L0H3"), ("jamba", "L1H2")])
def test_attention_mask_and_renormalisation(models, family, head):
    model = models(family)
    h = model.check_head(head)
    name = f"{model.layer_spec(h.layer, 'attn').bridge_path}.hook_pattern"
    batch = model.tokenize(PROMPTS)
    T = batch.ids.shape[1]
    mask = torch.ones(T, T).tril()
    mask[:, T // 2:] = 0  # only the first half of the keys
    mask[:, : T // 4] *= 0.5  # soft masks are fine too
    _, base = model.run_with_cache(batch, names_filter=name)
    p = base[name][:, h.head]
    for renormalize in (False, True):
        with mask_pattern(model, {h.name: mask}, renormalize=renormalize):
            _, cache = model.run_with_cache(batch, names_filter=name)
        got = cache[name]
        want = p * mask
        if renormalize:
            total = want.sum(-1, keepdim=True)
            want = torch.where(total > 0, want / total, want)
            real = got[:, h.head].sum(-1)[batch.attention_mask.bool()]
            nonzero = real > 0
            assert torch.allclose(real[nonzero], torch.ones_like(real[nonzero]), atol=1e-5)
        assert torch.allclose(got[:, h.head], want, atol=1e-6)
        others = [i for i in range(got.shape[1]) if i != h.head]
        assert torch.equal(got[:, others], base[name][:, others])


def test_hooks_are_removed_on_exit_and_on_exceptions(models):
    model = models("bamba")  # attention (pattern seam) + Mamba-2
    jamba = models("jamba")  # attention delegated to HF + Mamba-1
    for m, heads in ((model, HEADS["bamba"]), (jamba, HEADS["jamba"])):
        batch = m.tokenize(PROMPTS)
        T = batch.ids.shape[1]
        base = m.forward(batch)  # first: transformers installs its output-capturing hooks on a model's first forward
        before = hook_count(m)
        with mask_pattern(m, {h: torch.eye(T) for h in heads}) as same:
            assert same is m and hook_count(m) > before
        assert hook_count(m) == before
        with pytest.raises(RuntimeError, match="boom"):
            with mask_pattern(m, {h: torch.eye(T) for h in heads}):
                m.forward(batch)
                raise RuntimeError("boom")
        assert hook_count(m) == before
        # An error raised inside a hook (a mask of the wrong size) also leaves nothing behind.
        with pytest.raises(InputError, match=r"pass \[\d+, \d+\]"):
            with mask_pattern(m, {h: torch.eye(T + 1) for h in heads}):
                m.forward(batch)
        assert hook_count(m) == before
        assert torch.equal(m.forward(batch), base)


def test_bad_requests_fail_before_any_hook(models):
    model = models("jamba")
    before = hook_count(model)
    T = 5
    with pytest.raises(HeadError, match="overlaps"):
        with mask_pattern(model, {"L0C8+4": torch.eye(T), "L0C10": torch.eye(T)}):
            pass
    with pytest.raises(HeadError, match="twice"):
        with mask_pattern(model, {"L0C8": torch.eye(T), model.check_head("L0C8"): torch.eye(T)}):
            pass
    with pytest.raises(HeadError, match="out of range"):
        with mask_pattern(model, {"L1H9": torch.eye(T)}):
            pass
    assert hook_count(model) == before
