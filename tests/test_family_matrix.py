"""The family matrix: every causal-LM family of ``tests/family_matrix.py``, built tiny with
``from_config``, saved and loaded with ``load_model``, checked against computations that bypass gna_interp:
logits against the plain Hugging Face forward, head lists against the config, patterns (attention rows; SSM
implicit attention reproducing the mixer's output), ablation against zeroing the head's input columns of the
output projection in a copy of the Hugging Face model, exact scans against the naive loop, and a KV task.
The page ``docs/family_matrix.md`` is generated from the same list and must equal what it writes."""

from __future__ import annotations

import copy
import inspect
import math
import re
import warnings
from collections import Counter
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import transformers

import gna_interp as gna
from gna_interp.errors import UnsupportedArchitectureError
from gna_interp.models.loading import quiet_transformers
from gna_interp.models.ssm import layer_terms
from gna_interp.models.ssm_kernel import mixer_output
from family_matrix import CHECKS, FAMILIES, NOT_IN_MATRIX, PAGE, Family, bridge_causal_lms, render

PROMPT = "Memorize the following dictionary:\nscallops:84\nriver:7\nThe value of the key 'river' is"
SSM_KINDS = ("ssm1", "ssm2")


def _for(check: str) -> list:
    return [pytest.param(f, id=f.key) for f in FAMILIES if check in f.checks]


class Built:
    """One family: its folder, the gna_interp model and a plain Hugging Face model of the same folder."""

    def __init__(self, fam: Family, root) -> None:
        self.fam = fam
        self.dir = fam.build(root / fam.key)
        self.model = gna.load_model(self.dir, device="cpu")
        with quiet_transformers():
            self.hf = getattr(transformers, fam.cls).from_pretrained(self.dir, attn_implementation="eager").eval()
        self.batch = self.model.tokenize(PROMPT)
        self.layout = fam.layout(self.hf.config)

    def hf_logits(self, hf: torch.nn.Module | None = None) -> torch.Tensor:
        with torch.no_grad():
            return (hf or self.hf)(self.batch.ids, attention_mask=self.batch.attention_mask).logits.float()

    def sample_heads(self) -> list[gna.HeadRef]:
        """Per kind: head 1 of its first layer and the last head of its last layer."""
        out = []
        for kind in sorted({k for _, k in self.layout}):
            layers = sorted(l for l, k in self.layout if k == kind)
            first, last = layers[0], layers[-1]
            out.append(gna.HeadRef(first, min(1, self.layout[(first, kind)][0] - 1), kind))
            out.append(gna.HeadRef(last, self.layout[(last, kind)][0] - 1, kind))
        return list(dict.fromkeys(out))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache: dict[str, Built] = {}
    root = tmp_path_factory.mktemp("family_matrix")

    def get(fam: Family) -> Built:
        if fam.key not in cache:
            cache[fam.key] = Built(fam, root)
        return cache[fam.key]

    return get


def _module(hf: torch.nn.Module, fam: Family, kind: str, layer: int) -> torch.nn.Module:
    for path in fam.proj[kind]:
        try:
            return hf.get_submodule(path.format(l=layer))
        except AttributeError:
            continue
    raise AssertionError(f"{fam.key}: no output projection of kind {kind} in layer {layer} at {fam.proj[kind]}")


def _zero_columns(proj: torch.nn.Module, cols: slice) -> None:
    """Zero the input columns ``cols`` of a Linear (weight ``[out, in]``) or a GPT-2 Conv1D (``[in, out]``)."""
    with torch.no_grad():
        if isinstance(proj, torch.nn.Linear):
            proj.weight[:, cols] = 0
        elif type(proj).__name__ == "Conv1D":
            proj.weight[cols, :] = 0
        else:
            raise AssertionError(f"unknown projection type {type(proj).__name__}")


@contextmanager
def _zero_at_depth(proj: torch.nn.Module, layer_module: torch.nn.Module, cols: slice):
    """Zero ``cols`` of ``proj``'s input only while ``layer_module`` runs (a projection shared by several depths)."""
    active = [False]

    def enter(*_):
        active[0] = True

    def leave(*_):
        active[0] = False

    def zero(_mod, args):
        if active[0]:
            x = args[0].clone()
            x[..., cols] = 0
            return (x,) + tuple(args[1:])
        return None

    handles = [layer_module.register_forward_pre_hook(enter), layer_module.register_forward_hook(leave),
               proj.register_forward_pre_hook(zero)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# ---- the checks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", _for("logits"))
def test_load_and_logits_equal_hugging_face(fam, built):
    b = built(fam)
    assert b.model.architecture == fam.cls
    ref = b.hf_logits()
    got = b.model.forward(b.batch)
    assert got.shape == ref.shape
    err = (got - ref).abs().max().item()
    assert err <= 1e-5 * max(1.0, ref.abs().max().item()), (fam.key, err)
    # the scorer's forward skips the unembedding and unembeds the read positions alone: the same logits there
    rows, pos = torch.tensor([0, 0, 0]), torch.tensor([0, ref.shape[1] // 2, ref.shape[1] - 1])
    read = b.model.read_logits(b.batch, rows, pos)
    err = (read - ref[rows, pos]).abs().max().item()
    assert err <= 1e-5 * max(1.0, ref.abs().max().item()), (fam.key, "read_logits", err)


@pytest.mark.parametrize("fam", [f for f in _for("scan") if f.values[0].replays])
def test_blockwise_head_log_probs_equal_hugging_face(fam, built, monkeypatch):
    """Where the scan replays blocks, the replays' head (``engine.unembed``: the unembedding in vocabulary blocks, here of 7 rows) gives the plain
    Hugging Face forward's log-probabilities at every position, blockwise or -- where its once-per-model check
    refuses the blocks -- from the full logits."""
    from gna_interp.engine import unembed as head_mod

    b = built(fam)
    monkeypatch.setitem(head_mod.VOCAB_BLOCK, "cpu", 7)
    monkeypatch.delitem(b.model.facts, head_mod.HEAD, raising=False)
    want = torch.log_softmax(b.hf_logits()[0], -1)
    _, cache = b.model.run_with_cache(b.batch, names_filter=lambda n: n == b.model.FINAL_NORM_INPUT)
    resid = cache[b.model.FINAL_NORM_INPUT][0]
    at = torch.arange(resid.shape[0]).repeat_interleave(2)
    tokens = torch.stack([b.batch.ids[0], torch.full_like(b.batch.ids[0], want.shape[-1] - 1)], 1).reshape(-1)
    head = head_mod.output_head(b.model)
    got = head_mod.head_logprobs(head, resid, tokens, at)
    err = (got - want[at, tokens]).abs().max().item()
    assert err <= 1e-5 * max(1.0, b.hf_logits().abs().max().item()), (fam.key, head.blockwise, err)
    monkeypatch.delitem(b.model.facts, head_mod.HEAD)


def _hf_twin(b: Built, path: str) -> torch.nn.Module:
    """The module of ``b.hf`` (the plain Hugging Face model) at the place of bridge component ``path``."""
    names = {id(m): n.replace("._original_component", "") for n, m in b.model.hf_model.named_modules()}
    return b.hf.get_submodule(names[id(b.model.hf_module(path))])


_MLPS = ("mlp", "shared_mlp", "block_sparse_moe", "feed_forward", "fc2", "per_layer_projection")  # the channel mixers of HF decoder layers


def _silenced(module: torch.nn.Module) -> Any:
    """A forward hook under which an MLP adds nothing: zeros, or the residual it was handed (BLOOM's MLP adds its
    own residual)."""
    names = list(inspect.signature(module.forward).parameters)

    def hook(m, args, kwargs, out):
        if "residual" in names:
            i = names.index("residual")
            return kwargs["residual"] if "residual" in kwargs else args[i]
        return (torch.zeros_like(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else torch.zeros_like(out)

    return hook


def _hf_write(b: Built, ids: torch.Tensor, kwargs: dict, sender: gna.HeadRef) -> torch.Tensor:
    """What ``sender`` adds to the stream, from the plain HF model: its layer's output with every MLP silenced,
    minus the same with the sender's input columns of its output projection zeroed."""
    layer = _hf_twin(b, f"blocks.{sender.layer}")
    mlps = [c for n, c in layer.named_children() if n in _MLPS]
    proj = _module(b.hf, b.fam, sender.kind, sender.layer)
    cols = b.model.head_site(sender).columns
    outs = []
    for remove in (False, True):
        got = {}

        def zero_cols(m, a):
            x = a[0].clone()
            x[..., cols] = 0
            return (x,) + tuple(a[1:])

        def keep(m, a, o):
            got["x"] = (o[0] if isinstance(o, tuple) else o).clone()

        handles = [layer.register_forward_hook(keep)]
        handles += [c.register_forward_hook(_silenced(c), with_kwargs=True) for c in mlps]
        handles += [proj.register_forward_pre_hook(zero_cols)] if remove else []
        try:
            with torch.no_grad():
                b.hf(ids, **kwargs)
        finally:
            for h in handles:
                h.remove()
        outs.append(got["x"])
    return outs[0] - outs[1]


def _path_edges(b: Built) -> tuple[gna.HeadRef, list[gna.HeadRef]]:
    """A head of the first layer, and the later sampled heads that may receive (Mamba-1 channels cannot)."""
    heads = sorted(b.sample_heads(), key=lambda h: (h.layer, h.kind, h.head))
    return heads[0], [h for h in heads if h.layer > heads[0].layer and h.kind != "ssm1"]


def _receives(fam: Family) -> bool:
    return "paths" in fam.checks


@pytest.mark.parametrize("fam", _for("paths") + [pytest.param(f, id=f.key) for f in FAMILIES
                                                  if any(c == "paths" for c, _ in f.limits)])
def test_path_patching_equals_hugging_face(fam, built):
    """A sender's direct path to the logits, against the plain HF forward with its write (measured in HF with the
    MLPs silenced) taken off the last layer's output; edges into a later head's key and value inputs run (where the
    family's heads can receive them: else :func:`test_limits_are_reported` asserts the refusal)."""
    from gna_interp.circuits.edges.paths import Edge, PathPatcher
    from gna_interp.engine.unembed import read_logprobs

    b = built(fam)
    task = gna.KVRetrieval(n_pairs=3, n_samples=2, seed=1, max_value=9)
    pp = PathPatcher(b.model, task, batch_size=1)
    sender, later = _path_edges(b)
    last = _hf_twin(b, f"blocks.{b.model.n_layers - 1}")
    worst, moved = 0.0, 0.0
    for i, chunk in enumerate(pp.chunks[:2]):
        ids, kwargs = chunk.batch.ids, b.model._forward_kwargs(chunk.batch)
        write = _hf_write(b, ids, kwargs, sender)

        def off(m, a, o):
            return (o[0] - write,) + tuple(o[1:]) if isinstance(o, tuple) else o - write

        handle = last.register_forward_hook(off)
        try:
            with torch.no_grad():
                logits = b.hf(ids, **kwargs).logits
        finally:
            handle.remove()
        with torch.no_grad():
            intact = b.hf(ids, **kwargs).logits
        want = read_logprobs(logits[chunk.read_row, chunk.read_pos].float(), chunk.read_tok)
        got = pp._run_chunk(i, [[Edge(sender, None)]])[0]
        worst = max(worst, float((got - want).abs().max()))
        moved = max(moved, float((want - read_logprobs(intact[chunk.read_row, chunk.read_pos].float(),
                                                       chunk.read_tok)).abs().max()))
    assert moved > 1e-4, (fam.key, sender.name, moved)  # the write matters: the check could not pass without it
    assert worst <= 1e-5 * max(1.0, b.hf_logits().abs().max().item()), (fam.key, sender.name, worst)
    if _receives(fam) and later:
        edges = [Edge(sender, later[-1], inp, "all") for inp in ("k", "v")]
        effects = gna.path_effects(b.model, task, [[e] for e in edges] + [[Edge(sender, None)]], patcher=pp).effects()
        assert all(math.isfinite(e) for e in effects), (fam.key, effects)


@pytest.mark.parametrize("fam", [p for p in _for("kv") if "sliding_window" in p.values[0].config])
def test_sliding_window_families_pack_rows_shorter_than_the_window(fam, built, tmp_path):
    """A sliding-window family is packed (one tree-masked sequence a sample) only when every row is shorter than its
    window: built with a window of 4,096, packed scores equal the unpacked rows'; with the matrix's window of 16 (the
    KV rows are longer) the rows stay unpacked."""
    import dataclasses

    from gna_interp.engine.forward import ScoreTable, read_chunks
    from gna_interp.engine.layout import layout_chunks
    from gna_interp.engine.plan import plan_scoring

    task = gna.KVRetrieval(n_pairs=3, n_samples=3, seed=1, max_value=99, template="completion")
    assert not plan_scoring(built(fam).model, task.samples).packs
    wide = dataclasses.replace(fam, key=f"{fam.key}_wide", config={**fam.config, "sliding_window": 4096})
    model = gna.load_model(wide.build(tmp_path / wide.key), device="cpu")
    plan = plan_scoring(model, task.samples)
    assert plan.packs
    scores = {}
    for pack in (True, False):
        table = ScoreTable(plan)
        for read in read_chunks(model, layout_chunks(plan, 3, pack=pack)):
            table.add(read.chunk, read.logprobs())
        scores[pack] = table.result().scores
    ok = torch.isfinite(scores[False])
    assert torch.equal(ok, torch.isfinite(scores[True]))
    torch.testing.assert_close(scores[True][ok], scores[False][ok], atol=1e-5, rtol=0)


@pytest.mark.parametrize("fam", _for("heads"))
def test_heads_listed_with_their_kinds(fam, built):
    b = built(fam)
    want = Counter()
    for (layer, kind), (n, _) in b.layout.items():
        want[(layer, kind)] = n
    got = Counter((h.layer, h.kind) for h in b.model.heads())
    assert got == want, fam.key
    assert tuple(s.layer for s in b.model.unsupported()) == fam.unsupported, fam.key
    for (layer, kind), (n, width) in b.layout.items():
        spec = b.model.layer_spec(layer, kind)
        assert spec.n_heads == n and spec.head_dim == width, (fam.key, layer, kind)
    names = [h.name for h in b.model.heads()]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("fam", _for("patterns"))
def test_patterns(fam, built):
    b = built(fam)
    m = b.model
    keep = b.batch.attention_mask.bool()
    for kind in sorted({k for _, k in b.layout}):
        heads = m.heads(kind=kind)
        if kind in SSM_KINDS:
            heads = [h for h in heads if h.head < 8]  # Mamba-1: 8 channels per layer keep it fast
        pat = gna.patterns(m, b.batch, heads=heads).stack()
        assert pat.shape[1] == len(heads) and torch.isfinite(pat).all(), (fam.key, kind)
        if kind == "attn" and fam.sinks:  # a sink logit takes a share of every row
            rows = pat.sum(-1)
            assert (rows <= 1 + 1e-5).all() and (rows > 0).all() and (rows < 1 - 1e-4).any(), fam.key
            assert torch.triu(pat, diagonal=1).abs().max() == 0
            continue
        if kind == "attn":
            torch.testing.assert_close(pat.sum(-1), torch.ones(pat.shape[:-1]), atol=1e-5, rtol=0)
            assert torch.triu(pat, diagonal=1).abs().max() == 0
            continue
        for spec in [s for s in m.layers if s.kind == kind]:
            names = [f"{spec.bridge_path}.hook_in", f"{spec.bridge_path}.hook_out"]
            _, cache = m.run_with_cache(b.batch, names_filter=lambda n: n in names)
            hidden, ref = cache[names[0]], cache[names[1]]
            terms = layer_terms(m, spec, hidden, b.batch.attention_mask)
            every = m.heads(kind=kind, layers=[spec.layer])
            M = gna.patterns(m, b.batch, every, form="exact").stack()
            mx = torch.einsum("bnqk,bknp->bqnp", M, terms.x)
            dx = terms.x * terms.D[None, None, :, None]
            assert mx[keep].norm() > 0.2 * dx[keep].norm(), "M x must carry real weight"
            out = mixer_output(m.hf_module(spec.bridge_path), terms, mx + dx)
            rel = ((out - ref)[keep].norm() / ref[keep].norm()).item()
            assert rel <= 1e-4, (fam.key, spec.layer, rel)


@pytest.mark.parametrize("fam", _for("ablation"))
def test_ablation_equals_zeroed_projection_columns(fam, built):
    b = built(fam)
    intact = b.hf_logits()
    for head in b.sample_heads():
        width = b.layout[(head.layer, head.kind)][1]
        cols = slice(head.head * width, (head.head + 1) * width)
        with gna.ablate(b.model, head):
            got = b.model.forward(b.batch)
        if head.kind in fam.shared:
            proj = _module(b.hf, fam, head.kind, head.layer)
            path = fam.proj[head.kind][0].format(l=head.layer)
            depth = b.hf.get_submodule(path[:path.index(f".{head.layer}.") + len(f".{head.layer}")])
            with _zero_at_depth(proj, depth, cols):
                ref = b.hf_logits()
        else:
            edited = copy.deepcopy(b.hf)
            _zero_columns(_module(edited, fam, head.kind, head.layer), cols)
            ref = b.hf_logits(edited)
        moved = (ref - intact).abs().max().item()
        assert moved > 1e-4, (fam.key, head.name, moved)
        err = (got - ref).abs().max().item()
        assert err <= 1e-5 * max(1.0, ref.abs().max().item()), (fam.key, head.name, err, moved)


@pytest.mark.parametrize("fam", _for("scan"))
def test_exact_scan_equals_naive_loop(fam, built):
    b = built(fam)
    task = gna.KVRetrieval(n_pairs=3, n_samples=3, seed=1, max_value=9)
    heads = b.sample_heads()[:3]
    kw = dict(heads=heads, batch_size=4, progress=False)
    if fam.replays:
        with warnings.catch_warnings():  # the fast exact path itself, not its fallback to the naive loop
            warnings.simplefilter("error", RuntimeWarning)
            exact = gna.scan_heads(b.model, task, strategy="exact", **kw)
    else:
        with pytest.warns(RuntimeWarning, match="falling back to one full forward per head"):
            exact = gna.scan_heads(b.model, task, strategy="exact", **kw)
    naive = gna.scan_heads(b.model, task, strategy="naive", **kw)
    assert set(exact.exact) == set(naive.exact) == set(heads)
    assert exact.baseline_value == pytest.approx(naive.baseline_value, abs=1e-5)
    for h in heads:
        torch.testing.assert_close(exact.exact[h]["logit_diff"], naive.exact[h]["logit_diff"], atol=1e-5, rtol=0)
        assert torch.equal(exact.exact[h]["correct"], naive.exact[h]["correct"])


@pytest.mark.parametrize("fam", [f for f in _for("scan") if f.values[0].replays])
def test_suffix_replay_reproduces_the_later_positions_or_is_off(fam, built):
    """Where a family's blocks take the recorded keys and values (:class:`KeyValues`), a replay of the positions from
    a column on equals the full replay there, from every block; elsewhere suffix replays are off."""
    from gna_interp.engine.replay import KeyValues, capture, replay
    from gna_interp.engine.layout import layout_chunks
    from gna_interp.engine.plan import plan_scoring

    b = built(fam)
    task = gna.KVRetrieval(n_pairs=3, n_samples=2, seed=1, max_value=9)
    chunk = layout_chunks(plan_scoring(b.model, task.samples), 2)[0]  # packed tree rows, left padding
    with torch.no_grad():
        prefix = capture(b.model, chunk.batch)
        ok = KeyValues.supported(b.model, prefix)
        keys, final = KeyValues.record(b.model, prefix, 0)
        torch.testing.assert_close(final, replay(b.model, prefix, 0), atol=0, rtol=0)
        if not ok:
            assert keys is None
            return
        assert keys is not None
        width = final.shape[1]
        for column in (1, width // 3, int(chunk.read_pos.min())):
            got = keys.replay_from(b.model, 0, column, copies=2)
            torch.testing.assert_close(got, final[:, column:].repeat(2, 1, 1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("fam", _for("kv"))
def test_kv_task_evaluates(fam, built):
    b = built(fam)
    task = gna.KVRetrieval(n_pairs=3, n_samples=4, seed=2, max_value=9)
    ev = gna.evaluate(b.model, task, progress=False)
    assert ev.metrics["n_samples"] == 4 and 0.0 <= ev.accuracy <= 1.0
    assert torch.isfinite(torch.tensor(ev.logit_diff))
    # the prompts were tokenised by the model's own tokenizer: its ids, as the plain HF tokenizer gives them
    ids = b.model.tokenize(task[0].prompt).ids[0].tolist()
    assert ids == b.model.tokenizer(task[0].prompt)["input_ids"]


@pytest.mark.parametrize("fam, check, text", [pytest.param(f, c, t, id=f"{f.key}-{c}")
                                               for f in FAMILIES for c, t in f.limits])
def test_limits_are_reported(fam, check, text, built):
    """What a family cannot do fails with the error the matrix states (not silently)."""
    b = built(fam)
    with pytest.raises(Exception, match=re.escape(text)):
        if check == "logits":
            b.model.forward(b.batch)
        elif check == "ablation":
            with gna.ablate(b.model, b.sample_heads()[0]):
                b.model.forward(b.batch)
        elif check == "patterns":
            gna.patterns(b.model, b.batch, heads=b.sample_heads()[:1])
        elif check == "paths":
            sender = _path_edges(b)[0]
            receiver = max((h for h in b.sample_heads() if h.layer > sender.layer), key=lambda h: h.layer)
            task = gna.KVRetrieval(n_pairs=3, n_samples=2, seed=1, max_value=9)
            gna.path_effects(b.model, task, [gna.Edge(sender, receiver, "k", "all")], batch_size=1)
        elif check == "scan":
            task = gna.KVRetrieval(n_pairs=3, n_samples=3, seed=1, max_value=9)
            gna.scan_heads(b.model, task, heads=b.sample_heads()[:3], strategy="exact", batch_size=4, progress=False)
        else:
            raise AssertionError(f"no way to exercise {check!r}")


@pytest.mark.parametrize("fam", [pytest.param(f, id=f.key) for f in FAMILIES if f.raises])
def test_refused_families_raise_unsupported_architecture(fam, tmp_path):
    d = fam.build(tmp_path / fam.key)
    with pytest.raises(UnsupportedArchitectureError, match=re.escape(fam.raises)):
        gna.load_model(d, device="cpu")


def test_every_causal_lm_of_the_bridge_is_in_the_matrix_or_named():
    """Each causal LM TransformerLens's bridge lists is a row of the matrix, or is named with the reason it is
    not (no class in the installed transformers, or :data:`NOT_IN_MATRIX`): nothing is dropped silently."""
    listed = {f.cls for f in FAMILIES}
    assert not (listed & set(NOT_IN_MATRIX)), "a family is both in the matrix and out of it"
    missing = [a for a in bridge_causal_lms() if a not in listed and a not in NOT_IN_MATRIX
               and hasattr(transformers, a)]
    assert not missing, f"bridge-supported causal LMs neither in the matrix nor in NOT_IN_MATRIX: {missing}"
    assert set(NOT_IN_MATRIX) <= set(bridge_causal_lms()), "NOT_IN_MATRIX names an architecture the bridge dropped"


# ---- the list and the page ----------------------------------------------------------------------------------


def test_every_family_runs_every_check_or_says_why():
    keys = [f.key for f in FAMILIES]
    assert len(set(keys)) == len(keys)
    for f in FAMILIES:
        assert f.checks == tuple(c for c in CHECKS if c in f.checks), f.key  # known names, page order
        assert not (set(f.checks) & {c for c, _ in f.limits}), f.key
        assert set(f.checks) == set(CHECKS) or f.note, f"{f.key}: a family that skips a check must say why"


def test_page_is_generated_from_the_list():
    assert PAGE.read_text(encoding="utf-8") == render(), \
        "docs/family_matrix.md is stale: run `python -m tests.family_matrix` from the repository root"
