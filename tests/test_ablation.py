"""`ablate`: zero ablation equals the official weight edit; mean/resample; hooks always removed."""

from __future__ import annotations

import pytest
import torch

from gna_interp import HeadRef, load_model
from gna_interp.errors import HeadError, InputError
from gna_interp.interventions import ablate
from gna_interp.interventions.ablation import replacements

PROMPTS = ["Memorize the following dictionary:\nfig:12\nowl:7\nThe value of the key 'owl' is",
           "Memorize the following dictionary:\nsun:3\nThe value of"]


def _hook_count(model) -> int:
    """Torch forward hooks registered on the bridge's (distinct) hook points."""
    points = {id(hp): hp for hp in model.bridge.hook_dict.values()}.values()
    return sum(len(hp._forward_hooks) + len(hp._forward_pre_hooks) for hp in points)


def _out_proj(model, layer: int, kind: str) -> torch.nn.Linear:
    hf = model.bridge.get_submodule(model.layer_spec(layer, kind).bridge_path).original_component
    return hf.o_proj if kind == "attn" else hf.out_proj


@pytest.mark.parametrize("family,heads", [
    ("llama", ["L1H2"]),                 # attention query head (GQA: 4 query heads, 2 KV heads)
    ("llama", ["L0H0", "L0H3", "L2H1"]),  # several heads, several layers
    ("mamba2", ["L1S2"]),                # Mamba-2 head: a head_dim slice of out_proj
    ("mamba", ["L0C5"]),                 # Mamba-1 channel: one column
    ("mamba", ["L1C8+4"]),               # Mamba-1 channel group
    ("bamba", ["L0S1", "L1H3"]),         # hybrid: SSM head and attention head together
    ("jamba", ["L2C7", "L1H0"]),
])
def test_zero_ablation_equals_zeroing_output_projection_columns(tiny_dirs, tiny_models, family, heads):
    model = tiny_models[family]
    clean = model.forward(PROMPTS)
    with ablate(model, heads) as parsed:
        ablated = model.forward(PROMPTS)
    assert [h.name for h in parsed] == heads
    # The official procedure, on a separate copy of the weights: zero the heads' columns of o_proj / out_proj.
    edited = load_model(tiny_dirs[family], device="cpu")
    for h in model.check_heads(heads):
        site = model.head_site(h)
        with torch.no_grad():
            _out_proj(edited, h.layer, h.kind).weight[:, site.columns] = 0
    reference = edited.forward(PROMPTS)
    assert (ablated - clean).abs().max() > 1e-4, "the ablation changed nothing"
    torch.testing.assert_close(ablated, reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.forward(PROMPTS), clean)  # restored


def test_head_sites_cover_each_kind(tiny_models):
    m = tiny_models["bamba"]
    spec = m.layer_spec(0, "ssm2")
    s = m.head_site("L0S2")
    assert (s.hook, s.start, s.stop, s.width) == ("blocks.0.mixer.out_proj.hook_in", 2 * spec.head_dim,
                                                  3 * spec.head_dim, spec.n_heads * spec.head_dim)
    a = m.head_site(HeadRef(1, 3))
    assert a.hook == "blocks.1.attn.o.hook_in" and (a.start, a.stop) == (48, 64)
    j = tiny_models["jamba"].head_site("L0C10+6")
    assert (j.start, j.stop) == (10, 16)


def test_mean_ablation_writes_the_reference_mean(tiny_models):
    model = tiny_models["llama"]
    reference = ["owl:1\nfig:2\n", "a short one", "Memorize the following dictionary:\nx:9\n"]
    site = model.head_site("L1H1")
    ref_batch = model.tokenize(reference)
    _, cache = model.run_with_cache(ref_batch, names_filter=site.hook)
    flat = cache[site.hook].flatten(2)[..., site.columns]
    expected = flat[ref_batch.attention_mask.bool()].mean(0)
    seen = {}

    def spy(x, hook):
        seen["x"] = x.detach().clone()

    with ablate(model, "L1H1", "mean", reference=reference):
        with model.bridge.hooks(fwd_hooks=[(site.hook, spy)]):
            model.forward(PROMPTS)
    got = seen["x"].flatten(2)[..., site.columns]
    torch.testing.assert_close(got, expected.expand_as(got))
    # other heads of the layer are untouched
    clean = model.run_with_cache(PROMPTS, names_filter=site.hook)[1][site.hook].flatten(2)
    torch.testing.assert_close(seen["x"].flatten(2)[..., site.stop:], clean[..., site.stop:])


@pytest.mark.parametrize("family", ["llama", "bamba"])
def test_mean_activations_read_every_sender_in_one_forward(tiny_models, family):
    """The means equal the cached activations averaged over the real tokens by hand, for every sender's output (each
    head's site, each MLP's output, the embeddings), all read by the first call's one forward: a later call for any
    of them runs none."""
    model = tiny_models[family]
    reference = ["owl:1\nfig:2\n", "a short one", "Memorize the following dictionary:\nx:9\n"]
    model.facts.pop("model.mean_activations", None)
    first = model.head_site(model.heads()[0]).hook
    model.mean_activations(reference, [first])
    senders = sorted(model._sender_hooks())
    assert model.block_input_hook(0) in senders and any(".mlp." in h for h in senders)
    forwards = []
    handle = model.blocks()[0].register_forward_hook(lambda *_: forwards.append(1))
    try:
        got = model.mean_activations(reference, senders)
    finally:
        handle.remove()
    assert not forwards
    batch = model.tokenize(reference)
    _, cache = model.run_with_cache(batch, names_filter=lambda n: n in senders)
    real = batch.attention_mask.bool()
    for h in senders:
        x = cache[h].flatten(2) if cache[h].dim() == 4 else cache[h]
        torch.testing.assert_close(got[h], x[real].float().mean(0), rtol=1e-5, atol=1e-6)


def test_resample_from_the_same_batch_is_a_no_op_and_from_another_is_not(tiny_models):
    model = tiny_models["mamba2"]
    real = model.tokenize(PROMPTS).attention_mask.bool()  # padding positions get the mean: compare real ones
    clean = model.forward(PROMPTS)
    with ablate(model, ["L0S0", "L1S3"], "resample", reference=PROMPTS):
        same = model.forward(PROMPTS)
    torch.testing.assert_close(same[real], clean[real], atol=1e-5, rtol=1e-5)
    with ablate(model, ["L0S0", "L1S3"], "resample", reference=list(reversed(PROMPTS))):
        other = model.forward(PROMPTS)
    assert (other - clean).abs().max() > 1e-4


def test_resample_positions_align_right_and_fill_with_the_mean(tiny_models):
    model = tiny_models["llama"]
    (r,) = replacements(model, ["L0H1"], "resample", reference=["ab"])  # a 1-2 token reference row
    val = r.value(batch=3, pos=6)
    n_ref = r.rows.shape[1]
    assert val.shape == (3, 6, r.site.stop - r.site.start)
    torch.testing.assert_close(val[:, -n_ref:], r.rows[0].expand(3, -1, -1))
    torch.testing.assert_close(val[:, : 6 - n_ref], r.mean.expand(3, 6 - n_ref, -1))


def test_hooks_are_removed_on_exit_and_on_exceptions(tiny_models):
    model = tiny_models["bamba"]
    before = _hook_count(model)
    clean = model.forward(PROMPTS)
    with ablate(model, ["L0S1", "L1H0", "L1H2"]):
        assert _hook_count(model) == before + 2  # one hook per hook point
    assert _hook_count(model) == before
    with pytest.raises(RuntimeError, match="boom"):
        with ablate(model, ["L1H0"], "mean", reference=PROMPTS):
            model.forward(PROMPTS)
            raise RuntimeError("boom")
    assert _hook_count(model) == before
    torch.testing.assert_close(model.forward(PROMPTS), clean)


def test_bad_input_is_refused_clearly(tiny_models):
    model = tiny_models["llama"]
    before = _hook_count(model)
    with pytest.raises(InputError, match="unknown ablation method"):
        with ablate(model, "L0H0", "shuffle"):
            pass
    with pytest.raises(InputError, match="takes no reference"):
        with ablate(model, "L0H0", "zero", reference=PROMPTS):
            pass
    with pytest.raises(InputError, match="needs a reference"):
        with ablate(model, "L0H0", "mean"):
            pass
    with pytest.raises(HeadError, match="out of range"):
        with ablate(model, "L0H4"):
            pass
    with pytest.raises(HeadError, match="no 'ssm2' mixer"):
        with ablate(model, "L0S0"):
            pass
    with pytest.raises(HeadError, match="malformed"):
        with ablate(model, "layer0head1"):
            pass
    assert _hook_count(model) == before


def test_comma_separated_names_and_empty_lists(tiny_models):
    model = tiny_models["llama"]
    clean = model.forward(PROMPTS)
    with ablate(model, "L0H0,L2H1") as hs:
        assert [h.name for h in hs] == ["L0H0", "L2H1"]
    with ablate(model, []) as hs:
        assert hs == []
        torch.testing.assert_close(model.forward(PROMPTS), clean)


def test_an_ablation_is_a_value_entered_again_after_its_block_but_not_inside_it(tiny_models):
    model = tiny_models["llama"]
    clean = model.forward(PROMPTS[0])
    cut = ablate(model, ["L1H2"])
    with cut as heads:
        first = model.forward(PROMPTS[0])
        with pytest.raises(InputError, match="already active"):
            with cut:
                pass
        assert torch.equal(model.forward(PROMPTS[0]), first)  # the refused re-entry added no second hook
    assert heads == [HeadRef.parse("L1H2")] and torch.equal(model.forward(PROMPTS[0]), clean)
    with cut:
        assert torch.equal(model.forward(PROMPTS[0]), first)
    assert _hook_count(model) == 0 and "inactive" in repr(cut)
    with pytest.raises(HeadError):  # validated when made, not when entered
        ablate(model, ["L9H0"])
