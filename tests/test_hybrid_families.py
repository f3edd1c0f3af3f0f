"""The hybrid families Zamba2, Nemotron-H and Falcon-H1, every mixer analysed.

Tiny random-initialised fp32 configs (``gna_interp.models.tiny_hybrid``). For each family: logits equal
the plain Hugging Face forward, every head is listed with its kind, and patterns, ablation and masking
of attention and SSM heads are checked against computations that do not go through gna_interp's hook
points: attention patterns brute-forced from q/k computed by hand from the Hugging Face module's
weights (inputs captured by torch hooks on an independently loaded plain HF model), ablation against
zeroing the head's channels before ``o_proj`` / ``out_proj`` by a torch hook on that plain model, SSM
patterns and masks against the scan output the HF mixer itself computes (captured by torch hooks).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import gna_interp as gna
from gna_interp import HeadRef, ablate, load_model, mask_pattern, patterns
from gna_interp.errors import HeadError, InputError
from gna_interp.models import Model
from gna_interp.models.loading import quiet_transformers
from gna_interp.models.hf import unwrap
from gna_interp.models.ssm import layer_terms
from gna_interp.models.tiny_hybrid import HYBRID_FAMILIES, build_tiny_hybrid
from conftest import liven

PROMPTS = ["Memorize the following dictionary:\nscallops:84\nriver:7\nThe value of the key 'river' is", "apple:3\n"]
FAMILIES = list(HYBRID_FAMILIES)


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_hybrid")
    dirs = {fam: build_tiny_hybrid(fam, root / fam) for fam in FAMILIES}
    dirs["falcon_h1_norm"] = build_tiny_hybrid("falcon_h1", root / "falcon_h1_norm", gated_norm=True)
    return dirs


@pytest.fixture(scope="module")
def hybrids(hybrid_dirs):
    """Loaded Models (shared: do not mutate)."""
    return {fam: load_model(d, device="cpu") for fam, d in hybrid_dirs.items()}


def sharpen(model, factor: float = 6.0) -> None:
    """Scale every attention query and key projection (each shared Parameter once) so patterns are far
    from uniform."""
    done = set()
    with torch.no_grad():
        for spec in model.layers:
            if spec.kind == "attn":
                attn = model.hf_module(spec.bridge_path)
                for w in (unwrap(attn.q_proj).weight, unwrap(attn.k_proj).weight):
                    if id(w) not in done:
                        done.add(id(w))
                        w.mul_(factor)


@pytest.fixture(scope="module")
def livened(hybrid_dirs):
    """``get(family)``: private copies with the SSM mixers re-drawn at unit scale (``M x`` matters) and
    sharpened attention (patterns far from uniform)."""
    cache = {}

    def get(fam):
        if fam not in cache:
            cache[fam] = load_model(hybrid_dirs[fam], device="cpu")
            liven(cache[fam])
            sharpen(cache[fam])
        return cache[fam]

    return get


def plain_hf(path):
    with quiet_transformers():
        return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def hf_layers(hf):
    return hf.model.layers


def attention_module(hf, fam, layer):
    """The plain HF attention module run at ``layer`` (for Zamba2: the shared block's copy at that depth)."""
    block = hf_layers(hf)[layer]
    return {"zamba2": lambda: block.shared_transformer.self_attn, "nemotron_h": lambda: block.mixer,
            "falcon_h1": lambda: block.self_attn}[fam]()


def ssm_module(hf, fam, layer):
    block = hf_layers(hf)[layer]
    if fam == "zamba2":
        return block.mamba_decoder.mamba if hasattr(block, "mamba_decoder") else block.mamba
    return block.mixer if fam == "nemotron_h" else block.mamba


def expected_heads(fam, cfg):
    """Head counts by kind and the attention layers, derived from the HF config alone."""
    if fam == "zamba2":
        attn_layers = [i for i, t in enumerate(cfg.layers_block_type) if t == "hybrid"]
        return ({"attn": len(attn_layers) * cfg.num_attention_heads, "ssm2": cfg.num_hidden_layers * cfg.n_mamba_heads},
                attn_layers)
    if fam == "nemotron_h":
        types = cfg.layers_block_type
        attn_layers = [i for i, t in enumerate(types) if t in ("attention", "full_attention")]
        n_mamba = sum(t in ("mamba", "linear_attention") for t in types)
        return {"attn": len(attn_layers) * cfg.num_attention_heads, "ssm2": n_mamba * cfg.mamba_num_heads}, attn_layers
    return ({"attn": cfg.num_hidden_layers * cfg.num_attention_heads, "ssm2": cfg.num_hidden_layers * cfg.mamba_n_heads},
            list(range(cfg.num_hidden_layers)))


# ---- loading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", FAMILIES + ["falcon_h1_norm"])
def test_logits_equal_plain_hugging_face(fam, hybrid_dirs, hybrids):
    model = hybrids[fam]
    hf = plain_hf(hybrid_dirs[fam])
    for batch in (model.tokenize(PROMPTS[0]), model.tokenize(PROMPTS)):
        with torch.no_grad():
            ref = hf(batch.ids, attention_mask=batch.attention_mask).logits
        got = model.forward(batch)
        keep = batch.attention_mask.bool()
        rel = ((got - ref)[keep].abs().max() / ref[keep].abs().max()).item()
        assert rel <= 1e-5, (fam, rel)


@pytest.mark.parametrize("fam", FAMILIES)
def test_every_head_listed_with_its_kind(fam, hybrids):
    model = hybrids[fam]
    cfg = model.hf_model.config
    counts, attn_layers = expected_heads(fam, cfg)
    got: dict[str, int] = {}
    for h in model.heads():
        got[h.kind] = got.get(h.kind, 0) + 1
    assert got == counts
    assert model.unsupported() == [], model.describe()
    assert "UNSUPPORTED" not in model.describe()
    assert sorted({h.layer for h in model.heads(kind="attn")}) == attn_layers
    names = [h.name for h in model.heads()]
    assert len(set(names)) == len(names) and all(model.check_head(n) == HeadRef.parse(n) for n in names)
    for spec in model.layers:  # every listed head can be reached for ablation, patterns and masking
        assert model.has_hook(spec.adapter.output_hook(spec)) and all(map(model.has_hook, spec.adapter.pattern_hooks(spec)))


def test_zamba2_shared_block_is_listed_at_each_depth(hybrids):
    model = hybrids["zamba2"]
    assert model.layer_kinds() == ["ssm2", "attn+ssm2", "attn+ssm2", "ssm2", "attn+ssm2", "attn+ssm2"]
    shared = {s.layer: s.shared_by for s in model.layers if s.kind == "attn"}
    assert shared == {1: (1, 4), 4: (1, 4), 2: (2, 5), 5: (2, 5)}
    assert all(s.shared_by == () for s in model.layers if s.kind == "ssm2")
    assert {s.bridge_path for s in model.layers if s.kind == "attn"} == {f"blocks.{i}.shared_attn" for i in (1, 2, 4, 5)}
    # the same weights (one Parameter), distinct modules per depth
    a1, a4 = (model.hf_module(f"blocks.{i}.shared_attn") for i in (1, 4))
    assert a1 is not a4 and a1.q_proj.weight is a4.q_proj.weight
    text = model.describe()
    assert "shared block" in text and "layers 1, 4" in text and "listed at each depth" in text
    # one head of the shared block, at two depths: different patterns (different inputs and LoRA slots)
    ps = patterns(model, PROMPTS[0], heads=["L1H2", "L4H2"])
    assert not torch.allclose(ps["L1H2"], ps["L4H2"], atol=1e-3)


def test_nemotron_h_mlp_layer_is_no_token_mixer(hybrids):
    model = hybrids["nemotron_h"]
    assert model.layer_kinds() == ["ssm2", "attn", "no mixer", "ssm2", "attn"]
    with pytest.raises(HeadError, match="layer 2 .* has no 'attn' mixer"):
        model.check_head("L2H0")
    with pytest.raises(HeadError, match="out of range"):
        model.check_head("L1H4")


def test_a_second_model_on_the_same_bridge_reaches_nothing_twice(hybrids):
    model = hybrids["zamba2"]
    before = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.bridge.modules())
    again = Model(model.bridge, model.tokenizer)
    after = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.bridge.modules())
    assert before == after and again.layers == model.layers


def test_unknown_tiny_family_is_refused(tmp_path):
    with pytest.raises(InputError, match="unknown tiny hybrid family 'zamba'"):
        build_tiny_hybrid("zamba", tmp_path / "x")


# ---- attention patterns, brute force ----------------------------------------------------------------


def _capture_inputs(module):
    """Forward pre-hook recording the module's hidden_states (and position embeddings) on each call."""
    seen = {}

    def pre(mod, args, kwargs):
        seen["h"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        seen["pe"] = kwargs.get("position_embeddings")

    return seen, module.register_forward_pre_hook(pre, with_kwargs=True)


def _rope(x, theta, positions):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = positions[:, None].double() * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


def brute_force_pattern(fam, attn, layer, h):
    """Softmax attention [heads, q, k] from q/k computed by hand from the HF module's weights; ``h`` its input [T, d]."""
    cfg = attn.config
    h = h.double()
    q = h @ attn.q_proj.weight.double().T
    k = h @ attn.k_proj.weight.double().T
    if fam == "zamba2" and cfg.use_shared_attention_adapter:  # the LoRA slot of this depth
        slot = attn.layer_dic[layer]
        for proj, adapters in (("q", attn.linear_q_adapter_list), ("k", attn.linear_k_adapter_list)):
            down, up = adapters[slot][0].weight.double(), adapters[slot][1].weight.double()
            delta = h @ down.T @ up.T
            q, k = (q + delta, k) if proj == "q" else (q, k + delta)
    n_q, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = q.shape[-1] // n_q
    T = h.shape[0]
    q = q.view(T, n_q, d).transpose(0, 1)
    k = k.view(T, n_kv, d).transpose(0, 1)
    if fam == "falcon_h1":
        k = k * cfg.key_multiplier
    rotary = fam == "falcon_h1" or (fam == "zamba2" and cfg.use_mem_rope)
    if rotary:
        pos = torch.arange(T)
        theta = cfg.rope_parameters["rope_theta"]
        q, k = _rope(q, theta, pos), _rope(k, theta, pos)
    k = k.repeat_interleave(n_q // n_kv, dim=0)
    scale = (d / 2) ** -0.5 if fam == "zamba2" else d ** -0.5
    scores = q @ k.transpose(-1, -2) * scale
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return scores.softmax(-1).float()


@pytest.mark.parametrize("fam", FAMILIES)
def test_attention_patterns_equal_brute_force_from_weights(fam, hybrid_dirs):
    """gna_interp's patterns of every attention head against softmax(q k^T) computed by hand (q/k projections,
    Zamba2's LoRA slot of the depth, Falcon-H1's key multiplier, RoPE, scale) from the weights of an
    independently loaded plain HF model, whose attention inputs are captured by plain torch hooks. Both
    models get the same sharpened q/k projections so that the patterns are far from uniform."""
    model = load_model(hybrid_dirs[fam], device="cpu")
    hf = plain_hf(hybrid_dirs[fam])
    sharpen(model)
    _, attn_layers = expected_heads(fam, hf.config)
    with torch.no_grad():
        for w in {id(p): p for layer in attn_layers for p in (attention_module(hf, fam, layer).q_proj.weight,
                                                            attention_module(hf, fam, layer).k_proj.weight)}.values():
            w.mul_(6.0)
    batch = model.tokenize(PROMPTS[0])
    captured, handles = {}, []
    for layer in attn_layers:
        seen, handle = _capture_inputs(attention_module(hf, fam, layer))
        captured[layer] = seen
        handles.append(handle)
    try:
        with torch.no_grad():
            ref_logits = hf(batch.ids).logits
    finally:
        for handle in handles:
            handle.remove()
    assert ((model.forward(batch) - ref_logits).abs().max() / ref_logits.abs().max()) <= 1e-5  # same sharpened model
    ps = patterns(model, batch, heads=model.heads(kind="attn"))
    T = batch.ids.shape[1]
    uniform = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]
    for layer in attn_layers:
        ref = brute_force_pattern(fam, attention_module(hf, fam, layer), layer, captured[layer]["h"][0])
        got = torch.stack([ps.sample(0, [f"L{layer}H{i}"])[0] for i in range(ref.shape[0])])
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
        assert (ref - uniform).abs().max() > 0.2  # far from uniform: the comparison means something


@pytest.mark.parametrize("fam", ["zamba2", "nemotron_h"])
def test_reached_attention_patterns_under_left_padding_equal_unpadded(fam, hybrids):
    model = hybrids[fam]
    heads = model.heads(kind="attn")
    padded = patterns(model, PROMPTS, heads=heads)
    assert padded.batch.padded
    alone = patterns(model, PROMPTS[1], heads=heads)
    torch.testing.assert_close(padded.sample(1), alone.sample(0), atol=1e-5, rtol=1e-4)
    pat = padded.stack()
    torch.testing.assert_close(pat[0].sum(-1), torch.ones(pat.shape[1:-1]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("fam", ["zamba2", "nemotron_h"])
def test_reached_hook_points_fire_with_the_documented_shapes(fam, hybrids):
    model = hybrids[fam]
    spec = model.layers[[s.kind for s in model.layers].index("attn")]
    names = [f"{spec.bridge_path}.hook_pattern", f"{spec.bridge_path}.o.hook_in", f"{spec.bridge_path}.o.hook_out",
             f"{spec.bridge_path}.hook_in"]
    batch = model.tokenize(PROMPTS)
    _, cache = model.run_with_cache(batch, names_filter=names)
    b, T = batch.ids.shape
    d_model = model.hf_model.config.hidden_size
    assert cache[names[0]].shape == (b, spec.n_heads, T, T)
    assert cache[names[1]].shape == (b, T, spec.n_heads * spec.head_dim)
    assert cache[names[2]].shape == (b, T, d_model)


# ---- ablation: zeroing the head's channels before the output projection on the plain HF model --------


def _zero_channels(module, start, stop):
    def pre(mod, args):
        x = args[0].clone()
        x[..., start:stop] = 0
        return (x,) + args[1:]

    return module.register_forward_pre_hook(pre)


ABLATE = {"zamba2": [["L4H1"], ["L1H1"], ["L5S2"], ["L4H1", "L1S3", "L2H0"]],
          "nemotron_h": [["L1H3"], ["L3S1"], ["L4H0", "L0S2"]],
          "falcon_h1": [["L1H2"], ["L0S1"], ["L0H0", "L0S0", "L1S3"]]}


@pytest.mark.parametrize("fam,heads", [(f, h) for f, hs in ABLATE.items() for h in hs])
def test_ablation_equals_zeroing_channels_on_plain_hf(fam, heads, hybrid_dirs, hybrids):
    model = hybrids[fam]
    hf = plain_hf(hybrid_dirs[fam])
    batch = model.tokenize(PROMPTS)
    handles = []
    for name in heads:
        h = HeadRef.parse(name)
        spec = model.layer_spec(h.layer, h.kind)
        module = attention_module(hf, fam, h.layer).o_proj if h.kind == "attn" else ssm_module(hf, fam, h.layer).out_proj
        handles.append(_zero_channels(module, h.head * spec.head_dim, (h.head + 1) * spec.head_dim))
    try:
        with torch.no_grad():
            ref = hf(batch.ids, attention_mask=batch.attention_mask).logits
    finally:
        for handle in handles:
            handle.remove()
    with ablate(model, heads):
        got = model.forward(batch)
    keep = batch.attention_mask.bool()
    clean = model.forward(batch)
    assert (clean - ref)[keep].abs().max() > 1e-5  # the ablation does something
    assert ((got - ref)[keep].abs().max() / ref[keep].abs().max()).item() <= 1e-5


def test_zamba2_ablation_is_per_depth(hybrids):
    """Ablating a shared-block head at one depth leaves the other depth's output channels alone."""
    model = hybrids["zamba2"]
    batch = model.tokenize(PROMPTS[0])
    names = ["blocks.1.shared_attn.o.hook_in", "blocks.4.shared_attn.o.hook_in"]
    _, clean = model.run_with_cache(batch, names_filter=names)
    with ablate(model, "L4H1"):
        _, abl = model.run_with_cache(batch, names_filter=names)
    d = model.layer_spec(4, "attn").head_dim
    torch.testing.assert_close(abl[names[0]], clean[names[0]], atol=0, rtol=0)
    assert abl[names[1]][..., d:2 * d].abs().max() == 0 and clean[names[1]][..., d:2 * d].abs().max() > 0


def test_scans_run_on_reached_heads(hybrids):
    """Exact (replayed) and naive scans agree on heads reached by gna_interp (Zamba2 shared attention and
    hybrid-layer Mamba-2 heads, Nemotron-H attention)."""
    task = gna.KVRetrieval(n_pairs=3, n_samples=2, seed=0)
    for fam, heads in (("zamba2", ["L1H0", "L4H2", "L2S1"]), ("nemotron_h", ["L1H1", "L4H3"])):
        model = hybrids[fam]
        exact = gna.scan_heads(model, task, heads=heads, strategy="exact", progress=False)
        naive = gna.scan_heads(model, task, heads=heads, strategy="naive", progress=False)
        for h in heads:
            assert exact.ablated(h) == pytest.approx(naive.ablated(h), abs=1e-5)


# ---- SSM heads: implicit attention against the HF mixer's own scan ------------------------------------


def _scan_capture(oc):
    """Torch hook on the HF mixer capturing its scan output: the gated norm's input, or (no gated norm,
    Falcon-H1's default) ``out_proj``'s input = y * silu(z). Returns (store, handle, gated)."""
    store = {}
    norm = getattr(oc, "norm", None)
    gated = not (isinstance(norm, torch.nn.Module) and not isinstance(norm, torch.nn.Identity)
                 and getattr(oc, "mamba_rms_norm", True) is not False)
    target = unwrap(oc.out_proj if gated else norm)  # the HF module itself, after any bridge hook edits

    def pre(mod, args):
        store["y"] = args[0].detach().clone()

    return store, target.register_forward_pre_hook(pre), gated


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("fam", FAMILIES + ["falcon_h1_norm"])
def test_ssm_implicit_attention_reproduces_the_hf_scan(fam, livened):
    model = livened(fam)
    batch = model.tokenize(PROMPTS)
    keep = batch.attention_mask.bool()
    specs = [s for s in model.layers if s.kind == "ssm2"]
    stores = []
    for spec in specs:
        stores.append(_scan_capture(model.hf_module(spec.bridge_path)))
    try:
        _, cache = model.run_with_cache(batch, names_filter=[f"{s.bridge_path}.hook_in" for s in specs])
    finally:
        for _, handle, _ in stores:
            handle.remove()
    ps = patterns(model, batch, heads=model.heads(kind="ssm2"))
    for spec, (store, _, gated) in zip(specs, stores):
        terms = layer_terms(model, spec, cache[f"{spec.bridge_path}.hook_in"], batch.attention_mask)
        M = torch.stack([ps[f"L{spec.layer}S{i}"] for i in range(spec.n_heads)], 1)  # [b, H, T, T]
        mx = torch.einsum("bnqk,bknp->bqnp", M, terms.x)
        dx = terms.x * terms.D[None, None, :, None]
        assert mx[keep].norm() > 0.2 * dx[keep].norm(), "M x must carry real weight"
        y = (mx + dx).flatten(2)
        if gated:
            y = y * torch.nn.functional.silu(terms.gate)
        assert _rel(y[keep], store["y"][keep]) <= 1e-4, (fam, spec.layer)


MASKED = {"zamba2": ["L1H3", "L4S2"], "nemotron_h": ["L4H1", "L3S0"], "falcon_h1": ["L1H1", "L1S2"],
          "falcon_h1_norm": ["L0H3", "L0S1"]}


@pytest.mark.parametrize("fam", sorted(MASKED))
def test_masking_both_kinds(fam, livened):
    """SSM: the masked head's scan output is (M ⊙ mask) x + D x (HF mixer's own scan captured), the other
    heads untouched. Attention: a zero mask equals ablation, a causal all-ones mask changes nothing,
    and masking + ablating the same head is ablation."""
    model = livened(fam)
    batch = model.tokenize(PROMPTS[0])
    T = batch.ids.shape[1]
    attn, ssm = (HeadRef.parse(n) for n in MASKED[fam])
    clean = model.forward(batch)

    with mask_pattern(model, {attn: torch.ones(T, T).tril()}):
        torch.testing.assert_close(model.forward(batch), clean, atol=1e-6, rtol=1e-5)
    with ablate(model, attn):
        ablated = model.forward(batch)
    with mask_pattern(model, {attn: torch.zeros(T, T)}):
        zeroed = model.forward(batch)
    torch.testing.assert_close(zeroed, ablated, atol=1e-6, rtol=1e-5)
    assert (ablated - clean).abs().max() > 1e-5
    g = torch.Generator().manual_seed(0)
    random_mask = (torch.rand(T, T, generator=g) > 0.5).float().tril()
    with mask_pattern(model, {attn: random_mask}), ablate(model, attn):
        torch.testing.assert_close(model.forward(batch), ablated, atol=1e-6, rtol=1e-5)

    spec = model.layer_spec(ssm.layer, "ssm2")
    oc = model.hf_module(spec.bridge_path)
    name = f"{spec.bridge_path}.hook_in"
    store, handle, gated = _scan_capture(oc)
    try:
        _, cache = model.run_with_cache(batch, names_filter=[name])
        clean_y = store["y"]
        with mask_pattern(model, {ssm: random_mask}):
            masked_logits = model.forward(batch)
        masked_y = store["y"]
    finally:
        handle.remove()
    terms = layer_terms(model, spec, cache[name])
    M = patterns(model, batch, heads=[ssm])[ssm][0]
    P = spec.head_dim
    x = terms.x[0, :, ssm.head]
    want = (M * random_mask) @ x + terms.D[ssm.head] * x
    if gated:
        want = want * torch.nn.functional.silu(terms.gate[0, :, ssm.head * P:(ssm.head + 1) * P])
    cols = slice(ssm.head * P, (ssm.head + 1) * P)
    assert _rel(masked_y[0, :, cols], want) <= 1e-4
    others = torch.ones(masked_y.shape[-1], dtype=torch.bool)
    others[cols] = False
    torch.testing.assert_close(masked_y[..., others], clean_y[..., others], atol=1e-5, rtol=1e-4)
    assert (masked_logits - clean).abs().max() > 1e-5  # masking really reaches the model


def test_bad_masks_on_reached_heads_fail_clearly(hybrids):
    model = hybrids["zamba2"]
    with pytest.raises(InputError, match="mask for L1H0 has shape"):
        with mask_pattern(model, {"L1H0": torch.ones(3, 3)}):
            model.forward("hello there")
    with pytest.raises(InputError, match="NaN or infinite"):
        with mask_pattern(model, {"L4H0": torch.full((11, 11), math.nan)}):
            model.forward("hello there")


def test_a_pattern_hook_returning_a_wrong_shape_fails_clearly(hybrids):
    model = hybrids["zamba2"]
    with pytest.raises(gna.GnaError, match=r"a hook on blocks\.1\.shared_attn\.hook_pattern returned Tensor"):
        model.run_with_hooks("hello there", [("blocks.1.shared_attn.hook_pattern", lambda p, hook: p[:, :2])])
    assert model.forward("hello there").shape[-1] == model.hf_model.config.vocab_size  # nothing left behind


def test_mixers_that_cannot_be_reached_are_reported_not_dropped(hybrid_dirs, monkeypatch):
    """Without reaching (e.g. a bridge that keeps no hook registry), Zamba2's shared attention and its
    hybrid layers' Mamba-2 mixers are reported unsupported, never silently left out."""
    monkeypatch.setattr("gna_interp.models.arch.reach_mixers", lambda bridge, adapters: None)
    model = load_model(hybrid_dirs["zamba2"], device="cpu")
    unsupported = {(s.layer, s.hf_class) for s in model.unsupported()}
    hybrid = (1, 2, 4, 5)
    assert unsupported == {(i, c) for i in hybrid for c in ("Zamba2Attention", "Zamba2MambaMixer")}
    assert "UNSUPPORTED mixer at blocks.1:shared_transformer.self_attn" in model.describe()
