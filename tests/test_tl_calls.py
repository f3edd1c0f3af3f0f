"""The TransformerLens-style calls of a Model (to_tokens, model(...), run_with_hooks, run_with_cache, generate) take
what TransformerLens documents and refuse anything else with a GnaError naming the argument, before any forward."""

from __future__ import annotations

import pytest
import torch

import gna_interp
from gna_interp.errors import InputError, OptionError
from gna_interp.models import zoo_names
from gna_interp.models.model import Model, TokenBatch

pytestmark = pytest.mark.skipif("transformer-kv" not in zoo_names(), reason="the zoo Transformer is not installed")


@pytest.fixture(scope="module")
def m() -> Model:
    return gna_interp.load_model("zoo:transformer-kv")


@pytest.fixture(scope="module")
def texts(m: Model) -> list[str]:
    """Two prompts of different lengths (a batch of them is padded)."""
    a, b, c = m.kv_words[:3]
    return [f"{a}:12\n{b}:7\n{c}:3\n{a}:", f"{b}:5\n{b}:"]


from made_up import no_forward  # noqa: E402


def refused(m: Model, call, match: str, error: type[Exception] = InputError) -> None:
    with no_forward(m), pytest.raises(error, match=match):
        call()


# ---- tokens -----------------------------------------------------------------------------------------------------


def test_prepend_bos_and_padding_side_take_only_their_values(m, texts):
    for call in (lambda: m.to_tokens(texts[0], prepend_bos="False"), lambda: m(texts[0], prepend_bos="False"),
                 lambda: m.run_with_cache(texts[0], prepend_bos=1),
                 lambda: m.to_str_tokens(texts[0], prepend_bos="no")):
        refused(m, call, r"prepend_bos must be True, False or None, got .*pass the bool itself")
    for call in (lambda: m.to_tokens(texts, padding_side="middle"), lambda: m(texts, padding_side="LEFT"),
                 lambda: m.run_with_hooks(texts, padding_side=0)):
        refused(m, call, r"padding_side must be 'left', 'right' or None \(left\), got .*pass padding_side=")
    assert m.to_tokens(texts[0], prepend_bos=False).tolist() == m.to_tokens(texts[0]).tolist()  # no BOS added


def test_truncate_keeps_the_first_n_ctx_tokens(m, texts):
    long = texts[0] * (m.n_ctx // 4)
    full = m.tokenizer(long)["input_ids"]
    assert len(full) > m.n_ctx
    refused(m, lambda: m.to_tokens(long), "context of 512 tokens")
    cut = m.to_tokens([long, texts[1]], truncate=True)
    assert cut.shape == (2, m.n_ctx) and cut[0].tolist() == full[:m.n_ctx]
    assert cut[1, -len(m.tokenizer(texts[1])["input_ids"]):].tolist() == m.to_tokens(texts[1])[0].tolist()
    assert torch.equal(m.to_tokens(texts, truncate=True), m.to_tokens(texts))  # nothing to cut: the same ids
    refused(m, lambda: m.to_tokens(long, truncate="yes"), "truncate must be True or False, got 'yes'")


def test_an_unknown_piece_is_named_with_its_whitespace(m):
    word = m.kv_words[0]
    refused(m, lambda: m.to_tokens(f" {word}"),
            rf"\[' {word}'\] \(' {word}' is no token but '{word}' is: the ' ' before it is what fails; remove it\)")
    assert m.to_tokens(word).shape == (1, 1)
    refused(m, lambda: m.to_tokens(f"{word}\tzzz"), r"\['\\t', 'zzz'\]")


# ---- the loss ---------------------------------------------------------------------------------------------------


def test_a_loss_needs_two_tokens_in_every_row(m, texts):
    one = m.to_tokens(m.kv_words[0])
    for call in (lambda: m(one, return_type="loss"), lambda: m.run_with_hooks(one, return_type="both"),
                 lambda: m.run_with_cache(one, return_type="loss")):
        refused(m, call, r"return_type='(loss|both)' .* needs at least 2 tokens per row; the input has 1")
    refused(m, lambda: m([texts[0], m.kv_words[0]], return_type="loss"), "row 1 has 1")
    assert m(one).shape == (1, 1, m.d_vocab)  # the logits of one token are fine
    ids = m.to_tokens(texts[1])
    n = ids.shape[1]
    packed = TokenBatch(ids, torch.ones_like(ids), torch.ones(1, n, n, dtype=torch.bool).tril(), torch.arange(n)[None])
    for call in (lambda: m(packed, return_type="loss"), lambda: m.run_with_cache(packed, return_type="both")):
        refused(m, call, r"a packed batch \(a tree mask\) holds several continuations per row")


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_loss_is_the_per_prompt_loss_everywhere(m, texts, side):
    """model(...), run_with_hooks and run_with_cache give one loss for a padded batch: the mean over every predicted
    token of both prompts, the padding left out (TransformerLens's loss with an attention mask)."""
    per, n = [], []
    for t in texts:
        per.append(m(t, return_type="loss"))
        n.append(m.to_tokens(t).shape[1] - 1)
    want = sum(loss * k for loss, k in zip(per, n)) / sum(n)
    got = [m(texts, return_type="loss", padding_side=side),
           m.run_with_hooks(texts, return_type="loss", padding_side=side),
           m.run_with_cache(texts, return_type="loss", padding_side=side, names_filter="blocks.0.hook_out")[0]]
    batch = m.tokenize(texts, padding_side=side)
    got.append(m(batch.ids, return_type="loss", attention_mask=batch.attention_mask))
    for loss in got:
        assert loss.dim() == 0 and torch.isclose(loss, want, atol=1e-5), (loss, want)
    per_token = m(texts, return_type="loss", loss_per_token=True, padding_side=side)
    assert per_token.shape == (2, batch.ids.shape[1] - 1)


# ---- keywords ---------------------------------------------------------------------------------------------------


def test_unknown_keywords_are_refused_by_name(m, texts):
    ids = m.to_tokens(texts[0])
    for call, where in ((lambda: m.run_with_cache(texts[0], bogus=1), "run_with_cache"),
                        (lambda: m.run_with_hooks(ids, bogus=1), "run_with_hooks"),
                        (lambda: m.run(ids, bogus=1), "run")):
        refused(m, call, rf"{where} takes no keyword 'bogus' \(got bogus=1\)\. It takes .*model\.bridge", OptionError)
    refused(m, lambda: m.run_with_cache(ids, names_filtr="x"), "did you mean 'names_filter'", OptionError)
    refused(m, lambda: m.run_with_hooks(ids, start_at_layer=1), "start_at_layer", OptionError)
    refused(m, lambda: m.run_with_hooks(ids, reset_hooks_end=False), r"reset_hooks_end=False: a Model keeps no hook")
    refused(m, lambda: m.run_with_cache(ids, incl_bwd=True), r"incl_bwd=True .* return_type='loss'")
    refused(m, lambda: m.run_with_hooks(ids, clear_contexts="yes"), "clear_contexts must be True or False")


def test_the_transformerlens_keywords_that_are_taken_work(m, texts):
    ids = m.to_tokens(texts[0])
    resid, cache = m.run_with_cache(ids, stop_at_layer=1, names_filter=("blocks.0.hook_out", "blocks.1.hook_out"))
    assert resid.shape == (1, ids.shape[1], m.cfg.d_model) and list(cache.keys()) == ["blocks.0.hook_out"]
    _, full = m.run_with_cache(ids, names_filter="blocks.0.hook_out", remove_batch_dim=True, reset_hooks_end=True,
                               clear_contexts=True)
    assert full["blocks.0.hook_out"].shape == (ids.shape[1], m.cfg.d_model)
    _, last = m.run_with_cache(ids, names_filter="blocks.0.hook_out", pos_slice=-1, return_cache_object=False)
    assert isinstance(last, dict) and torch.equal(last["blocks.0.hook_out"][0], full["blocks.0.hook_out"][-1:])
    shapes = []
    out = m.run_with_hooks(ids, fwd_hooks=[("blocks.0.hook_out", lambda x, hook: shapes.append(x.shape))],
                           remove_batch_dim=True, stop_at_layer=1, clear_contexts=True, use_cache=False)
    assert shapes == [(ids.shape[1], m.cfg.d_model)] and out.shape == (1, ids.shape[1], m.cfg.d_model)
    loss, cache = m.run_with_cache(texts, return_type="loss", incl_bwd=True, names_filter="blocks.1.hook_out")
    assert cache["blocks.1.hook_out_grad"].shape == cache["blocks.1.hook_out"].shape
    m.hf_model.zero_grad(set_to_none=True)


def test_names_filter_takes_what_transformerlens_takes(m, texts):
    for bad in (42, [1, 2], {"blocks.0.hook_out"}):
        refused(m, lambda: m.run_with_cache(texts[0], names_filter=bad),
                r"names_filter must be None, a hook name, a list of hook names or a function name -> bool, got")
    refused(m, lambda: m.run_with_cache(texts[0], names_filter="blocks.0.hook_ot"),
            r"'blocks.0.hook_ot', which is no hook of this model \(did you mean 'blocks.0.hook_out'\?\)")
    for ok in ("blocks.0.hook_out", ["blocks.0.hook_out"], lambda n: n == "blocks.0.hook_out"):
        assert list(m.run_with_cache(texts[0], names_filter=ok)[1].keys()) == ["blocks.0.hook_out"]


# ---- backward hooks ---------------------------------------------------------------------------------------------


def test_backward_hooks_get_the_gradient_at_backward(m, texts):
    name = "blocks.0.hook_out"
    kept, grads = [], []
    loss = m.run_with_hooks(texts, fwd_hooks=[(name, lambda x, hook: kept.append(x))],
                            bwd_hooks=[(name, lambda g, hook: grads.append((g.clone(), hook.name)))],
                            return_type="loss")
    assert loss.requires_grad and not grads  # nothing is called before backward()
    (want,) = torch.autograd.grad(loss, kept[0], retain_graph=True)
    grads.clear()
    loss.backward()
    m.hf_model.zero_grad(set_to_none=True)
    assert len(grads) == 1 and grads[0][1] == name and torch.allclose(grads[0][0], want, atol=1e-6)
    assert not m(texts).requires_grad and len(grads) == 1  # the hooks left with the run
    refused(m, lambda: m.run_with_hooks(texts, bwd_hooks=[name]), "bwd_hooks must be a list of")


def test_a_backward_hook_may_replace_the_gradient(m, texts):
    kept = []
    loss = m.run_with_hooks(texts[0], fwd_hooks=[("hook_embed", lambda x, hook: kept.append(x))],
                            bwd_hooks=[("blocks.0.hook_out", lambda g, hook: torch.zeros_like(g))],
                            return_type="loss")
    (through,) = torch.autograd.grad(loss, kept[0])
    plain = m.run_with_hooks(texts[0], fwd_hooks=[("hook_embed", lambda x, hook: kept.append(x))],
                             bwd_hooks=[("blocks.1.hook_out", lambda g, hook: None)], return_type="loss")
    (direct,) = torch.autograd.grad(plain, kept[1])
    assert int(torch.count_nonzero(through)) == 0 and int(torch.count_nonzero(direct)) > 0  # all of it passes there


# ---- token id tensors -------------------------------------------------------------------------------------------


def test_any_integer_dtype_is_taken_and_floats_are_refused(m, texts):
    ids = m.to_tokens(texts[0])
    want = m(ids)
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32):
        small = ids.to(dtype)
        assert torch.equal(m(small), want) and torch.equal(m.run_with_hooks(small), want)
        assert torch.equal(m.run_with_cache(small, names_filter="blocks.0.hook_out")[0], want)
        assert torch.equal(m(TokenBatch(small, torch.ones_like(ids))), want)
    for call in (lambda: m(ids.float()), lambda: m.run_with_cache(ids.double()), lambda: m.run_with_hooks(ids.half())):
        refused(m, call, r"token ids must be an integer tensor .* got torch.float\d+ .*pass integer ids")
    outside = torch.tensor([[3, m.d_vocab + 2]], dtype=torch.int16)
    for call in (lambda: m(outside), lambda: m.run_with_hooks(outside), lambda: m.run_with_cache(outside),
                 lambda: m(TokenBatch(outside, torch.ones_like(outside)))):
        refused(m, call, rf"token ids \[{m.d_vocab + 2}\] are outside the vocabulary")


# ---- generate ---------------------------------------------------------------------------------------------------


def test_generate_returns_the_prompt_and_its_continuation(m, texts):
    prompt = texts[0]
    ids = m.to_tokens(prompt)
    new = []
    for _ in range(3):
        nxt = int(m(ids)[0, -1].argmax())
        new.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    assert m.generate(prompt, max_new_tokens=3) == prompt + m.tokenizer.decode(new, skip_special_tokens=True)
    theirs = m.bridge.generate(prompt, max_new_tokens=3, do_sample=False, prepend_bos=False, verbose=False)
    assert theirs == m.tokenizer.decode(ids[0].tolist(), skip_special_tokens=True)  # TL: prompt and continuation
    assert m.generate(prompt, max_new_tokens=0) == prompt


def test_generate_refuses_what_it_cannot_do_up_front(m, texts):
    n = m.to_tokens(texts[0]).shape[1]
    refused(m, lambda: m.generate(texts[0], max_new_tokens=-1), r"max_new_tokens must be >= 0, got -1")
    refused(m, lambda: m.generate(texts[0], max_new_tokens=2.5), r"max_new_tokens must be a whole number")
    refused(m, lambda: m.generate(texts[0], max_new_tokens=10 ** 9),
            rf"the prompt is {n} tokens and max_new_tokens=1000000000: together they exceed .* context of 512 "
            rf"tokens; the largest max_new_tokens for this prompt is {m.n_ctx - n}")
