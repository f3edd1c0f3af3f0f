"""Edge circuits (:mod:`gna_interp.circuits.edge_circuit`) against independent computations: a by-hand forward of
the plain Hugging Face Llama in which every receiver input reads its own stream built from the senders' writes, the
node form (every head outside a set ablated, :class:`SetAblation`) and the intact model."""

from __future__ import annotations

import random

import pytest
import torch
from test_paths import _attn_by_hand, _hf_layer, _masks

from gna_interp.circuits.edge_circuit import EdgeCircuit, Wire
from gna_interp.models.graph import CLASSES
from gna_interp.engine.replay import SetAblation
from gna_interp.errors import InputError
from gna_interp.tasks import KVRetrieval
from gna_interp.engine.metrics import get_metric, results
from gna_interp.engine.unembed import read_logprobs


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


def _means(model, task):
    """Mean embedding, per-layer mean head channels (the output projection's input) and mean MLP output over the
    task prompts' real tokens, from plain HF forwards."""
    batch = model.as_batch(list(task.prompts))
    base, _ = _hf_layer(model, 0)
    got, handles = {}, []
    handles.append(base.embed_tokens.register_forward_hook(lambda m, a, o: got.__setitem__("embed", o)))
    for layer in range(model.n_layers):
        _, mod = _hf_layer(model, layer)
        handles.append(mod.self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, layer=layer: got.__setitem__(("z", layer), a[0])))
        handles.append(mod.mlp.register_forward_hook(lambda m, a, o, layer=layer: got.__setitem__(("mlp", layer), o)))
    try:
        with torch.no_grad():
            model.hf_model(batch.ids, attention_mask=batch.attention_mask)
    finally:
        for h in handles:
            h.remove()
    real = batch.attention_mask.bool()
    return {k: v[real].mean(0) for k, v in got.items()}


def _brute(model, ec, index, kept):
    """Read log-probs of batch ``index`` (one unpadded row) with only ``kept`` carrying activations, by hand: every
    head's q / k / v and every MLP's input computed from its own stream ``Σ_S (w_S if kept else w̄_S)``."""
    chunk = ec.pp.chunks[index]
    ids, kwargs = chunk.batch.ids, model._forward_kwargs(chunk.batch)
    m = _masks(ec.pp, chunk)
    cls = {"items": m["items"], "decision": m["decision"] & ~m["items"], "other": m["other"]}
    means = _means(model, _task())
    keep: dict[str, dict[str, set[str]]] = {}
    for w in kept:
        keep.setdefault(w.receiver, {}).setdefault(w.sender, set()).add(w.positions)
    write, bar = {}, {}

    def stream(receiver):
        s = sum(bar.values()) + torch.zeros(1, ids.shape[1], bar["embed"].shape[-1])
        for sender, where in keep.get(receiver, {}).items():
            mask = torch.zeros_like(cls["items"], dtype=torch.float32)
            for c in where:
                mask = mask + (torch.ones_like(mask) if c == "all" else cls[c].float())
            s = s + mask[None, :, None] * (write[sender] - bar[sender])
        return s

    def input_name(head, inp):
        return next(r for r in ec.receivers() if r.endswith(f".{inp}") and head.name in r.split(".")[0].split("+"))

    base, _ = _hf_layer(model, 0)
    with torch.no_grad():
        write["embed"], bar["embed"] = base.embed_tokens(ids), means["embed"]
        for layer in range(model.n_layers):
            _, mod = _hf_layer(model, layer)
            o = mod.self_attn.o_proj.weight
            new, new_bar = {}, {}
            for h in (h for h in model.heads() if h.layer == layer):
                z = _attn_by_hand(model, mod, {i: stream(input_name(h, i)) for i in ("q", "k", "v")}, h, ids, kwargs)
                cols = model.head_site(h).columns
                new[h.name] = z.reshape(1, ids.shape[1], -1) @ o[:, cols].T
                new_bar[h.name] = means[("z", layer)][cols] @ o[:, cols].T
            write.update(new)  # the layer's heads write once all of them have read
            bar.update(new_bar)
            name = f"MLP{layer}"
            write[name] = mod.mlp(mod.post_attention_layernorm(stream(name)))
            bar[name] = means[("mlp", layer)]
        final = stream("logits")
        logits = model.hf_model.get_output_embeddings()(base.norm(final)[0][chunk.read_pos])
    return read_logprobs(logits, chunk.read_tok)


@pytest.mark.parametrize("share", [0.0, 0.3, 0.9])
def test_edge_circuit_equals_a_by_hand_forward(circuits, models, share):
    model = models("llama")
    ec = circuits("llama", batch_size=1)
    every = ec.wires()
    kept = random.Random(f"wires-{share}").sample(every, int(share * len(every)))
    for index in (0, 2):
        got = ec.chunk_logprobs(index, kept)
        want = _brute(model, ec, index, kept)
        assert torch.allclose(got, want, atol=1e-4), (share, index, (got - want).abs().max())


def test_the_graph_and_bad_wires(circuits):
    ec = circuits("llama")
    recv = ec.receivers()
    assert recv[-1] == "logits" and "MLP0" in recv
    assert any("+" in r and r.endswith(".k") for r in recv), "the tiny Llama's KV groups are shared inputs"
    every = ec.wires()
    assert len(every) == len(set(every))
    assert {w.positions for w in every if w.receiver != "logits"} == set(CLASSES)
    for bad, match in [(Wire("L2H0", "L1H0.q", "items"), "before the receiver"),
                       (Wire("L9H0", "L1H0.q", "items"), "unknown sender"),
                       (Wire("embed", "L1H0.x", "items"), "unknown receiver"),
                       (Wire("embed", "logits", "items"), "positions must be")]:
        with pytest.raises(InputError, match=match):
            ec.run([[bad]])


def test_a_post_norm_model_is_refused_with_its_reason(tmp_path):
    from family_matrix import FAMILIES

    from gna_interp import load_model
    from gna_interp.errors import UnsupportedArchitectureError

    spec = next(f for f in FAMILIES if f.key == "gemma3")
    model = load_model(spec.build(tmp_path / "gemma3"), device="cpu")
    with pytest.raises(UnsupportedArchitectureError, match="normalise or scale"):
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
        ec.run([[Wire("embed", "logits", "all")]])
