"""One model, one answer: every way of loading the same weights -- a folder spec, a Hugging Face object with its
tokenizer (``load_model(hf, tok)``, also with ``device=``), a ``TransformerBridge`` the user booted (with and without
a tokenizer), the SmolLM2 GGUF where installed -- tokenises the same way (the checkpoint tokenizer's BOS policy:
:func:`gna_interp.models.model.checkpoint_tokenizer`) and gives the same logits and the same scan, to 1e-6."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import gna_interp as gna
from gna_interp.errors import InputError
from gna_interp.models.loading import quiet_transformers
from gna_interp.models.tiny import byte_tokenizer, save_tiny

TEXTS = ["Memorize the following dictionary:\ncat:3\ndog:7\nThe value of the key 'cat' is", "key:12\nThe value is"]
TOL = 1e-6


def _configs() -> dict[str, tuple[Any, type, bool]]:
    """``{family: (config, class, tokenizer adds BOS)}``: Gemma's tokenizers add BOS, the others' do not."""
    import transformers as T

    v = len(byte_tokenizer())
    return {
        "llama": (T.LlamaConfig(vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
                  T.LlamaForCausalLM, False),
        "gpt2": (T.GPT2Config(vocab_size=v, n_embd=32, n_layer=2, n_head=4, n_positions=256), T.GPT2LMHeadModel, False),
        "gemma3": (T.Gemma3TextConfig(vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=256, sliding_window=16),
                   T.Gemma3ForCausalLM, True),
    }


def _tokenizer(adds_bos: bool) -> Any:
    tok = byte_tokenizer()
    if adds_bos:  # saved as add_bos_token: true in tokenizer_config.json, as Gemma's and Llama-3's are
        tok.add_bos_token = True
        tok.update_post_processor()
    return tok


def _hf(path: Path) -> tuple[torch.nn.Module, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers():
        return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _user_bridge(path: Path, with_tokenizer: bool) -> Any:
    """A bridge booted the way a TransformerLens user does (TL makes its tokenizer prepend BOS)."""
    from transformer_lens.model_bridge import TransformerBridge

    hf, tok = _hf(path)
    with quiet_transformers():
        if with_tokenizer:
            return TransformerBridge.boot_transformers(str(path), device="cpu", hf_model=hf, tokenizer=tok)
        return TransformerBridge.boot_transformers(str(path), device="cpu", hf_model=hf)


def _ways(path: Path) -> dict[str, Callable[[], gna.Model]]:
    return {
        "folder": lambda: gna.load_model(path, device="cpu"),
        "hf object": lambda: gna.load_model(*_hf(path)),
        "hf object + device": lambda: gna.load_model(*_hf(path), device="cpu"),
        "user bridge": lambda: gna.load_model(_user_bridge(path, True)),
        "user bridge, no tokenizer": lambda: gna.load_model(_user_bridge(path, False)),
    }


def _compare(models: dict[str, gna.Model], plain_ids: list[list[int]], task: Any, heads: Any = None) -> float:
    """Assert that every model tokenises as ``plain_ids``, gives the first's logits and scan; return max |Δ logits|."""
    ref_name, ref = next(iter(models.items()))
    want_logits = ref.forward(TEXTS)
    want_scan = gna.scan_heads(ref, task, heads, strategy="exact", progress=False).to_frame()
    worst = 0.0
    for name, m in models.items():
        for text, ids in zip(TEXTS, plain_ids):
            assert m.tokenize(text).ids[0].tolist() == ids, f"{name} tokenises {text!r} otherwise"
        got = m.forward(TEXTS)
        assert got.shape == want_logits.shape, f"{name}: {tuple(got.shape)} vs {ref_name}: {tuple(want_logits.shape)}"
        worst = max(worst, float((got - want_logits).abs().max()))
        torch.testing.assert_close(got, want_logits, atol=TOL, rtol=0, msg=f"{name} vs {ref_name}")
        scan = gna.scan_heads(m, task, heads, strategy="exact", progress=False).to_frame()
        assert list(scan["name"]) == list(want_scan["name"])
        for col in ("baseline", "ablated", "drop"):
            if col in want_scan:
                torch.testing.assert_close(torch.tensor(scan[col].to_numpy(), dtype=torch.float64),
                                           torch.tensor(want_scan[col].to_numpy(), dtype=torch.float64),
                                           atol=TOL, rtol=0, msg=f"{name} scan {col} vs {ref_name}")
    return worst


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_every_loader_gives_the_same_tokens_logits_and_scan(family: str, tmp_path: Path) -> None:
    config, cls, adds_bos = _configs()[family]
    path = save_tiny(config, cls, _tokenizer(adds_bos), tmp_path / family)
    plain = _hf(path)[1]
    plain_ids = [plain(t)["input_ids"] for t in TEXTS]
    assert (plain_ids[0][0] == plain.bos_token_id) == adds_bos  # the checkpoint's own policy, both ways
    models = {name: load() for name, load in _ways(path).items()}
    task = gna.KVRetrieval(n_pairs=3, n_samples=4, max_value=9, seed=0)
    worst = _compare(models, plain_ids, task)
    print(f"{family}: max |d logits| over {len(models)} loaders = {worst:.2e}")


def test_a_gna_models_own_bridge_is_refused(tmp_path: Path) -> None:
    config, cls, _ = _configs()["llama"]
    path = save_tiny(config, cls, byte_tokenizer(), tmp_path / "llama")
    for m in (gna.load_model(path, device="cpu"), gna.load_model(*_hf(path))):
        with pytest.raises(InputError, match="already belongs to a gna_interp Model.*use that Model itself"):
            gna.load_model(m.bridge)


@pytest.mark.smollm2
def test_smollm2_gguf_agrees_with_its_hf_object_and_a_user_bridge(smollm2: gna.Model) -> None:
    from gna_interp.models import loading, smollm2_gguf_path

    folder = loading.convert_gguf(smollm2_gguf_path())  # the cached conversion the spec loads
    models = {"gguf spec": smollm2, "hf object": gna.load_model(*_hf(folder)),
              "user bridge": gna.load_model(_user_bridge(folder, True))}
    plain = _hf(folder)[1]
    task = gna.KVRetrieval(n_pairs=3, n_samples=2, max_value=9, seed=0)
    worst = _compare(models, [plain(t)["input_ids"] for t in TEXTS], task, heads="L16H0")
    print(f"smollm2 gguf: max |d logits| over {len(models)} loaders = {worst:.2e}")
