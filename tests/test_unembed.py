"""The blockwise head (``engine.unembed``): log-probabilities at the reads from vocabulary blocks equal the full
``log_softmax`` of the model's own logits, across block boundaries, with shared read positions and with the rows
taken a few at a time; a head the blocks cannot reproduce is read in full, a few rows at a time too."""

from __future__ import annotations

import pytest
import torch

from gna_interp import load_model
from gna_interp.engine import unembed as head_mod
from gna_interp.engine.unembed import head_logprobs, output_head


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


@pytest.mark.parametrize("block, values", [(7, 7 * 5), (64, 1 << 24), (100_000, 1)])
def test_blockwise_log_probs_equal_the_full_head(tiny_dirs, monkeypatch, block, values):
    """``values`` bounds the logits alive at once: 5 rows a piece, all rows in one piece, one row a piece."""
    model = load_model(tiny_dirs["llama"], device="cpu")
    monkeypatch.setitem(head_mod.VOCAB_BLOCK, "cpu", block)  # blocks that split the tiny vocabulary unevenly
    monkeypatch.setitem(head_mod.HEAD_VALUES, "cpu", values)
    resid, tokens, at, want = _reads(model)
    head = output_head(model)
    got = head_logprobs(head, resid, tokens, at)
    assert head.blockwise is True and output_head(model) is head
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    # without ``inverse``: one read per row
    torch.testing.assert_close(head_logprobs(head, resid[at], tokens), want, atol=2e-6, rtol=0)
    assert head_logprobs(head, resid[:0], tokens[:0]).shape == (0,)


def test_a_head_the_blocks_do_not_reproduce_is_read_in_full(tiny_dirs, monkeypatch):
    """An output transform that mixes the vocabulary (here: reversing it) cannot run block by block: the once-per-model
    check sees it and the reads come from the full logits, still equal to the forward's."""
    model = load_model(tiny_dirs["llama"], device="cpu")
    monkeypatch.setitem(head_mod.VOCAB_BLOCK, "cpu", 16)
    monkeypatch.setitem(head_mod.HEAD_VALUES, "cpu", 3 * model.d_vocab)  # the full logits of 3 rows at a time
    monkeypatch.setattr(model.bridge.adapter, "apply_output_logits_transform", lambda x: 3.0 * x.flip(-1),
                        raising=False)
    resid, tokens, at, _ = _reads(model)
    want = torch.log_softmax(model.unembed(resid[None])[0].float(), -1)[at, tokens]
    head = output_head(model)
    blocks = head_mod._blockwise(model.final_norm(resid[None])[0], *head.output_layer(), model.output_transform,
                                 tokens, at)
    assert not torch.allclose(blocks, want, atol=1e-3)
    got = head_logprobs(head, resid, tokens, at)
    assert head.blockwise is False
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)


def _plain_grad(model, resid, tokens, at, weights):
    """Value and gradient of ``Σ weights · log p(tokens)`` through the full logits (the plain computation)."""
    x = resid.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(model.unembed(x[None])[0].float(), -1)[at, tokens]
    (g,) = torch.autograd.grad((logp * weights).sum(), x)
    return logp.detach(), g


@pytest.mark.parametrize("block, values", [(7, 7 * 5), (64, 1 << 24), (100_000, 1)])
@pytest.mark.parametrize("softcap", [False, True])
def test_blockwise_gradient_equals_the_full_heads(tiny_dirs, monkeypatch, block, values, softcap):
    """The differentiable head (:func:`head_logprobs_grad`) gives the full head's log-probabilities and their gradient
    with respect to the residual stream (through the final norm), with and without an elementwise output transform
    (a Gemma-2-style soft-cap), the rows taken whole or a few at a time."""
    from gna_interp.engine.unembed import head_logprobs_grad

    model = load_model(tiny_dirs["llama"], device="cpu")
    monkeypatch.setitem(head_mod.VOCAB_BLOCK, "cpu", block)
    monkeypatch.setitem(head_mod.HEAD_VALUES, "cpu", values)
    if softcap:
        monkeypatch.setattr(model.bridge.adapter, "apply_output_logits_transform",
                            lambda x: 0.5 * torch.tanh(x / 0.5), raising=False)
    resid, tokens, at, _ = _reads(model)
    weights = torch.linspace(-1.0, 2.0, tokens.shape[0])
    want, want_grad = _plain_grad(model, resid, tokens, at, weights)
    x = resid.detach().clone().requires_grad_(True)
    head = output_head(model)
    got = head_logprobs_grad(head, x, tokens, at)
    assert head.blockwise is True
    (grad,) = torch.autograd.grad((got * weights).sum(), x)
    torch.testing.assert_close(got.detach(), want, atol=2e-6, rtol=0)
    torch.testing.assert_close(grad, want_grad, atol=1e-5, rtol=1e-4)


def test_the_forward_stops_at_the_final_norm(tiny_dirs):
    """``Model.final_residual`` returns what enters the final norm (the bridge's ``ln_final.hook_in``), with the
    forward's hooks applied and the output layer never run."""
    model = load_model(tiny_dirs["llama"], device="cpu")
    batch = model.tokenize(["The value of the key 'river' is", "a:1 b:2"])
    _, cache = model.run_with_cache(batch, names_filter=lambda n: n == model.FINAL_NORM_INPUT)
    calls = []
    handle = model.hf_model.get_output_embeddings().register_forward_hook(lambda *a: calls.append(1))
    try:
        got = model.final_residual(batch)
    finally:
        handle.remove()
    assert calls == []
    torch.testing.assert_close(got, cache[model.FINAL_NORM_INPUT], atol=0, rtol=0)
    zero = model.final_residual(batch, [(model.block_output_hook(model.n_layers - 1), lambda x, hook: x * 0)])
    assert float(zero.abs().max()) == 0.0


def test_the_blockwise_loop_does_not_grow_the_heap_once_the_mmap_threshold_is_pinned():
    """A loop that makes one large temporary per vocabulary block and keeps a small row of each (the blockwise head's
    shape) stays within a few blocks of memory in a process whose mmap threshold is pinned (what ``gna`` does)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import resource, torch
        from gna_interp.allocator import pin_mmap_threshold
        assert pin_mmap_threshold()
        torch.set_num_threads(1)
        x, w = torch.randn(1500, 16), torch.randn(96 * 2048, 16)
        torch.logsumexp(x @ w[:2048].T, -1)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kept = [torch.logsumexp(x @ w[k:k + 2048].T, -1) for k in range(0, w.shape[0], 2048)]
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    if not sys.platform.startswith("linux"):
        pytest.skip("the mmap threshold is glibc's")
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert got.returncode == 0, got.stderr
    grown_mb = int(got.stdout.split()[-1])
    assert grown_mb < 100, f"the heap grew by {grown_mb} MB over 96 blocks of 12 MB"
