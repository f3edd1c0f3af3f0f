"""In-memory models: ``load_model(hf_model, tokenizer)`` and ``load_model(bridge)`` wrap a model already in memory,
everything runs on it, and the object passed in is left exactly as it was (modules, hooks, config, training mode,
parameter objects and values), also after an exception inside ``ablate``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

import gna_interp as gna
from gna_interp.errors import InputError, ModelUnavailableError, UnsupportedArchitectureError
from gna_interp.models.loading import quiet_transformers
from gna_interp.models.spec import zoo_dir
from gna_interp.models.tiny import build_tiny

ZOO = zoo_dir() / "transformer-kv"
PROMPT = "Memorize the following dictionary:\ncat:3\ndog:7\nThe value of the key 'cat' is"
HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
              "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
              "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
              "_load_state_dict_post_hooks")


def _hf(path: Path, **kw: Any) -> tuple[torch.nn.Module, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers():
        return AutoModelForCausalLM.from_pretrained(path, **kw), AutoTokenizer.from_pretrained(path)


def snapshot(root: torch.nn.Module) -> dict[str, Any]:
    """Everything about ``root`` that wrapping could change: per module its object, class, training flag, child
    names, attribute names, every hook dictionary, its config object and content; per parameter / buffer the
    tensor object, a copy of its values, dtype, device, requires_grad and grad."""
    mods = {}
    for name, mod in root.named_modules(remove_duplicate=False):
        cfg = getattr(mod, "config", None)
        mods[name] = (id(mod), type(mod), mod.training, tuple(mod._modules), tuple(sorted(vars(mod))),
                      tuple(tuple(getattr(mod, h, {}).items()) for h in HOOK_DICTS),
                      id(cfg), getattr(cfg, "_attn_implementation", None),
                      repr(cfg.to_dict()) if hasattr(cfg, "to_dict") else repr(cfg))
    tensors = {f"p:{n}": t for n, t in root.named_parameters(remove_duplicate=False)}
    tensors.update({f"b:{n}": t for n, t in root.named_buffers(remove_duplicate=False)})
    return {"modules": mods, "tensors": {n: (t, t.detach().clone(), t.dtype, t.device, t.requires_grad, t.grad)
                                         for n, t in tensors.items()}}


def assert_unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["modules"].keys() == before["modules"].keys()
    for name, was in before["modules"].items():
        assert after["modules"][name] == was, f"module {name!r} changed"
    assert after["tensors"].keys() == before["tensors"].keys()
    for name, (t, values, dtype, device, req, grad) in before["tensors"].items():
        t2, _, dtype2, device2, req2, grad2 = after["tensors"][name]
        assert t2 is t, f"{name} is another tensor object"
        assert (dtype2, device2, req2, grad2) == (dtype, device, req, grad), f"{name} changed dtype/device/grad"
        assert torch.equal(t2.detach(), values), f"{name} changed value"


@pytest.fixture()
def zoo_hf() -> tuple[torch.nn.Module, Any]:
    """The zoo Transformer as plain transformers loads it (sdpa attention), in training mode: a notebook's object."""
    hf, tok = _hf(ZOO)
    return hf.train(), tok


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny("llama", tmp_path_factory.mktemp("inmem") / "llama")


def _zero_columns_logits(hf: torch.nn.Module, layer: int, head: int, ids: torch.Tensor) -> torch.Tensor:
    """Reference ablation, computed apart from gna_interp: a deep copy of the HF model (eager attention) with the
    head's input columns of ``o_proj`` zeroed."""
    ref = copy.deepcopy(hf).eval()
    ref.set_attn_implementation("eager")
    o = ref.model.layers[layer].self_attn.o_proj
    d = ref.config.head_dim
    with torch.no_grad():
        o.weight[:, head * d:(head + 1) * d] = 0
        return ref(ids).logits


def test_notebook_cell_discover_leaves_the_model_as_it_was(zoo_hf: tuple, tmp_path: Path) -> None:
    hf, tok = zoo_hf
    before = snapshot(hf)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    m = gna.load_model(hf, tok)
    assert m.in_memory and m.name == "<in-memory LlamaForCausalLM>" and m.kv_words
    # the wrapped model computes what the user's model computes (HF's own forward, eval mode)
    with torch.no_grad():
        hf.eval()
        want = hf(ids).logits
        hf.train()
    torch.testing.assert_close(m.forward(ids), want, atol=1e-4, rtol=0)
    # no weight was copied: the bridge runs on the user's parameter objects
    theirs = {id(p) for p in hf.parameters()}
    assert all(id(p) in theirs for p in m.hf_model.parameters())
    task = gna.KVRetrieval(n_pairs=4, n_samples=12, words=m.kv_words, seed=1)
    circuit = gna.discover(m, task)
    assert len(circuit.scan.heads) == 8 and circuit.baseline["accuracy"] > 0.5
    assert_unchanged(before, snapshot(hf))
    assert hf.training and all(mod.training for mod in hf.modules())
    assert hf.config._attn_implementation == "sdpa"
    # saved results name the model honestly, load back for reading, and say why the model cannot be reloaded
    circuit.save(tmp_path / "c")
    doc = (tmp_path / "c" / "circuit.json").read_text()
    assert '"model": "<in-memory LlamaForCausalLM>"' in doc and '"model_in_memory": true' in doc
    back = gna.Circuit.load(tmp_path / "c")
    assert back.model_in_memory and back.heads == circuit.heads
    with pytest.raises(ModelUnavailableError, match="wrapped from memory"):
        gna.load_model(back.model)


def test_exception_inside_ablate_leaves_the_model_as_it_was(zoo_hf: tuple) -> None:
    hf, tok = zoo_hf
    ids = tok(PROMPT, return_tensors="pt").input_ids
    before = snapshot(hf)
    m = gna.load_model(hf, tokenizer=tok)
    intact = m.forward(ids)
    with pytest.raises(RuntimeError, match="inside ablate"):
        with gna.ablate(m, "L1H2"):
            ablated = m.forward(ids)
            raise RuntimeError("inside ablate")
    # the ablation was the head's o_proj columns zeroed (computed on a separate copy), and it was undone
    torch.testing.assert_close(ablated, _zero_columns_logits(hf, 1, 2, ids), atol=1e-5, rtol=0)
    assert (ablated - intact).abs().max() > 1e-3
    torch.testing.assert_close(m.forward(ids), intact, atol=0, rtol=0)
    assert_unchanged(before, snapshot(hf))
    with torch.no_grad():
        hf.eval()
        torch.testing.assert_close(hf(ids).logits, intact, atol=1e-4, rtol=0)


def test_bridge_passed_in(zoo_hf: tuple) -> None:
    from transformer_lens.model_bridge import TransformerBridge

    _, tok = zoo_hf
    with quiet_transformers():
        bridge = TransformerBridge.boot_transformers(str(ZOO), device="cpu", tokenizer=tok)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    fired: list[str] = []
    bridge.set_use_hook_mlp_in(True)
    for name in ("blocks.0.attn.hook_pattern", "blocks.0.hook_mlp_in"):
        bridge.add_hook(name, lambda x, hook: fired.append(hook.name), is_permanent=True)
    # a forward first: TL then wires its lazy capture hooks, closures over the user's bridge components
    want = bridge(ids, return_type="logits")
    fired.clear()
    bridge.train()
    before = snapshot(bridge)
    m = gna.load_model(bridge)
    assert m.name == "<in-memory LlamaForCausalLM>"
    torch.testing.assert_close(m.forward(ids), want, atol=0, rtol=0)
    _, cache = m.run_with_cache(ids, names_filter=["blocks.0.hook_mlp_in"])
    assert "blocks.0.hook_mlp_in" in cache  # the copy's own hook point fires, rewired to the copy ...
    assert not fired  # ... and the user's hooks stay on the user's bridge
    ps = gna.patterns(m, ids, "L0H1")
    rows = ps[gna.HeadRef.parse("L0H1")][0].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)
    with pytest.raises(KeyError):
        with gna.ablate(m, ["L0H0", "L1H3"]):
            m.forward(ids)
            raise KeyError("boom")
    hf, _ = _hf(ZOO)
    with gna.ablate(m, "L1H2"):
        torch.testing.assert_close(m.forward(ids), _zero_columns_logits(hf, 1, 2, ids), atol=1e-5, rtol=0)
    assert_unchanged(before, snapshot(bridge))
    assert bridge.training
    bridge.eval()
    torch.testing.assert_close(bridge(ids, return_type="logits"), want, atol=0, rtol=0)
    assert sorted(fired) == ["blocks.0.attn.hook_pattern", "blocks.0.hook_mlp_in"]


def test_in_memory_equals_loading_from_disk(tiny_llama: Path) -> None:
    disk = gna.load_model(tiny_llama, device="cpu")
    hf, tok = _hf(tiny_llama)
    mem = gna.load_model(hf, tokenizer=tok, device="cpu")
    texts = ["key:12\nThe value is", "hello world, hello"]
    torch.testing.assert_close(mem.forward(texts), disk.forward(texts), atol=1e-6, rtol=0)
    task = gna.KVRetrieval(n_pairs=3, n_samples=6, max_value=9, seed=0)
    a = gna.scan_heads(disk, task, strategy="exact", progress=False).to_frame()
    b = gna.scan_heads(mem, task, strategy="exact", progress=False).to_frame()
    assert list(a["name"]) == list(b["name"])
    torch.testing.assert_close(torch.tensor(b["drop"].to_numpy()), torch.tensor(a["drop"].to_numpy()),
                               atol=1e-6, rtol=0)


def test_half_precision_in_memory(tiny_llama: Path) -> None:
    hf, tok = _hf(tiny_llama, dtype=torch.bfloat16)
    before = snapshot(hf)
    mem = gna.load_model(hf, tok)
    disk = gna.load_model(tiny_llama, device="cpu", dtype="bfloat16")
    got, want = mem.forward(PROMPT), disk.forward(PROMPT)
    assert got.dtype == torch.float32  # the output end runs in float32 on the copy ...
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    with gna.ablate(mem, "L2H1"):
        mem.forward(PROMPT)
    assert_unchanged(before, snapshot(hf))  # ... while the user's norm and unembedding stay bfloat16, same objects
    with pytest.raises(InputError, match="does not cast"):
        gna.load_model(hf, tokenizer=tok, dtype="float32")


def test_bad_input_is_refused_with_typed_errors(tiny_llama: Path) -> None:
    from transformers import AutoModel, BioGptConfig, BioGptForCausalLM

    hf, tok = _hf(tiny_llama)
    with pytest.raises(InputError, match="without its tokenizer"):
        gna.load_model(hf)
    with pytest.raises(InputError, match="Hugging Face tokenizer"):
        gna.load_model(hf, tokenizer="gpt2")
    with pytest.raises(TypeError, match="multiple values"):  # the tokenizer is one argument, positional or named
        gna.load_model(hf, tok, tokenizer=tok)
    with pytest.raises(InputError, match="tokenizer goes with a model object"):  # a spec brings its own tokenizer
        gna.load_model("zoo:transformer-kv", "gpt2")
    with pytest.raises(InputError, match="neither moves nor copies"):
        gna.load_model(hf, tokenizer=tok, device="meta")
    with pytest.raises(InputError, match="device_map"):
        gna.load_model(hf, tok, device_map="auto")
    with quiet_transformers():
        base = AutoModel.from_pretrained(tiny_llama)
    with pytest.raises(UnsupportedArchitectureError, match="not a causal language model"):
        gna.load_model(base, tok)
    with pytest.raises(UnsupportedArchitectureError, match="not a Hugging Face PreTrainedModel"):
        gna.load_model(torch.nn.Linear(3, 3), tok)
    biogpt = BioGptForCausalLM(BioGptConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, intermediate_size=64))
    before = snapshot(biogpt)
    with pytest.raises(UnsupportedArchitectureError, match="BioGptForCausalLM.*does not support"):
        gna.load_model(biogpt, tok)
    assert_unchanged(before, snapshot(biogpt))
    m = gna.load_model(hf, tok)
    with pytest.raises(InputError, match="already belongs to a gna_interp Model"):
        _rewrap_reached(m)


def _rewrap_reached(m: Any) -> None:
    """Wrap the bridge of a gna Model whose mixers gna reached (simulated by marking one component)."""
    from gna_interp.models.reach import _KIND

    _KIND[m.bridge.blocks[0].attn] = "attn"
    gna.load_model(m.bridge)
