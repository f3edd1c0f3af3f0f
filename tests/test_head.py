"""The blockwise head (``engine.head``): log-probabilities at the reads from vocabulary blocks equal the full
``log_softmax`` of the model's own logits, across block boundaries and with shared read positions; a head the
blocks cannot reproduce is read in full."""

from __future__ import annotations

import pytest
import torch

from gna_interp import load_model
from gna_interp.engine import head as head_mod
from gna_interp.engine.head import head_logprobs


def _reads(model, n_tokens: int = 40):
    """Residual stream entering the final norm at every position of two prompts, the HF model's own log-probs there,
    and reads: 3 tokens per position (first, last and one inside the vocabulary), read positions shared."""
    batch = model.tokenize(["The value of the key 'river' is", "Memorize the following dictionary: a:1 b:2"])
    with torch.no_grad():
        out = model.hf_model(batch.ids, attention_mask=batch.attention_mask, output_hidden_states=True)
    _, cache = model.run_with_cache(batch, names_filter=lambda n: n == model.FINAL_NORM_INPUT)
    resid = cache[model.FINAL_NORM_INPUT].reshape(-1, cache[model.FINAL_NORM_INPUT].shape[-1])
    want = torch.log_softmax(out.logits.float(), -1).reshape(resid.shape[0], -1)
    vocab = want.shape[-1]
    at = torch.arange(resid.shape[0]).repeat_interleave(3)
    tokens = torch.stack([torch.zeros(resid.shape[0], dtype=torch.long), torch.full((resid.shape[0],), vocab - 1),
                          torch.randint(0, vocab, (resid.shape[0],), generator=torch.Generator().manual_seed(0))], 1
                         ).reshape(-1)
    return resid, tokens, at, want[at, tokens]


@pytest.mark.parametrize("block", [7, 64, 100_000])
def test_blockwise_log_probs_equal_the_full_head(tiny_dirs, monkeypatch, block):
    model = load_model(tiny_dirs["llama"], device="cpu")
    monkeypatch.setitem(head_mod.VOCAB_BLOCK, "cpu", block)  # blocks that split the tiny vocabulary unevenly
    resid, tokens, at, want = _reads(model)
    got = head_logprobs(model, resid, tokens, at)
    assert head_mod._BLOCKWISE[model] is True
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    # without ``inverse``: one read per row
    torch.testing.assert_close(head_logprobs(model, resid[at], tokens), want, atol=2e-6, rtol=0)
    assert head_logprobs(model, resid[:0], tokens[:0]).shape == (0,)


def test_a_head_the_blocks_do_not_reproduce_is_read_in_full(tiny_dirs, monkeypatch):
    """An output transform that mixes the vocabulary (here: reversing it) cannot run block by block: the once-per-model
    check sees it and the reads come from the full logits, still equal to the forward's."""
    model = load_model(tiny_dirs["llama"], device="cpu")
    monkeypatch.setitem(head_mod.VOCAB_BLOCK, "cpu", 16)
    monkeypatch.setattr(model.bridge.adapter, "apply_output_logits_transform", lambda x: 3.0 * x.flip(-1),
                        raising=False)
    resid, tokens, at, _ = _reads(model)
    want = torch.log_softmax(model.unembed(resid[None])[0].float(), -1)[at, tokens]
    assert not torch.allclose(head_mod._blockwise(model, resid, tokens, at), want, atol=1e-3)
    got = head_logprobs(model, resid, tokens, at)
    assert head_mod._BLOCKWISE[model] is False
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
