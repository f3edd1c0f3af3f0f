"""The habits researchers bring: a TransformerLens user's ten most common calls work on a gna_interp Model or refuse
with a typed error that says what to use (the table in docs/python.md, 'Coming from TransformerLens'); an nnsight
LanguageModel goes in, and a circuit's heads and edges come back out as TransformerLens hooks, Hugging Face module
paths and nnsight interventions that remove the same heads as gna.ablate."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.errors import BridgeOnlyError, GnaError, InputError, UnsupportedArchitectureError
from gna_interp.models import zoo_dir, zoo_names
from gna_interp.models.handoff import ablated_modules, ablation_hooks, edge_addresses, head_addresses

pytestmark = pytest.mark.skipif("transformer-kv" not in zoo_names(), reason="the zoo Transformer is not installed")


@pytest.fixture(scope="module")
def m():
    return gna.load_model("zoo:transformer-kv", device="cpu")


@pytest.fixture(scope="module")
def text(m):
    w = m.kv_words
    return f"{w[0]}:12\n{w[1]}:7\n{w[0]}:"


def test_to_tokens_follows_the_tokenizer_and_prepend_bos_gives_transformerlens_ids(m, text):
    plain = m.to_tokens(text)
    assert plain.shape[0] == 1 and int(plain[0, 0]) != m.bos_id  # the zoo tokenizer adds no BOS
    assert torch.equal(plain, m.tokenize(text).ids)
    bos = m.to_tokens(text, prepend_bos=True)
    assert torch.equal(bos, m.bridge.to_tokens(text))  # TransformerLens's own ids
    assert torch.equal(bos[:, 1:], plain) and int(bos[0, 0]) == m.bos_id
    assert torch.equal(m.to_tokens(text, prepend_bos=False), plain)
    assert torch.equal(m.to_tokens(m.to_string(bos[0]), prepend_bos=True), bos)  # a BOS already there is not doubled
    right = m.to_tokens([text, m.kv_words[2]], padding_side="right")
    assert int(right[1, 0]) != m.pad_id and int(right[1, -1]) == m.pad_id
    left = m.to_tokens([text, m.kv_words[2]])
    assert int(left[1, -1]) != m.pad_id and int(left[1, 0]) == m.pad_id
    with pytest.raises(InputError, match="already token ids"):
        m.to_tokens(plain)
    with pytest.raises(InputError, match="padding_side"):
        m.to_tokens(text, padding_side="middle")


def test_prepend_bos_is_honoured_in_every_run_and_refused_with_ids(m, text):
    logits, cache = m.run_with_cache(text, prepend_bos=True)
    ref_logits, ref_cache = m.bridge.run_with_cache(text)
    assert logits.shape == ref_logits.shape and torch.allclose(logits, ref_logits, atol=1e-5)
    assert cache["pattern", 1].shape == ref_cache["pattern", 1].shape
    assert m.run_with_cache(text)[0].shape[1] == logits.shape[1] - 1
    assert torch.allclose(m(text, prepend_bos=True), ref_logits, atol=1e-5)
    assert torch.allclose(m.run_with_hooks(text, prepend_bos=True), ref_logits, atol=1e-5)
    assert m.to_str_tokens(text, prepend_bos=True)[0] == m.tokenizer.bos_token
    ids = m.to_tokens(text)
    for call in (lambda: m.run_with_cache(ids, prepend_bos=True), lambda: m(ids, prepend_bos=False),
                 lambda: m.run_with_hooks(ids, prepend_bos=True), lambda: m.to_str_tokens(ids, prepend_bos=True)):
        with pytest.raises(InputError, match="prepend_bos and padding_side apply to text"):
            call()


def test_the_model_is_callable_and_decodes(m, text):
    ids = m.to_tokens(text)
    logits = m(ids)
    assert logits.shape == (1, ids.shape[1], m.cfg.d_vocab) and not logits.requires_grad
    assert torch.allclose(logits, m.forward(ids)) and torch.allclose(m(text), logits)
    loss = m(text, return_type="loss")
    assert loss.dim() == 0 and torch.isclose(loss, m.bridge(ids, return_type="loss").detach(), atol=1e-5)
    short = f"{m.kv_words[2]}:1"  # a padded batch: the loss leaves the padding out
    both = m([text, short], return_type="loss")
    per = [(m(t, return_type="loss"), m.to_tokens(t).shape[1] - 1) for t in (text, short)]
    assert torch.isclose(both, sum(loss * n for loss, n in per) / sum(n for _, n in per), atol=1e-5)
    with pytest.raises(InputError, match="return_type"):
        m(text, return_type="probs")
    assert m.to_string(ids[0]) == m.tokenizer.decode(ids[0].tolist())
    assert m.to_string(ids) == [m.tokenizer.decode(ids[0].tolist())]
    assert isinstance(m.to_string(int(ids[0, 0])), str)
    assert m.to_single_token(m.kv_words[0]) == int(ids[0, 0])
    with pytest.raises(InputError, match="not one"):
        m.to_single_token(text)
    with pytest.raises(InputError, match="outside the vocabulary"):
        m.to_string([10 ** 6])


def test_hooks_cache_and_names_work_as_in_transformerlens(m, text):
    _, cache = m.run_with_cache(text)
    assert torch.equal(cache["pattern", 1], cache["blocks.1.attn.hook_pattern"])
    seen = []

    def keep(pattern, hook):
        seen.append(hook.name)
        return pattern

    m.run_with_hooks(text, fwd_hooks=[("blocks.1.attn.hook_pattern", keep)])
    with m.hooks([("blocks.0.attn.hook_z", keep)]):
        m(text)
    # hook_z is TransformerLens's alias of the output projection's input, which the hook reports by its own name
    assert seen == ["blocks.1.attn.hook_pattern", "blocks.0.attn.o.hook_in"]
    assert m.cfg.n_layers == m.n_layers == 2 and m.cfg.n_heads == 4


def test_hooks_by_name_are_undone_on_exit_and_on_error_and_act_as_the_bridges_own(m, text):
    name = "blocks.0.attn.hook_z"
    point = m.hook_points()[name]
    before = list(point.fwd_hooks)

    def zero(z, hook):
        return torch.zeros_like(z)

    with m.bridge.hooks(fwd_hooks=[(name, zero)]):
        theirs = m(text)
    with m.hooks([(name, zero)]):
        ours = m(text)
        assert len(point.fwd_hooks) == len(before) + 1
    assert torch.equal(ours, theirs) and not torch.equal(ours, m(text))
    with pytest.raises(RuntimeError, match="boom"):
        with m.hooks([(name, zero), ("blocks.1.attn.hook_z", zero)]):
            raise RuntimeError("boom")
    assert point.fwd_hooks == before and torch.equal(m(text), m(text))
    assert all(not p.fwd_hooks for p in m.hook_points().values())


def test_transformerlens_only_names_refuse_with_what_to_use(m):
    with pytest.raises(BridgeOnlyError, match=r"model\.bridge\.W_U"):
        m.W_U
    with pytest.raises(BridgeOnlyError, match=r"model\.hooks"):
        m.add_hook("blocks.0.attn.hook_z", lambda x, hook: x)
    with pytest.raises(BridgeOnlyError, match="nothing to reset"):
        m.reset_hooks()
    with pytest.raises(BridgeOnlyError, match="load_model"):
        m.from_pretrained("gpt2")
    assert isinstance(m.bridge.W_U, torch.Tensor)
    assert not hasattr(m, "W_U") and not hasattr(m, "no_such_name")  # still an AttributeError for hasattr
    with pytest.raises(AttributeError) as e:
        m.no_such_name
    assert not isinstance(e.value, GnaError)
    with pytest.raises(InputError, match=r"model\.bridge\.generate"):
        m.generate("x", temperature=0.7)
    assert isinstance(m.generate(m.kv_words[0] + ":", max_new_tokens=2), str)


def test_subpackages_are_attributes_of_the_package():
    assert gna.viz.__name__ == "gna_interp.viz" and callable(gna.viz.score_heatmap)
    assert gna.models.Model is gna.Model and "viz" in dir(gna)


def test_heads_leave_as_transformerlens_hooks_and_hf_module_hooks(m, text):
    heads = ["L0H3", "L1H3"]
    with gna.ablate(m, heads):
        ref = m(text)
    assert not torch.allclose(ref, m(text))
    assert torch.allclose(m.run_with_hooks(text, fwd_hooks=ablation_hooks(m, heads)), ref, atol=1e-5)
    ids = m.to_tokens(text)
    assert torch.allclose(m.bridge.run_with_hooks(ids, fwd_hooks=ablation_hooks(m, heads)), ref, atol=1e-5)
    addresses = head_addresses(m, heads)
    assert [a.module for a in addresses] == ["model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"]
    assert [(a.side, a.start, a.stop) for a in addresses] == [("input", 48, 64), ("input", 48, 64)]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(zoo_dir() / "transformer-kv").eval()  # a plain, separate copy
    with torch.no_grad(), ablated_modules(hf, [a.to_dict() for a in addresses]):
        out = hf(ids).logits
    assert torch.allclose(out, ref, atol=1e-5)
    with torch.no_grad():  # the hooks are gone
        assert torch.allclose(hf(ids).logits, m(ids), atol=1e-5)


def test_a_circuits_edges_leave_as_addresses(m):
    import pandas as pd

    edges = pd.DataFrame([{"edge": "L0H3 -> L1H3.k@items", "sender": "L0H3", "receiver": "L1H3", "input": "k",
                           "positions": "items", "effect": 1.5, "low": 1.0, "high": 2.0},
                          {"edge": "L1H3 -> logits", "sender": "L1H3", "receiver": None, "input": "logits",
                           "positions": "all", "effect": 0.5, "low": 0.1, "high": 0.9}])
    rows = edge_addresses(m, edges)
    assert rows[0]["sender"]["module"] == "model.layers.0.self_attn.o_proj"
    hf_cfg = m.hf_model.config
    kv_group = 3 // (hf_cfg.num_attention_heads // hf_cfg.num_key_value_heads)
    d = m.cfg.d_head
    assert rows[0]["receiver"] == {"head": "L1H3", "input": "k", "hook": "blocks.1.attn.k.hook_out",
                                   "module": "model.layers.1.self_attn.k_proj", "side": "output",
                                   "start": kv_group * d, "stop": (kv_group + 1) * d,
                                   "width": hf_cfg.num_key_value_heads * d, "head_dim": d}
    assert rows[0]["effect"] == 1.5 and rows[1]["receiver"] is None
    assert all(m.has_hook(r["sender"]["hook"]) for r in rows)
    with pytest.raises(InputError, match="edge table"):
        edge_addresses(m, pd.DataFrame({"sender": ["L0H3"]}))


def test_a_hugging_face_module_of_an_nnsight_like_wrapper_is_refused_clearly():
    from gna_interp.models.in_memory import from_nnsight

    assert from_nnsight(torch.nn.Linear(2, 2)) is None


@pytest.mark.skipif(importlib.util.find_spec("nnsight") is None, reason="nnsight is not installed (pip install nnsight)")
def test_an_nnsight_language_model_goes_in_and_its_circuit_comes_back_out():
    warnings.simplefilter("ignore")
    from nnsight import LanguageModel

    lm = LanguageModel(str(zoo_dir() / "transformer-kv"), dispatch=True)
    m = gna.load_model(lm)
    w = m.kv_words
    ids = m.to_tokens(f"{w[0]}:12\n{w[1]}:7\n{w[0]}:")
    with torch.no_grad(), lm.trace(ids):
        logits = lm.output.logits.save()
    assert torch.allclose(logits, m(ids), atol=1e-5)
    heads = ["L0H3", "L1H3"]
    with gna.ablate(m, heads):
        ref = m(ids)
    with torch.no_grad(), lm.trace(ids):
        for a in head_addresses(m, heads):
            lm.get(a.module).input[..., a.start:a.stop] = 0
        ablated = lm.output.logits.save()
    assert torch.allclose(ablated, ref, atol=1e-5)
    with pytest.raises(UnsupportedArchitectureError, match="LM head"):
        gna.load_model(lm.model)
