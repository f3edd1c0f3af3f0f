"""`scan_heads`: fast exact equals the naive loop, attribution is a correct first-order estimate, auto,
checkpoint kill-and-resume, result frame, bad input."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gna_interp import HeadRef
from gna_interp.circuits import scan_heads
from gna_interp.circuits import scan as scan_mod
from gna_interp.circuits.scan import policy as scan_policy, result as scan_result
from gna_interp.engine.attribution import attribution_estimates
from gna_interp.circuits.scan.policy import next_to_verify as _next_to_verify
from gna_interp.engine.metrics import LOGIT_DIFF

metric_weights = LOGIT_DIFF.target_weights  # the logit difference's target weights
from gna_interp.engine.layout import layout_chunks
from gna_interp.engine import replay as replay_mod
from gna_interp.engine.replay import ReplayMismatch, SetAblation
from gna_interp.errors import InputError
from gna_interp.interventions.ablation import Replacement, ablation_hooks, replacements
from gna_interp.tasks import KVRetrieval
from gna_interp.engine import plan_scoring, run_plan

TASK = KVRetrieval(n_pairs=3, n_samples=3, max_value=20, seed=1)
HEADS = {
    "llama": ["L0H1", "L1H2", "L2H3", "L2H0"],
    "mamba": ["L0C0+16", "L1C40+8"],
    "mamba2": ["L0S1", "L1S3", "L1S0"],
    "bamba": ["L0S1", "L1H2", "L2S0"],
    "jamba": ["L1H1", "L2C3+5"],
}


@pytest.mark.parametrize("family", sorted(HEADS))
def test_fast_exact_equals_the_naive_loop(tiny_models, family):
    model = tiny_models[family]
    kw = dict(heads=HEADS[family], batch_size=2, progress=False)  # 2 forwards per pass, left padding inside
    naive = scan_heads(model, TASK, strategy="naive", **kw)
    exact = scan_heads(model, TASK, strategy="exact", stack=2, **kw)
    assert set(exact.exact) == set(naive.exact) == set(model.check_heads(HEADS[family]))
    for h in naive.exact:
        torch.testing.assert_close(exact.exact[h]["logit_diff"], naive.exact[h]["logit_diff"], atol=1e-4, rtol=0)
        assert torch.equal(exact.exact[h]["correct"], naive.exact[h]["correct"])
    torch.testing.assert_close(exact.baseline["logit_diff"], naive.baseline["logit_diff"], atol=1e-4, rtol=0)
    drops = exact.to_frame()["drop"].abs()
    assert drops.max() > 1e-5, "no head changed anything: the comparison would be vacuous"


def test_exact_with_mean_ablation_matches_naive_and_accuracy_metric(tiny_models):
    model = tiny_models["llama"]
    ref = KVRetrieval(n_pairs=3, n_samples=2, max_value=20, seed=7)
    kw = dict(heads=["L0H0", "L1H3"], method="mean", reference=ref, metric="accuracy", batch_size=2, progress=False)
    naive = scan_heads(model, TASK, strategy="naive", **kw).to_frame().set_index("name")
    exact = scan_heads(model, TASK, strategy="exact", **kw).to_frame().set_index("name")
    assert list(exact.columns) == ["layer", "head", "kind", "baseline", "ablated", "drop", "rank", "source", "est_drop", "est_mass",
                                   "drop_lo", "drop_hi", "screen_drop"]
    assert (exact.loc[naive.index, "ablated"] == naive["ablated"]).all()


def test_attribution_is_the_first_order_effect(tiny_models):
    """With a replacement a' = (1 - eps) a the exact effect is eps * (-a . grad): attribution must match it."""
    model = tiny_models["bamba"]
    plan = plan_scoring(model, TASK.samples)
    chunks = layout_chunks(plan, batch_size=len(plan.rows))  # one forward: resample rows = this batch
    batch = chunks[0].batch
    eps = 1e-3
    for name in ["L0S2", "L1H1"]:
        site = model.head_site(name)
        _, cache = model.run_with_cache(batch, names_filter=site.hook)
        act = cache[site.hook].flatten(2)[..., site.columns].float()
        r = Replacement(site, mean=torch.zeros(act.shape[-1]), rows=(1 - eps) * act,
                        row_mask=torch.ones(act.shape[:2], dtype=torch.bool))
        clean = run_plan(model, plan, len(plan.rows), share_prefix=False)
        est, _, clean2, mass = attribution_estimates(model, plan, chunks, [r], metric_weights(plan, clean))
        assert mass[0] >= abs(est[0]) - 1e-12  # the terms summed without cancellation
        one = torch.zeros(act.shape[:2], dtype=torch.bool)
        one[0, -1] = True  # a replacement of one token's output: one term, nothing to cancel
        r1 = Replacement(site, mean=torch.zeros(act.shape[-1]), rows=torch.where(one[..., None], 0.5 * act, act),
                         row_mask=torch.ones(act.shape[:2], dtype=torch.bool))
        est1, _, _, mass1 = attribution_estimates(model, plan, chunks, [r1], metric_weights(plan, clean))
        assert mass1[0].item() == pytest.approx(abs(est1[0].item()), rel=1e-9, abs=1e-12)
        moved = run_plan(model, plan, len(plan.rows), fwd_hooks=ablation_hooks([r]), share_prefix=False)
        other = clean.scores.scatter(1, clean.gold[:, None], float("-inf")).argmax(-1, keepdim=True)
        ld = lambda s: (s.gold_score - s.scores.gather(1, other)[:, 0]).mean().item()  # noqa: E731
        exact = ld(moved) - ld(clean)
        assert abs(exact) > 1e-7
        assert est[0].item() == pytest.approx(exact, rel=0.05, abs=2e-6)
        torch.testing.assert_close(clean2.scores, clean.scores, atol=1e-4, rtol=0)


def test_attribution_and_auto_scans(tiny_models):
    model = tiny_models["llama"]
    heads = model.heads()
    exact = scan_heads(model, TASK, strategy="exact", batch_size=4, progress=False)
    attr = scan_heads(model, TASK, strategy="attribution", batch_size=4, progress=False)
    assert not attr.exact and set(attr.estimates) == set(heads)
    fa = attr.to_frame()
    assert (fa["source"] == "attribution").all() and fa["drop"].tolist() == pytest.approx(fa["est_drop"].tolist())
    auto = scan_heads(model, TASK, strategy="auto", verify=5, certify=0, batch_size=4, progress=False)
    assert len(auto.exact) == 5
    fu = auto.to_frame()
    assert (fu["source"].head(5) == "exact").all() and (fu["source"].iloc[5:] == "attribution").all()
    by_est = sorted(heads, key=lambda h: attr.estimates[h])  # lowest estimated ablated = largest est. drop
    by_mass = sorted(heads, key=lambda h: -attr.masses[h])  # and the largest masses, alternately
    first = list(dict.fromkeys(h for pair in zip(by_est, by_mass) for h in pair))[:5]
    assert set(auto.exact) == set(first) and set(by_est[:2]) <= set(first) and by_mass[0] in first
    for h in auto.exact:
        torch.testing.assert_close(auto.exact[h]["logit_diff"], exact.exact[h]["logit_diff"], atol=1e-4, rtol=0)


def test_ablation_size_is_the_relative_residual_write(tiny_models):
    """size = mean over real tokens of ||(a' - a) W_O[:, head]|| / ||block input||, for attention and SSM heads."""
    model = tiny_models["bamba"]
    plan = plan_scoring(model, TASK.samples)
    chunks = layout_chunks(plan, batch_size=len(plan.rows))
    batch = chunks[0].batch
    names = ["L0S2", "L1H1", "L2S0"]
    att = attribution_estimates(model, plan, chunks, replacements(model, names))
    for k, name in enumerate(names):
        site = model.head_site(name)
        layer = model.hf_model.model.layers[site.head.layer]
        proj = (layer.self_attn.o_proj if site.head.kind == "attn" else layer.mamba.out_proj).weight
        _, cache = model.run_with_cache(batch, names_filter=[site.hook, f"blocks.{site.head.layer}.hook_in"])
        a = cache[site.hook].flatten(2)[..., site.columns]
        x = cache[f"blocks.{site.head.layer}.hook_in"]
        ratios = [(a[b, t] @ proj[:, site.columns].T).norm() / x[b, t].norm()
                  for b in range(a.shape[0]) for t in range(a.shape[1]) if batch.attention_mask[b, t]]
        assert att.size[k].item() == pytest.approx(torch.stack(ratios).mean().item(), rel=1e-4)


def test_auto_settles_the_leading_heads(tiny_models):
    """``certify=k``: auto's top k equals exact's, and no unrun head's bound is above the k-th exact drop."""
    model = tiny_models["llama"]
    exact = scan_heads(model, TASK, strategy="exact", batch_size=4, progress=False).to_frame()
    for k in (3, 6):
        auto = scan_heads(model, TASK, strategy="auto", verify=2, certify=k, batch_size=4, progress=False)
        assert len(auto.exact) >= k
        assert set(auto.to_frame()["name"][:k]) == set(exact["name"][:k])
        assert _next_to_verify(auto, k, 100) == []


def test_auto_with_focus_runs_only_those_heads_exactly(tiny_models):
    """``focus``: the heads outside it keep their estimates, however high their bound; inside it the
    settle threshold is honoured."""
    model = tiny_models["llama"]
    focus = model.heads()[:5]
    auto = scan_heads(model, TASK, strategy="auto", verify=2, certify=0, settle_above=-1e9, focus=focus,
                      batch_size=4, progress=False)
    assert set(auto.exact) == set(focus)  # a threshold every head passes: all of focus, nothing else
    assert len(auto.estimates) == len(model.heads())
    frame = auto.to_frame().set_index("name")
    assert set(frame.index[frame["source"] == "exact"]) == {h.name for h in focus}


def test_auto_screens_on_a_subset_before_running_all_samples(tiny_models, tmp_path, monkeypatch):
    """``screen=m``: heads the attribution bound cannot rule out are first run on m spread samples (the
    same numbers as an exact run restricted to those samples); only heads whose screening bound could
    still reach the leading ones run on all samples, and the result survives a checkpoint round trip.
    (The tiny model's 12 heads differ too little for 3 standard deviations on 4 samples to rule any out:
    the bound is taken at its mean here, z = 0; and its attribution bound settles the top 3 at once, so the
    calibration constant is made huge to leave every head in play.)"""
    monkeypatch.setattr(scan_result, "SCREEN_Z", 0.0)
    monkeypatch.setattr(scan_policy, "calibration", lambda *args: 1e6)
    model = tiny_models["llama"]
    task = KVRetrieval(n_pairs=3, n_samples=8, max_value=20, seed=3)
    exact = scan_heads(model, task, strategy="exact", batch_size=4, progress=False)
    auto = scan_heads(model, task, strategy="auto", verify=4, certify=3, screen=4, batch_size=4, progress=False,
                      checkpoint=tmp_path / "ck.json")
    assert auto.screen_index == [0, 2, 5, 7] and auto.screened
    idx = torch.tensor(auto.screen_index)
    for h, per in auto.screened.items():
        torch.testing.assert_close(per["logit_diff"], exact.exact[h]["logit_diff"][idx], atol=1e-4, rtol=0)
    only_screened = set(auto.screened) - set(auto.exact)
    assert only_screened, "no head was ruled out by its screen: the stage did nothing"
    assert _next_to_verify(auto, 3, 100) == []
    frame = auto.to_frame().set_index("name")
    assert set(frame.loc[[h.name for h in only_screened], "source"]) == {"screen"}
    assert set(auto.to_frame()["name"][:3]) == set(exact.to_frame()["name"][:3])
    again = type(auto).from_state(auto.to_state())
    assert again.screen_index == auto.screen_index and set(again.screened) == set(auto.screened)
    h = next(iter(only_screened))
    assert again.screen_bound(h) == auto.screen_bound(h)


def test_frame_ranks_and_top(tiny_models):
    scan = scan_heads(tiny_models["mamba2"], TASK, strategy="exact", batch_size=4, progress=False)
    df = scan.to_frame()
    assert df["rank"].tolist() == list(range(1, len(df) + 1))
    assert (df["drop"].diff().dropna() <= 1e-12).all()
    assert (df["drop"] == df["baseline"] - df["ablated"]).all()
    assert scan.top(2) == [HeadRef.parse(n) for n in df["name"][:2]]
    assert df["baseline"].nunique() == 1


def test_fallback_to_naive_when_replay_does_not_reproduce_the_model(tiny_models, monkeypatch):
    model = tiny_models["llama"]

    def broken(*args, **kwargs):
        raise ReplayMismatch("simulated: work between blocks")

    monkeypatch.setattr(replay_mod, "verify_replay", broken)
    monkeypatch.delitem(model.facts, replay_mod.VERIFIED, raising=False)  # forget that the model passed before
    with pytest.warns(RuntimeWarning, match="falling back"):
        scan = scan_heads(model, TASK, heads=["L1H1"], strategy="exact", batch_size=4, progress=False)
    naive = scan_heads(model, TASK, heads=["L1H1"], strategy="naive", batch_size=4, progress=False)
    assert scan.ablated("L1H1") == pytest.approx(naive.ablated("L1H1"), abs=1e-6)


def test_bad_arguments(tiny_models, tmp_path):
    model = tiny_models["llama"]
    with pytest.raises(InputError, match="unknown strategy"):
        scan_heads(model, TASK, strategy="fast")
    with pytest.raises(InputError, match="unknown metric"):
        scan_heads(model, TASK, metric="loss")
    with pytest.raises(InputError, match="batch_size"):
        scan_heads(model, TASK, batch_size=0)
    with pytest.raises(InputError, match="needs a Task"):
        scan_heads(model, ["a prompt"])
    with pytest.raises(InputError, match="no heads"):
        scan_heads(model, TASK, heads=[])
    bad = tmp_path / "ck.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="cannot be read"):
        scan_heads(model, TASK, heads=["L0H0"], checkpoint=bad, progress=False)


_KILLER = textwrap.dedent("""
    import os, signal, sys
    import torch
    torch.set_num_threads(1)
    from gna_interp import load_model
    from gna_interp.circuits import scan as scan_mod
    from gna_interp.circuits.scan import store as scan_store
    from gna_interp.tasks import KVRetrieval

    model_dir, ckpt, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    real_write = scan_store._write_checkpoint
    writes = []

    def write_then_die(path, state):
        real_write(path, state)
        if len(state["exact"]) >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)   # killed mid-scan, right after a checkpoint

    scan_store._write_checkpoint = write_then_die
    model = load_model(model_dir, device="cpu")
    task = KVRetrieval(n_pairs=3, n_samples=3, max_value=20, seed=1)
    scan_mod.scan_heads(model, task, strategy="exact", stack=2, batch_size=2, checkpoint=ckpt, progress=False)
    print("not killed")
""")


def test_killed_scan_resumes_without_redoing_finished_heads(tiny_dirs, tiny_models, tmp_path, monkeypatch):
    model = tiny_models["llama"]
    ckpt = tmp_path / "scan.ckpt.json"
    script = tmp_path / "killer.py"
    script.write_text(_KILLER)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(script), str(tiny_dirs["llama"]), str(ckpt), "4"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    state = json.loads(ckpt.read_text())
    done = set(state["exact"])
    assert 4 <= len(done) < 12
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "a temporary checkpoint file was left behind"

    computed: list[str] = []
    real_group = scan_mod._exact_group

    def counting(runner, group):
        computed.extend(r.site.head.name for r in group)
        return real_group(runner, group)

    monkeypatch.setattr(scan_mod, "_exact_group", counting)
    resumed = scan_heads(model, TASK, strategy="exact", stack=2, batch_size=2, checkpoint=ckpt, progress=False)
    assert not set(computed) & done and len(computed) == 12 - len(done)
    fresh = scan_heads(model, TASK, strategy="exact", stack=2, batch_size=2, progress=False)
    a, b = resumed.to_frame(), fresh.to_frame()
    assert a["name"].tolist() == b["name"].tolist()
    assert a["ablated"].tolist() == pytest.approx(b["ablated"].tolist(), abs=1e-6)
    assert len(json.loads(ckpt.read_text())["exact"]) == 12

    # a checkpoint of another scan is refused
    with pytest.raises(InputError, match="different scan"):
        scan_heads(model, TASK, heads=["L0H0"], checkpoint=ckpt, progress=False)


def _torch_hooks(model) -> int:
    points = {id(hp): hp for hp in model.bridge.hook_dict.values()}.values()
    blocks = list(model.bridge.blocks)
    return (sum(len(hp._forward_hooks) + len(hp._forward_pre_hooks) for hp in points)
            + sum(len(b._forward_pre_hooks) for b in blocks))


@pytest.mark.parametrize("where,strategy", [("replay", "exact"), ("final norm", "attribution")])
def test_no_hook_or_gradient_flag_survives_an_exception(tiny_models, monkeypatch, where, strategy):
    from gna_interp.engine import attribution as attr_mod

    model = tiny_models["bamba"]
    before = _torch_hooks(model)
    flags = [p.requires_grad for p in model.hf_model.parameters()]
    real = replay_mod.replay if where == "replay" else attr_mod._Recorder.hooks

    def boom(*args, **kwargs):
        if where == "replay" and _torch_hooks(model) == before:  # the clean check of replays: let it run
            return real(*args, **kwargs)
        assert _torch_hooks(model) > before  # raised while the scan's hooks are attached
        raise KeyboardInterrupt("interrupted mid-scan")

    if where == "replay":
        monkeypatch.setattr(replay_mod, "replay", boom)
    else:  # raised inside the attribution forward, at the final norm, with gradients on
        monkeypatch.setattr(attr_mod._Recorder, "hooks",
                            lambda self: real(self) + [(model.FINAL_NORM_INPUT, boom)])
    with pytest.raises(KeyboardInterrupt):
        scan_heads(model, TASK, heads=["L0S1", "L1H2"], strategy=strategy, batch_size=4, progress=False)
    assert _torch_hooks(model) == before
    assert [p.requires_grad for p in model.hf_model.parameters()] == flags


def test_multi_token_candidates_are_packed_one_sequence_per_sample(tiny_models, monkeypatch):
    """Several rows per sample (multi-token values): the exact scan lays each sample out once (its rows
    as a tree under one mask) and replays it, and its numbers equal the full-row naive loop's and an
    `evaluate` under `ablate`; attribution reads its metric weights chunk by chunk."""
    from gna_interp.interventions import ablate
    from gna_interp.tasks import evaluate
    from gna_interp.engine import plan_scoring

    model = tiny_models["llama"]
    task = KVRetrieval(n_pairs=6, n_samples=3, seed=2)  # values 0..99: byte tokens, many rows per sample
    plan = plan_scoring(model, task.samples)
    assert len(plan.rows) > 2 * len(plan.samples)
    chunks = layout_chunks(plan, 2)
    assert [c.size for c in chunks] == [2, 1] and all(c.batch.tree is not None for c in chunks)
    replays: list[str] = []
    real_group = scan_mod._exact_group
    monkeypatch.setattr(scan_mod, "_exact_group", lambda *a: replays.append("x") or real_group(*a))
    heads = model.heads()[::3]
    exact = scan_heads(model, task, heads=heads, strategy="exact", batch_size=4, progress=False)
    naive = scan_heads(model, task, heads=heads, strategy="naive", batch_size=4, progress=False)
    assert replays
    for h in heads:
        assert exact.ablated(h) == pytest.approx(naive.ablated(h), abs=1e-5)
        assert torch.equal(exact.exact[h]["correct"], naive.exact[h]["correct"])
    with ablate(model, [heads[1]]):
        assert exact.ablated(heads[1]) == pytest.approx(evaluate(model, task, progress=False).logit_diff, abs=1e-5)
    assert abs(exact.baseline_value - naive.baseline_value) < 1e-5 and max(abs(exact.to_frame()["drop"])) > 1e-3
    replaced = replacements(model, heads, "zero")
    clean = run_plan(model, plan, 8, share_prefix=False)
    own = attribution_estimates(model, plan, chunks, replaced)
    given = attribution_estimates(model, plan, chunks, replaced, metric_weights(plan, clean))
    torch.testing.assert_close(own.delta, given.delta, atol=1e-6, rtol=1e-5)
    assert (own.delta.abs() > 0).all()


def test_auto_stops_at_max_exact_and_reports_what_is_unsettled(tiny_models):
    model = tiny_models["llama"]
    with pytest.warns(RuntimeWarning, match="max_exact=3"):
        scan = scan_heads(model, TASK, strategy="auto", verify=2, certify=10, max_exact=3, batch_size=4,
                          progress=False)
    assert len(scan.exact) == 3 and scan.unsettled > 0 and scan.metrics["unsettled"] == scan.unsettled
    again = type(scan).from_state(scan.to_state())
    assert again.unsettled == scan.unsettled


SETS = {"llama": [["L2H3"], ["L0H1", "L2H0"], ["L1H2", "L0H0", "L2H3"]],
        "mamba2": [["L1S3"], ["L0S1", "L1S0"]],
        "bamba": [["L1H2"], ["L0S1", "L2S0"]]}


@pytest.mark.parametrize("family", sorted(SETS))
def test_set_ablation_equals_ablate_and_evaluate(tiny_models, family):
    """Heads removed together through the prefix replay score what a full forward under `ablate` scores,
    for sets spanning layers, both attention and SSM heads, zero and mean ablation."""
    from gna_interp.interventions import ablate
    from gna_interp.tasks import evaluate

    model = tiny_models[family]
    ref = KVRetrieval(n_pairs=3, n_samples=2, max_value=20, seed=7)
    for method, reference in (("zero", None), ("mean", ref)):
        runner = SetAblation(model, TASK, method, reference, batch_size=2)
        assert runner.fast
        clean = evaluate(model, TASK, batch_size=2, progress=False)
        torch.testing.assert_close(runner.clean().logit_diff, clean.scores.logit_diff, atol=1e-4, rtol=0)
        moved = 0.0
        for heads in SETS[family]:
            with ablate(model, heads, method, reference):
                want = evaluate(model, TASK, batch_size=2, progress=False).scores
            got = runner.run(heads)
            torch.testing.assert_close(got.logit_diff, want.logit_diff, atol=1e-4, rtol=0)
            assert torch.equal(got.correct, want.correct)
            moved = max(moved, float((got.logit_diff - clean.scores.logit_diff).abs().max()))
        assert moved > 1e-4, "no set changed anything: the comparison would be vacuous"


def test_set_ablation_falls_back_to_full_forwards(tiny_models, monkeypatch):
    """Resampling replays on plain rows (each row meets the reference row a full forward gives it); models whose
    replays do not reproduce the forward score each set in full."""
    from gna_interp.interventions import ablate
    from gna_interp.tasks import evaluate

    model = tiny_models["llama"]
    ref = KVRetrieval(n_pairs=3, n_samples=2, max_value=20, seed=7)
    runner = SetAblation(model, TASK, "resample", ref, batch_size=2)
    assert runner.fast and runner.pack is False
    with ablate(model, ["L0H1", "L2H0"], "resample", ref):
        want = evaluate(model, TASK, batch_size=2, progress=False).scores
    torch.testing.assert_close(runner.run(["L0H1", "L2H0"]).logit_diff, want.logit_diff, atol=1e-5, rtol=0)

    def broken(*args, **kwargs):
        raise ReplayMismatch("simulated: work between blocks")

    monkeypatch.setattr(replay_mod, "verify_replay", broken)
    monkeypatch.delitem(model.facts, replay_mod.VERIFIED, raising=False)  # forget that the model passed before
    slow = SetAblation(model, TASK, batch_size=2)
    assert not slow.fast
    with ablate(model, ["L1H1"]):
        want = evaluate(model, TASK, batch_size=2, progress=False).scores
    torch.testing.assert_close(slow.run(["L1H1"]).logit_diff, want.logit_diff, atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="reference"):
        SetAblation(model, TASK, "mean")


class _BlockCount:
    """The blocks replayed since the last ``pop``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def pop(self) -> int:
        n = sum(b - a for a, b in self.calls)
        self.calls.clear()
        return n


@contextlib.contextmanager
def replayed_blocks():
    """Count the blocks every ``engine.replay.replay`` call runs while the context is open."""
    count, real = _BlockCount(), replay_mod.replay

    def counted(model, prefix, start, copies=1, hidden=None, stop=None):
        count.calls.append((start, model.n_layers if stop is None else stop))
        return real(model, prefix, start, copies, hidden, stop)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_mod, "replay", counted)
        yield count


@pytest.mark.parametrize("family", ["llama", "mamba2", "bamba"])
def test_nested_sets_equal_each_set_replayed_alone(tiny_models, family):
    """run_nested starts each set's replay at the heads it adds, from the residual stream the previous sets left:
    its scores equal each set replayed on its own from its earliest layer (orders that go down and up in layer,
    a repeated set, the empty set), and it refuses sets that are not nested."""
    model = tiny_models[family]
    runner = SetAblation(model, TASK, batch_size=2)
    heads = model.heads()
    order = [heads[-1], heads[0], heads[len(heads) // 2], heads[1], heads[-2]]
    sets = [[]] + [order[:j] for j in (1, 2, 2, 3, 5)]
    with replayed_blocks() as blocks:
        got = runner.run_nested(sets)
        nested_blocks = blocks.pop()
        want = [runner.run(s) for s in sets]
        alone_blocks = blocks.pop()
    for g, w in zip(got, want):
        torch.testing.assert_close(g.scores, w.scores, atol=1e-5, rtol=0)
    assert not torch.equal(want[-1].scores, want[0].scores)  # the sets change the scores
    assert nested_blocks < alone_blocks  # and the chain ran fewer blocks
    with pytest.raises(InputError, match="contain the one before"):
        runner.run_nested([order[:2], order[1:3]])


@pytest.mark.parametrize("family", ["llama", "mamba2", "bamba"])
def test_each_added_head_equals_its_set_replayed_alone(tiny_models, family):
    """run_added replays each extra head from its own layer, from the base set's residual stream there: its scores
    equal each set (the base, the base plus one head) run on its own, for fewer blocks; extras at and above the
    base's layers, and with no base; an extra already in the base is refused."""
    model = tiny_models[family]
    runner = SetAblation(model, TASK, batch_size=2)
    heads = model.heads()
    mid = len(heads) // 2
    base = [heads[0], heads[mid]]
    extras = [heads[1], heads[mid + 1], heads[-1]]
    with replayed_blocks() as blocks:
        got = runner.run_added(base, extras)
        added_blocks = blocks.pop()
        want = [runner.run(base)] + [runner.run([*base, h]) for h in extras]
        alone_blocks = blocks.pop()
    assert len(got) == len(extras) + 1
    for g, w in zip(got, want):
        torch.testing.assert_close(g.scores, w.scores, atol=1e-5, rtol=0)
    assert not torch.equal(want[1].scores, want[0].scores)
    assert added_blocks < alone_blocks
    empty = runner.run_added([], [heads[-1]])  # no base: the clean scores, then the one head
    torch.testing.assert_close(empty[1].scores, runner.run([heads[-1]]).scores, atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="outside the base"):
        runner.run_added(base, [heads[0]])


@pytest.mark.parametrize("family", ["llama", "bamba"])
def test_a_kept_trail_starts_the_sets_that_contain_it(tiny_models, family):
    """run_trail keeps a set's replay block by block: a set containing it replays only from the earliest layer of
    the heads it adds, and run_added on it reads its scores and streams instead of replaying the base; every number
    equals the set run alone."""
    model = tiny_models[family]
    runner = SetAblation(model, TASK, "mean", TASK, batch_size=2)
    heads = model.heads()
    late = [h for h in heads if h.layer == heads[-1].layer]
    base = [heads[0], heads[len(heads) // 2]]
    trail = runner.run_trail(base)
    torch.testing.assert_close(trail.scores.scores, runner.run(base).scores, atol=1e-5, rtol=0)
    with replayed_blocks() as blocks:
        more = runner.run_trail([*base, late[0]], start=trail)
        started = blocks.pop()
        added = runner.run_added(base, [late[0], heads[1]], trail)
        on_trail = blocks.pop()
        alone = runner.run_added(base, [late[0], heads[1]])
        fresh = blocks.pop()
    assert started == len(runner.prefixes.chunks) * (model.n_layers - late[0].layer)  # the added head's blocks only
    assert on_trail < fresh
    torch.testing.assert_close(more.scores.scores, runner.run([*base, late[0]]).scores, atol=1e-5, rtol=0)
    for g, w in zip(added, alone):
        torch.testing.assert_close(g.scores, w.scores, atol=1e-5, rtol=0)
    assert added[0] is trail.scores
    other_batches = SetAblation(model, TASK, "mean", TASK, batch_size=3)  # another runner's trail is never read
    for g, w in zip(other_batches.run_added(base, [late[0]], trail), other_batches.run_added(base, [late[0]])):
        torch.testing.assert_close(g.scores, w.scores, atol=1e-6, rtol=0)
    assert other_batches.run_trail([*base, late[0]], start=trail).first == min(h.layer for h in [*base, late[0]])
    other = runner.run_trail([heads[1]], start=trail)  # not a superset of the trail's set: replayed on its own
    torch.testing.assert_close(other.scores.scores, runner.run([heads[1]]).scores, atol=1e-5, rtol=0)
    mid = [h for h in heads if 0 < h.layer < heads[-1].layer][:1]
    later = runner.run_trail(mid + late)  # a head added below the trail's first layer: the streams from there
    below = runner.run_trail([*mid, *late, heads[0]], start=later)
    assert mid and below.first == heads[0].layer and len(below.streams[0]) == model.n_layers - heads[0].layer
    torch.testing.assert_close(below.scores.scores, runner.run([*mid, *late, heads[0]]).scores, atol=1e-5, rtol=0)
    twin = next(h for h in heads if h.layer == mid[0].layer and h != mid[0])  # from below's stream at its layer
    with replayed_blocks() as blocks:
        deeper = runner.run_trail([*mid, *late, heads[0], twin], start=below)
        assert blocks.pop() == len(runner.prefixes.chunks) * (model.n_layers - twin.layer)
    torch.testing.assert_close(deeper.scores.scores, runner.run([*mid, *late, heads[0], twin]).scores, atol=1e-5,
                               rtol=0)


def test_stages_share_one_clean_pass_per_task(tiny_models, monkeypatch):
    """Inside shared_prefixes, a scan, a SetAblation and a path patcher of the same task capture its clean
    prefixes once; outside, each captures its own; another batch layout is another capture."""
    from gna_interp.circuits.edges.paths import PathPatcher
    from gna_interp.engine.replay import shared_prefixes

    model = tiny_models["llama"]
    captured = []
    real = replay_mod.capture
    monkeypatch.setattr(replay_mod, "capture", lambda *a, **k: captured.append(1) or real(*a, **k))

    def stages(batch_size: int = 2) -> None:
        SetAblation(model, TASK, batch_size=2).clean()
        scan_heads(model, TASK, heads=["L1H2"], strategy="exact", batch_size=2, progress=False)
        PathPatcher(model, TASK, batch_size=batch_size).clean()

    stages()
    alone = len(captured)
    captured.clear()
    with shared_prefixes():
        stages()
    shared = len(captured)
    captured.clear()
    with shared_prefixes():
        stages(batch_size=3)
    assert shared < alone and len(captured) > shared


def test_attribution_records_the_clean_prefixes_it_passes_through(tiny_models):
    """Given the plan's Prefixes, attribution's forward (a clean pass) keeps each chunk's block inputs and the clean
    log-probabilities of its reads: equal to a capture's, detached, and used by later replays instead of a clean
    forward of their own."""
    model = tiny_models["llama"]
    plan = plan_scoring(model, TASK.samples)
    chunks = layout_chunks(plan, 2)
    prefixes = replay_mod.Prefixes(model, chunks)
    att = attribution_estimates(model, plan, prefixes, replacements(model, model.heads()[:3], "zero", None))
    assert all(prefixes.has(i) for i in range(len(chunks)))
    for i, c in enumerate(chunks):
        got, want = prefixes.get(i), replay_mod.capture(model, c.batch, c.reads, c.read_tok)
        assert got.logits is None and want.logits is None and not got.logprobs.requires_grad
        torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-6, rtol=0)
        for layer in range(model.n_layers):
            assert not got.hidden(layer).requires_grad
            torch.testing.assert_close(got.hidden(layer), want.hidden(layer), atol=1e-6, rtol=0)
    torch.testing.assert_close(prefixes.clean(plan).logit_diff, att.clean.logit_diff, atol=1e-6, rtol=0)
