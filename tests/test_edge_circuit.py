"""Edge circuits (:mod:`gna_interp.circuits.edges.edge_circuit`) against independent computations: a by-hand forward of
the plain Hugging Face model (Llama; Gemma-2/3, OLMo-2 and Granite, whose blocks normalise or scale what they add) in
which every receiver input reads its own stream built from the senders' outputs, the node form (every head outside a
set ablated, :class:`SetAblation`), every node ablated and the intact model."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from test_paths import POST, _hf_layer, _hf_run, _masks, _residual_in

from gna_interp.circuits.edges.edge_circuit import EdgeCircuit
from gna_interp.models.graph import Edge
from gna_interp.models.graph import CLASSES
from gna_interp.engine.replay import SetAblation
from gna_interp.errors import HeadError, InputError
from gna_interp.tasks import KVRetrieval
from gna_interp.engine.metrics import get_metric, results
from gna_interp.engine.unembed import read_logprobs
from gna_interp.models.hf import unwrap


def _task():
    return KVRetrieval(3, 3, seed=1, max_value=9)


@pytest.fixture(scope="module")
def circuits(models):
    cache = {}

    def get(family, batch_size=8):
        if (family, batch_size) not in cache:
            cache[(family, batch_size)] = EdgeCircuit(models(family), _task(), "mean", batch_size=batch_size,
                                                      senders="all")
        return cache[(family, batch_size)]
    return get


def _ld(scores):
    return get_metric("logit_diff").value(results(scores))


@pytest.mark.parametrize("family", ["llama", "mamba2", "bamba"])
def test_every_edge_kept_is_the_intact_model_and_a_node_set_is_the_node_ablation(circuits, models, family):
    ec = circuits(family)
    model = models(family)
    every = ec.wires()
    heads = model.heads()
    inside = {h.name for h in heads[::2]}
    nodes = [w for w in every if w.sender in inside or not w.sender.startswith("L")]
    full, node = ec.run([every, nodes])
    assert _ld(full) == pytest.approx(_ld(ec.clean()), abs=1e-5)
    want = SetAblation(model, _task(), "mean", _task(), 8).run([h for h in heads if h.name not in inside])
    assert _ld(node) == pytest.approx(_ld(want), abs=1e-5)
    assert torch.allclose(results(node)["logit_diff"], results(want)["logit_diff"], atol=1e-4)


# Per family, from the plain Hugging Face decoder layer: what its attention and its MLP read the stream through, and
# what the block adds of their outputs (the attention's map: test_paths.POST).
def _identity(layer, v):
    return v


READS = {
    "gemma2": (lambda layer, v: layer.input_layernorm(v), lambda layer, v: layer.pre_feedforward_layernorm(v)),
    "llama": (lambda layer, v: layer.input_layernorm(v), lambda layer, v: layer.post_attention_layernorm(v)),
    "gemma3": (lambda layer, v: layer.input_layernorm(v), lambda layer, v: layer.pre_feedforward_layernorm(v)),
    "olmo2": (_identity, _identity),  # post-norms only: attention and MLP read the stream itself
    "granite": (lambda layer, v: layer.input_layernorm(v), lambda layer, v: layer.post_attention_layernorm(v)),
}
MLP_POST = {
    "gemma2": lambda layer, v: layer.post_feedforward_layernorm(v),
    "llama": _identity,
    "gemma3": lambda layer, v: layer.post_feedforward_layernorm(v),
    "olmo2": lambda layer, v: layer.post_feedforward_layernorm(v),
    "granite": lambda layer, v: v * layer.residual_multiplier,
}
ATTN_POST = {**POST, "gemma2": POST["gemma3"]}
NORM_FAMILIES = ("gemma2", "gemma3", "olmo2", "granite")


@pytest.fixture(scope="module")
def family(models, tmp_path_factory):
    """``get(key)``: the livened tiny Llama of conftest, or the family matrix's tiny Gemma-2/3, OLMo-2, Granite."""
    from family_matrix import FAMILIES

    from gna_interp import load_model

    root, by_key, cache = tmp_path_factory.mktemp("edge_norms"), {f.key: f for f in FAMILIES}, {}

    def get(key):
        if key == "llama":
            return models("llama")
        if key not in cache:
            cache[key] = load_model(by_key[key].build(root / key), device="cpu")
        return cache[key]
    return get


def _means(model, task):
    """Mean first block input, per-layer mean head channels (the output projection's input) and mean MLP output
    (before any norm after it) over the task prompts' real tokens, from plain HF forwards."""
    batch = model.as_batch(list(task.prompts))
    _, first = _hf_layer(model, 0)
    got, handles = {}, []
    handles.append(first.register_forward_pre_hook(
        lambda m, a, kw: got.__setitem__("embed", a[0] if a else kw["hidden_states"]), with_kwargs=True))
    for layer in range(model.n_layers):
        _, mod = _hf_layer(model, layer)
        handles.append(mod.self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, layer=layer: got.__setitem__(("z", layer), a[0])))
        handles.append(mod.mlp.register_forward_hook(lambda m, a, o, layer=layer: got.__setitem__(("mlp", layer), o)))
    try:
        with torch.no_grad():
            model.hf_model(batch.ids, **model._forward_kwargs(batch))
    finally:
        for h in handles:
            h.remove()
    real = batch.attention_mask.bool()
    return {k: v[real].mean(0) for k, v in got.items()}


def _head_by_hand(model, layer, head, streams, ids, kwargs, reads):
    """``head``'s channels at its output projection's input, from a plain HF forward in which its layer's q / k / v
    projections read ``streams['q' | 'k' | 'v']`` through the layer's own input norm (the HF attention does the
    rest: q/k norms, rotary, scaling, windows)."""
    attn = layer.self_attn
    swap = [(unwrap(getattr(attn, f"{n}_proj")),
             lambda m, a, o, n=n: F.linear(reads(layer, streams[n]), m.weight, m.bias)) for n in ("q", "k", "v")]
    got = {}
    grab = (unwrap(attn.o_proj), lambda m, a: got.__setitem__("z", a[0][..., model.head_site(head).columns].clone()))
    _hf_run(model, ids, kwargs, pre=[grab], post=swap)
    return got["z"]


def _brute(model, key, ec, index, kept):
    """Read log-probs of batch ``index`` (one unpadded row) with only ``kept`` carrying activations, by hand through
    the plain HF modules: every receiver input reads its own stream, to which the embeddings, each layer's attention
    and each MLP add ``post(Σ_{S in part} (w_S if S -> receiver is kept at the position's class else w̄_S))`` --
    the attention's post map of the sum over its heads (ATTN_POST), the MLP's of its output (MLP_POST)."""
    chunk = ec.pp.chunks[index]
    ids, kwargs = chunk.batch.ids, model._forward_kwargs(chunk.batch)
    m = _masks(ec.pp, chunk)
    cls = {"items": m["items"], "decision": m["decision"] & ~m["items"], "other": m["other"], "all": m["all"]}
    bar = _ablated(model, ec.method)
    keep: dict[str, dict[str, set[str]]] = {}
    for w in kept:
        keep.setdefault(w.reads, {}).setdefault(w.sender, set()).add(w.positions)
    write, parts = {}, []  # parts: (senders, post map), in the order they write

    def stream(receiver):
        total = torch.zeros(())
        for senders, post in parts:
            mixed = torch.zeros(())
            for s in senders:
                mask = sum((cls[c].float() for c in keep.get(receiver, {}).get(s, ())), torch.zeros(ids.shape[1]))
                mixed = mixed + bar[s] + mask[None, :, None] * (write[s] - bar[s])
            total = total + post(mixed)
        return total

    def input_name(head, inp):
        return next(r for r in ec.receivers() if r.endswith(f".{inp}") and head.name in r.split(".")[0].split("+"))

    with torch.no_grad():
        write["embed"] = _residual_in(model, ids, kwargs, 0)
        parts.append((["embed"], lambda v: v))
        for layer in range(model.n_layers):
            _, mod = _hf_layer(model, layer)
            o = unwrap(mod.self_attn.o_proj).weight
            heads = [h for h in model.heads() if h.layer == layer]
            new = {}
            for h in heads:
                streams = {i: stream(input_name(h, i)) for i in ("q", "k", "v")}
                z = _head_by_hand(model, mod, h, streams, ids, kwargs, READS[key][0])
                new[h.name] = z @ o[:, model.head_site(h).columns].T
            write.update(new)  # the layer's heads write once all of them have read
            parts.append(([h.name for h in heads], lambda v, mod=mod: ATTN_POST[key](mod, v)))
            name = f"MLP{layer}"
            write[name] = mod.mlp(READS[key][1](mod, stream(name)))
            parts.append(([name], lambda v, mod=mod: MLP_POST[key](mod, v)))
        return _logprobs_from(model, chunk, stream("logits"))


def _ablated(model, method):
    """``w̄_S`` of every sender: the mean (``mean``, :func:`_means`) or zero first block input, head write (its mean
    channels through its columns of the output projection) and MLP output (before any norm after it)."""
    means = _means(model, _task())
    scale = 0.0 if method == "zero" else 1.0
    out = {"embed": scale * means["embed"]}
    for h in model.heads():
        o = unwrap(_hf_layer(model, h.layer)[1].self_attn.o_proj).weight
        cols = model.head_site(h).columns
        out[h.name] = scale * means[("z", h.layer)][cols] @ o[:, cols].T
    out.update({f"MLP{layer}": scale * means[("mlp", layer)] for layer in range(model.n_layers)})
    return out


def _logprobs_from(model, chunk, final=None, pre=(), post=()):
    """Read log-probs of batch ``chunk`` in a plain HF forward (with ``pre`` / ``post`` hooks, :func:`_hf_run`) whose
    last decoder layer outputs ``final`` where given (the model's own final norm, unembedding and logit scaling
    follow)."""
    def swap(m, a, o):
        return (final,) + tuple(o[1:]) if isinstance(o, tuple) else final

    last = [(_hf_layer(model, model.n_layers - 1)[1], swap)] if final is not None else []
    logits = _hf_run(model, chunk.batch.ids, model._forward_kwargs(chunk.batch), pre=pre, post=[*post, *last])
    return read_logprobs(logits[0][chunk.read_pos], chunk.read_tok)


def _every_node_ablated(model, ec, index):
    """Read log-probs of batch ``index`` in a plain HF forward with the first block's input, every head's channels
    and every MLP's output replaced by their means (``mean``) or zero."""
    means = _means(model, _task())
    scale = 0.0 if ec.method == "zero" else 1.0

    def first(m, a, kw):
        x = a[0] if a else kw["hidden_states"]
        value = (scale * means["embed"]).expand_as(x)
        return ((value,) + a[1:], kw) if a else (a, {**kw, "hidden_states": value})

    pre, post = [], []
    for layer in range(model.n_layers):
        _, mod = _hf_layer(model, layer)
        pre.append((unwrap(mod.self_attn.o_proj),
                    lambda m, a, z=scale * means[("z", layer)]: (z.expand_as(a[0]),) + a[1:]))
        post.append((mod.mlp, lambda m, a, o, y=scale * means[("mlp", layer)]: y.expand_as(o)))
    handle = _hf_layer(model, 0)[1].register_forward_pre_hook(first, with_kwargs=True)
    try:
        return _logprobs_from(model, ec.pp.chunks[index], pre=pre, post=post)
    finally:
        handle.remove()


@pytest.mark.parametrize("method", ["zero", "mean"])
@pytest.mark.parametrize("key", ["llama", *NORM_FAMILIES])
def test_edge_circuit_equals_a_by_hand_forward(family, key, method):
    """Llama (adds as is), Gemma-3 (norms after attention and MLP), OLMo-2 (post-norms, no pre-norm) and Granite
    (residual multiplier): a random half of the wires, every wire, all but a few and none kept equal the by-hand
    forward with one stream per receiver input; every wire kept is the intact model, none the model with every node
    ablated."""
    model = family(key)
    ec = EdgeCircuit(model, _task(), method, batch_size=1, senders="all")
    every = ec.wires()
    draw = random.Random(f"wires-{key}-{method}")
    few = set(draw.sample(every, len(every) // 20))
    early = min((w for w in every if w.receiver != "logits"), key=lambda w: ec._reads_at[w.reads])
    circuits = {"half": draw.sample(every, len(every) // 2), "every": every, "none": [],
                "most": [w for w in every if w not in few],  # few left out: read off the run's own stream
                "but one": [w for w in every if w != early]}  # the blocks after its receiver: the model's own forward
    assert ec._plain_from(ec._keep(circuits["but one"])) == int(ec._reads_at[early.reads]) + 1 < model.n_layers
    for index in (0, 2):
        got = {name: ec.chunk_logprobs(index, kept) for name, kept in circuits.items()}
        for name, kept in circuits.items():
            want = _brute(model, key, ec, index, kept)
            assert torch.allclose(got[name], want, atol=1e-5), (name, index, (got[name] - want).abs().max())
        assert torch.allclose(got["every"], _logprobs_from(model, ec.pp.chunks[index]), atol=1e-5)
        assert torch.allclose(got["none"], _every_node_ablated(model, ec, index), atol=1e-5)
        assert (got["half"] - got["every"]).abs().max() > 1e-3 and (got["half"] - got["none"]).abs().max() > 1e-3


def test_the_graph_and_bad_wires(circuits):
    ec = circuits("llama")
    recv = ec.receivers()
    assert recv[-1] == "logits" and "MLP0" in recv
    assert any("+" in r and r.endswith(".k") for r in recv), "the tiny Llama's KV groups are shared inputs"
    every = ec.wires()
    assert len(every) == len(set(every))
    assert {w.positions for w in every if w.receiver != "logits"} == set(CLASSES)
    for bad, match in [(("L2H0", "L1H0.q", "items"), "later layer than the sender"),
                       (("L0H9", "L1H0.q", "items"), "unknown sender"),
                       (("embed", "L1H0.x", "items"), "unknown receiver"),
                       (("embed", "logits", "items"), "positions must be")]:
        with pytest.raises((InputError, HeadError), match=match):  # the edge itself, or the circuit's graph
            ec.run([[Edge.at(*bad)]])


@pytest.mark.parametrize("key", NORM_FAMILIES)
def test_edge_faithfulness_runs_where_blocks_normalise_or_scale(family, key):
    """The faithfulness curve of edge circuits on Gemma-3, OLMo-2 and Granite: its ends are the intact model and the
    model with every head ablated (the node form's, to 1e-5), and a point is the edge circuit measured on its own."""
    from gna_interp.circuits.search.sufficiency import edge_faithfulness, faithfulness

    model = family(key)
    every = EdgeCircuit(model, _task(), "mean", batch_size=8).wires()
    fx = edge_faithfulness(model, _task(), every[::-1], sizes=[4], seeds=1, minimality=1, batch_size=8)
    frame = fx.to_frame()
    ranked = frame[frame.series == "ranked"].set_index("size")
    assert ranked.fraction[0] == pytest.approx(0.0) and ranked.fraction[len(every)] == pytest.approx(1.0)
    assert frame.fraction.notna().all()
    ec = EdgeCircuit(model, _task(), "mean", batch_size=8)
    assert ranked.fraction[4] == pytest.approx(fx.fraction(results(ec.run([every[::-1][:4]])[0])), abs=1e-5)
    node = faithfulness(model, _task(), [], sizes=[0], seeds=0, minimality=0, batch_size=8)
    assert get_metric("logit_diff").value(fx.empty) == pytest.approx(get_metric("logit_diff").value(node.empty),
                                                                     abs=1e-5)


def test_a_block_whose_map_is_not_read_is_refused_with_its_reason(tmp_path):
    """Falcon-H1 adds attention and Mamba-2 side by side, each under its own multiplier: no post-norm or residual
    multiplier of the bridge reproduces what its blocks add, and the edge circuit says so."""
    from family_matrix import FAMILIES

    from gna_interp import load_model
    from gna_interp.errors import UnsupportedArchitectureError

    spec = next(f for f in FAMILIES if f.key == "falcon_h1")
    model = load_model(spec.build(tmp_path / "falcon_h1"), device="cpu")
    with pytest.raises(UnsupportedArchitectureError, match="reproduces what it adds"):
        EdgeCircuit(model, _task())


def test_head_scope_keeps_the_embeddings_and_mlps(circuits, models):
    """``senders='heads'``: a circuit of head edges is the ``all`` circuit with every edge out of the embeddings and
    the MLPs added; those edges cannot be named."""
    every = circuits("llama")
    ec = EdgeCircuit(models("llama"), _task(), "mean", batch_size=8)
    wires = ec.wires()
    assert wires and all(w.sender.startswith("L") for w in wires)
    assert set(wires) == {w for w in every.wires() if w.sender.startswith("L")}
    kept = random.Random(3).sample(wires, len(wires) // 3)
    fixed = [w for w in every.wires() if not w.sender.startswith("L")]
    got, want = ec.run([kept])[0], every.run([kept + fixed])[0]
    assert torch.allclose(results(got)["logit_diff"], results(want)["logit_diff"], atol=1e-5)
    with pytest.raises(InputError, match="always kept"):
        ec.run([[Edge("embed")]])


def test_receiver_inputs_read_only_their_channels_where_the_projections_are_plain(models):
    """On a Llama every head input is a plain linear projection's output: the edge circuit reads each receiver's
    channels from the projection's input and its rows of the weight (every layer, checked once per model against
    the block's own projections); its scores equal those read through the whole block."""
    from gna_interp.circuits.edges.block_io import DIRECT

    model = models("llama")
    ec = EdgeCircuit(model, _task(), "mean", batch_size=16)
    assert set(ec._direct) == set(range(model.n_layers)) == {l for l, ok in model.facts[DIRECT].items() if ok is not False}
    assert all(len({h_in for h_in, _ in found.values()}) == 1 for found in ec._direct.values())  # q, k, v: one input
    kept = [ec.wires()[::7], ec.wires()[:50]]
    direct = [r.scores for r in ec.run(kept)]
    ec._direct = {}
    whole = [r.scores for r in ec.run(kept)]
    for a, b in zip(direct, whole):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "mamba2", "bamba"])
def test_leaving_edges_out_from_their_block_equals_the_whole_pass(circuits, family):
    """``run_without`` and ``run_left_out`` start each change at the first block that reads it, on a recorded pass,
    and at the first position of its position class where the blocks continue a key-value cache: the scores equal
    the same circuits run from the first block over every position (:meth:`EdgeCircuit.run`)."""
    ec = circuits(family)
    every = ec.wires()
    rng = random.Random(5)
    late = sorted(every, key=lambda w: -ec._reads_at[w.reads])
    picks = [late[0], late[len(late) // 3], rng.choice(every), next(w for w in every if w.receiver == "logits")]
    picks += [rng.choice([w for w in every if w.positions == c]) for c in ("decision", "items")]  # a suffix of them
    got = ec.run_without([[w] for w in picks] + [picks[:2]])
    want = ec.run([[w for w in every if w not in gone] for gone in [[w] for w in picks] + [picks[:2]]])
    for g, w in zip(got, want):
        assert torch.allclose(results(g)["logit_diff"], results(w)["logit_diff"], atol=1e-5)
    circuit = rng.sample(every, len(every) // 4)
    members = circuit[:3] + [max(circuit, key=lambda w: ec._reads_at[w.reads])]
    members += [next(w for w in circuit if w.positions == "decision")]
    got = ec.run_left_out(circuit, members)
    want = ec.run([[w for w in circuit if w != m] for m in members])
    for g, w in zip(got, want):
        assert torch.allclose(results(g)["logit_diff"], results(w)["logit_diff"], atol=1e-5)
    scores, records = ec.run_recorded(circuit)  # the circuit's own pass, recorded: its members start from it
    assert torch.allclose(results(scores)["logit_diff"], results(ec.run([circuit])[0])["logit_diff"], atol=1e-6)
    passes = []
    real = EdgeCircuit._chunk
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EdgeCircuit, "_chunk", lambda self, *a, **k: passes.append(k.get("record")) or real(self, *a, **k))
        again = ec.run_left_out(circuit, members, records)
    assert records is not None and all(r is None for r in passes)  # no pass of the circuit itself this time
    assert len(passes) == len(members) * len(ec.pp.chunks)
    for g, w in zip(again, want):
        assert torch.allclose(results(g)["logit_diff"], results(w)["logit_diff"], atol=1e-5)
    with pytest.raises(InputError, match="not this circuit's passes"):  # another circuit's records
        ec.run_left_out(circuit[1:], members[1:], records)
    with pytest.raises(InputError, match="not this circuit's passes"):
        ec.run_left_out(circuit, members, records[:-1] if len(records) > 1 else records + records)


def test_the_kept_stream_means_follow_the_weights(tiny_dirs):
    """The embeddings' and MLPs' mean outputs are computed once per model and prompts, and again after a weight is
    edited in place: a circuit's mean ablation never reads means of weights the model no longer has."""
    from gna_interp import load_model

    model = load_model(tiny_dirs["llama"], device="cpu")
    before = EdgeCircuit(model, _task(), "mean")._means
    assert EdgeCircuit(model, _task(), "mean")._means["MLP0"] is before["MLP0"]  # shared, not recomputed
    mlp = unwrap(model.hf_module("blocks.0.mlp")).down_proj.weight
    with torch.no_grad():
        mlp.mul_(2.0)
    after = EdgeCircuit(model, _task(), "mean")._means
    assert torch.allclose(after["MLP0"], 2.0 * before["MLP0"], atol=1e-6)
    assert not torch.allclose(after["MLP0"], before["MLP0"])


def test_mean_replacements_are_kept_per_reference_and_never_under_a_placed_hook(tiny_dirs):
    """Mean ablation's replacements come from one forward over the reference, kept for the next ablation of the same
    prompts and weights; they equal a by-hand mean over the real tokens; while a hook is placed on the model its
    forward is not the model's own, so they are computed afresh (with the hook) and not kept."""
    from gna_interp import load_model
    from gna_interp.interventions.ablation import replacements

    model = load_model(tiny_dirs["llama"], device="cpu")
    task = _task()
    head = model.heads()[3]
    first = replacements(model, [head], "mean", task)[0]
    assert replacements(model, model.heads(), "mean", task)[3].mean is not None
    again = replacements(model, [head], "mean", task)[0]
    site = model.head_site(head)
    batch = model.as_batch(list(task.prompts))
    _, cache = model.run_with_cache(batch, names_filter=site.hook)
    by_hand = cache[site.hook].flatten(2)[batch.attention_mask.bool()][:, site.columns].float().mean(0)
    assert torch.allclose(first.mean, by_hand, atol=1e-6) and torch.equal(again.mean, first.mean)
    resid = model.block_input_hook(head.layer)
    with model.hooks([(resid, lambda x, hook=None: 2 * x)]):
        hooked = replacements(model, [head], "mean", task)[0]
    assert not torch.allclose(hooked.mean, first.mean)
    assert torch.equal(replacements(model, [head], "mean", task)[0].mean, first.mean)


@pytest.mark.parametrize("key", ["llama", "gemma3"])
def test_an_rms_input_norm_is_folded_into_its_projections_rows(family, key):
    """Llama's RMS norm (gain ``weight``) and Gemma-3's (gain ``1 + weight``) are found as :class:`RMSFold` by an
    edge circuit's per-model checks; a fold's rows of a projection applied to a stream equal the projection of the
    norm's output; a LayerNorm (which subtracts the mean) is no RMS norm."""
    from gna_interp.circuits.edges.block_io import FOLDS, RMSFold

    model = family(key)
    ec = EdgeCircuit(model, _task(), "mean", batch_size=1)
    ec.chunk_logprobs(0, ec.wires()[:5])
    folds = model.facts[FOLDS]
    assert folds and all(isinstance(f, RMSFold) for f in folds.values()), folds
    _, layer = _hf_layer(model, 1)
    norm, proj = layer.input_layernorm, unwrap(layer.self_attn.q_proj)
    x = 3 * torch.randn(2, 5, proj.weight.shape[1], generator=torch.Generator().manual_seed(0)) + 0.5
    with torch.no_grad():
        fold = RMSFold.of(norm, x, norm(x), model.dtype)
        assert fold is not None
        want = F.linear(norm(x), proj.weight[4:12], None if proj.bias is None else proj.bias[4:12])
        got = fold.project(x, proj, 4, 12, fold.scale(x))
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    ln = torch.nn.LayerNorm(x.shape[-1])
    with torch.no_grad():
        assert RMSFold.of(ln, x, ln(x), torch.float32) is None
