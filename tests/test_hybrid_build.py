"""Building a retrieval-guided hybrid from the zoo Transformer.

Mechanics of :func:`gna_interp.zoo.hybrid_build.build_hybrid` checked against independent computations:
the kept heads' weights against the teacher's slices, the untrained student against the plain Hugging Face
teacher with the other heads' channels zeroed before ``o_proj`` by a torch hook, the saved student against
its own plain Hugging Face forward; unused attention slots stay exactly zero through training and removing
them changes nothing. Then the experiment's bookkeeping (resume, outputs) with two-step students and the
shipped ``zoo:hybrid-guided-kv``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from gna_interp import HeadRef, ablate, load_model
from gna_interp.errors import InputError, OptionError
from gna_interp.models import zoo_dir, zoo_names
from gna_interp.models.loading import quiet_transformers
from gna_interp.tasks import KVRetrieval, evaluate
from gna_interp.zoo.hybrid_build import (
    HybridConfig,
    build_hybrid,
    layout,
    random_heads,
    student_recipe,
    transplant,
    unused_masks,
)
from gna_interp.zoo.training import build_model, read_card, training_batch

D_HEAD = 16
SHIPPED = "hybrid-guided-kv"


@pytest.fixture(scope="module")
def teacher():
    return load_model("zoo:transformer-kv", device="cpu")


@pytest.fixture(scope="module")
def batch(teacher):
    r = student_recipe(teacher, layout(teacher, []), HybridConfig(), 0, "x")
    return training_batch(teacher.tokenizer, r, 5)[0][:4]


def fresh_student(teacher, keep, ssm_init="zero"):
    lay = layout(teacher, keep)
    with quiet_transformers():
        student = build_model(student_recipe(teacher, lay, HybridConfig(ssm_init=ssm_init), 0, "x"), teacher.tokenizer)
    transplant(teacher.hf_model, student, lay, ssm_init)
    return student.eval(), lay


def teacher_only(teacher, keep, ids):
    """The plain HF teacher's logits with every head not in ``keep`` zeroed at the input of ``o_proj``."""
    keep = {HeadRef.parse(h) for h in keep}
    handles = []
    for layer, block in enumerate(teacher.hf_model.model.layers):
        def pre(module, args, layer=layer):
            z = args[0].clone()
            for h in range(4):
                if HeadRef(layer, h) not in keep:
                    z[..., h * D_HEAD:(h + 1) * D_HEAD] = 0
            return (z,)
        handles.append(block.self_attn.o_proj.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            return teacher.hf_model(input_ids=ids).logits
    finally:
        for h in handles:
            h.remove()


def test_kept_heads_are_the_teachers_slices_and_the_start_is_the_ablated_teacher(teacher, batch):
    student, lay = fresh_student(teacher, ["L1H2", "L0H3", "L1H0"])
    assert lay.kept == [[3], [0, 2]] and lay.slots == 2
    assert lay.slot_map() == {"L0H0": "L0H3", "L1H0": "L1H0", "L1H1": "L1H2"}
    assert [h.name for h in lay.unused()] == ["L0H1"]
    for student_name, teacher_name in lay.slot_map().items():
        s, t = HeadRef.parse(student_name), HeadRef.parse(teacher_name)
        sa, ta = student.model.layers[s.layer].self_attn, teacher.hf_model.model.layers[t.layer].self_attn
        ss, ts = slice(s.head * D_HEAD, (s.head + 1) * D_HEAD), slice(t.head * D_HEAD, (t.head + 1) * D_HEAD)
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert torch.equal(getattr(sa, proj).weight[ss], getattr(ta, proj).weight[ts])
        assert torch.equal(sa.o_proj.weight[:, ss], ta.o_proj.weight[:, ts])
    unused = student.model.layers[0].self_attn
    assert not unused.q_proj.weight[D_HEAD:].any() and not unused.o_proj.weight[:, D_HEAD:].any()
    for sl, tl in zip(student.model.layers, teacher.hf_model.model.layers):
        assert torch.equal(sl.feed_forward.down_proj.weight, tl.mlp.down_proj.weight)
        assert torch.equal(sl.pre_ff_layernorm.weight, tl.post_attention_layernorm.weight)
        assert not sl.mamba.out_proj.weight.any()
    # the untrained student (Mamba-2 output at zero) is the teacher with the other heads zero-ablated
    with torch.no_grad():
        got = student(input_ids=batch).logits
    ref = teacher_only(teacher, ["L0H3", "L1H0", "L1H2"], batch)
    assert (got - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
    assert (got - teacher_only(teacher, ["L0H3"], batch)).abs().max().item() > 1e-2  # the check can fail


def test_every_head_kept_reproduces_the_teacher(teacher, batch):
    student, lay = fresh_student(teacher, teacher.heads())
    assert lay.slots == 4 and lay.unused() == []
    with torch.no_grad():
        got, ref = student(input_ids=batch).logits, teacher.hf_model(input_ids=batch).logits
    assert (got - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()
    random_init, _ = fresh_student(teacher, teacher.heads(), ssm_init="random")
    with torch.no_grad():
        assert (random_init(input_ids=batch).logits - ref).abs().max().item() > 1e-3


def test_a_short_build_keeps_unused_slots_at_zero_and_loads_like_any_model(teacher, tmp_path):
    out = tmp_path / "student"
    res = build_hybrid(teacher, ["L1H3", "L1H2"], out, steps=3, seed=1, eval_sizes=(3,), eval_samples=4, log=None,
                       train_teacher_parts=True)  # attention trains too: the unused slots' masks must hold
    assert len(res.losses) == 3 and all(torch.isfinite(torch.tensor(res.losses)))
    card = read_card(out)
    assert card["architecture"] == "FalconH1ForCausalLM" and card["hybrid"]["kept"] == ["L1H2", "L1H3"]
    assert card["hybrid"]["slots"] == {"L1H0": "L1H2", "L1H1": "L1H3"}
    assert card["hybrid"]["unused_slots"] == ["L0H0", "L0H1"]
    assert "Unused attention slots" in (out / "MODEL_CARD.md").read_text()
    w = load_file(str(out / "model.safetensors"))
    l0 = "model.layers.0.self_attn"
    assert not any(w[f"{l0}.{p}_proj.weight"].any() for p in "qkvo")
    # what was trained moved: the kept heads and the Mamba-2 mixers
    assert w["model.layers.1.self_attn.q_proj.weight"].any() and w["model.layers.0.mamba.out_proj.weight"].any()
    teacher_q = teacher.hf_model.model.layers[1].self_attn.q_proj.weight
    assert not torch.equal(w["model.layers.1.self_attn.q_proj.weight"], teacher_q[2 * D_HEAD:])

    model = load_model(out, device="cpu")
    assert Counter(h.kind for h in model.heads()) == {"attn": 4, "ssm2": 8}
    assert model.unsupported() == [] and model.kv_words == teacher.kv_words
    b = model.tokenize(KVRetrieval(4, 3, seed=2, words=model.kv_words).prompts)
    with quiet_transformers():
        hf = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        ref = hf(input_ids=b.ids, attention_mask=b.attention_mask).logits
    keep = b.attention_mask.bool()
    assert ((model.forward(b) - ref)[keep].abs().max() / ref[keep].abs().max()).item() <= 1e-5
    # an unused slot's output is zero: removing it changes nothing (a scan gives it no effect)
    clean = model.forward(b)
    with ablate(model, ["L0H0", "L0H1"]):
        assert torch.equal(model.forward(b), clean)
    with ablate(model, ["L1H1"]):
        assert not torch.allclose(model.forward(b), clean)
    assert card["evaluation"]["by_pairs"]["3"]["accuracy"] == pytest.approx(
        evaluate(model, KVRetrieval(3, 4, seed=0, words=model.kv_words), progress=False).accuracy)


def test_unused_masks_cover_exactly_the_unused_slots(teacher):
    student, lay = fresh_student(teacher, [])
    masks = unused_masks(student, lay)
    assert lay.slots == 1 and len(masks) == 8  # q, k, v, o of both layers: everything is unused
    assert all(m.all() for m in masks.values())
    student, lay = fresh_student(teacher, ["L0H0", "L0H1", "L1H1"])
    masks = unused_masks(student, lay)
    assert set(masks) == {f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkvo"}
    assert masks["model.layers.1.self_attn.q_proj.weight"][D_HEAD:].all()
    assert not masks["model.layers.1.self_attn.q_proj.weight"][:D_HEAD].any()
    assert masks["model.layers.1.self_attn.o_proj.weight"][:, D_HEAD:].all()


@pytest.mark.parametrize("keep, match", [
    ("L0H3", "list of attention heads"),
    (["L5H0"], "keep: .*out of range|keep: .*layer"),
    (["L0H9"], "keep: .*out of range"),
    (["L0H1", "L0H1"], "named twice"),
    (["nonsense"], "keep: "),
])
def test_keep_is_validated(teacher, tmp_path, keep, match):
    with pytest.raises(InputError, match=match):
        build_hybrid(teacher, keep, tmp_path / "x", steps=1, log=None)
    assert not (tmp_path / "x").exists()


def test_bad_teacher_and_options_are_refused(tmp_path):
    with pytest.raises(InputError, match="Llama"):
        build_hybrid("zoo:mamba2-kv", [], tmp_path / "x", steps=1, log=None)
    with pytest.raises(OptionError, match="loss"):
        HybridConfig(loss="mse")
    with pytest.raises(OptionError, match="did you mean 'steps'"):
        HybridConfig(stpes=3)


def test_random_heads_are_seeded_and_drawn_from_every_head(teacher):
    draws = [random_heads(teacher, 2, s) for s in range(20)]
    assert draws[3] == random_heads(teacher, 2, 3) and len({tuple(d) for d in draws}) > 5
    assert {h for d in draws for h in d} == set(teacher.heads())
    with pytest.raises(InputError, match="8 attention heads"):
        random_heads(teacher, 9, 0)


def test_experiment_writes_its_outputs_and_resumes(teacher, tmp_path, monkeypatch):
    import gna_interp.experiments.hybrid_build as exp
    from gna_interp.store import FORMAT_VERSIONS, read_json

    out = tmp_path / "run"
    ranking = ["L1H3", "L0H3", "L1H2", "L0H1", "L0H0", "L0H2", "L1H1", "L1H0"]
    kw = dict(out=out, seeds=1, pairs=[3, 4], samples=4, scan=ranking, steps=2, png=False, log=None)
    res = exp.hybrid_build(teacher, 2, **kw)
    t = res.to_frame()
    assert len(t) == 3 * 2 and set(t["condition"]) == {"top", "random", "none"}
    assert set(t.loc[t["condition"] == "top", "kept"]) == {"L0H3,L1H3"}
    assert set(t.loc[t["condition"] == "none", "kept"]) == {""}
    assert set(t.loc[t["condition"] == "random", "kept"]) == {",".join(h.name for h in random_heads(teacher, 2, 0))}
    # by default only the Mamba-2 mixers train: the kept heads and the MLPs are still the teacher's
    w = load_file(str(out / "students" / "top-s0" / "model.safetensors"))
    for layer in (0, 1):
        ta = teacher.hf_model.model.layers[layer].self_attn
        assert torch.equal(w[f"model.layers.{layer}.self_attn.o_proj.weight"], ta.o_proj.weight[:, 3 * D_HEAD:])
        assert torch.equal(w[f"model.layers.{layer}.feed_forward.up_proj.weight"],
                           teacher.hf_model.model.layers[layer].mlp.up_proj.weight)
        assert w[f"model.layers.{layer}.mamba.out_proj.weight"].any()
    for c in ("top", "random", "none"):  # the table holds what each saved student's card says
        card = read_card(out / "students" / f"{c}-s0")
        for n in (3, 4):
            row = t[(t["condition"] == c) & (t["pairs"] == n)]
            assert row["accuracy"].item() == card["evaluation"]["by_pairs"][str(n)]["accuracy"]
    doc = read_json(out / "hybrid_build.json", "hybrid_build")
    assert doc["format_version"] == FORMAT_VERSIONS["hybrid_build"] and len(doc["table"]) == 6
    assert (out / "hybrid_build.csv").is_file() and (out / "report.html").is_file()
    assert {"top_beats_random", "top_beats_none", "margin_random"} <= set(res.metrics)
    assert exp.HybridBuild.load(out).by_condition().equals(res.by_condition())
    ref = res.reference.set_index("pairs")
    assert ref.loc[3, "teacher"] >= 0.75  # the intact teacher on the students' prompts
    res.figure()

    with pytest.raises(InputError, match="--resume"):
        exp.hybrid_build(teacher, 2, **kw)
    real, built = exp.build_hybrid, []
    monkeypatch.setattr(exp, "build_hybrid", lambda *a, **k: pytest.fail("a finished student was rebuilt"))
    again = exp.hybrid_build(teacher, 2, resume=True, **kw)
    assert again.to_frame().equals(t)
    assert set(exp.hybrid_build(teacher, 2, resume=True, **{**kw, "conditions": ["top"]}).to_frame()["condition"]) \
        == {"top"}
    # more seeds resume too: only the missing student is built
    monkeypatch.setattr(exp, "build_hybrid", lambda *a, **k: built.append(k["seed"]) or real(*a, **k))
    more = exp.hybrid_build(teacher, 2, resume=True, **{**kw, "conditions": ["none"], "seeds": 2})
    assert built == [1] and sorted(set(more.to_frame()["seed"])) == [0, 1]
    # a recorded student whose card is gone (its folder deleted or cut short) is built again, and only it
    (out / "students" / "top-s0" / "card.json").unlink()
    built.clear()
    rebuilt = exp.hybrid_build(teacher, 2, resume=True, **kw)
    assert built == [0] and (out / "students" / "top-s0" / "card.json").is_file() and len(rebuilt.to_frame()) == 6
    with pytest.raises(InputError, match="different run"):
        exp.hybrid_build(teacher, 1, resume=True, **kw)


@pytest.mark.skipif(SHIPPED not in zoo_names(), reason="the shipped hybrid is not installed")
def test_shipped_guided_hybrid_loads_lists_its_heads_and_scans():
    from gna_interp.circuits.scan import scan_heads

    card = read_card(zoo_dir() / SHIPPED)
    model = load_model(f"zoo:{SHIPPED}", device="cpu")
    cfg = model.hf_model.config
    counts = Counter(h.kind for h in model.heads())
    assert counts == {"attn": cfg.num_hidden_layers * cfg.num_attention_heads,
                      "ssm2": cfg.num_hidden_layers * cfg.mamba_n_heads}
    assert card["hybrid"]["chosen_by"].startswith("the top") and card["hybrid"]["unused_slots"] == []
    assert sorted(card["hybrid"]["slots"]) == [h.name for h in model.heads(kind="attn")]
    task = KVRetrieval(5, 8, seed=3, words=model.kv_words)
    scan = scan_heads(model, task, strategy="naive", progress=False)
    frame = scan.to_frame()
    assert len(frame) == len(model.heads()) and frame["drop"].notna().all()
    ev = card["evaluation"]
    acc = evaluate(model, KVRetrieval(10, ev["n_samples"], seed=ev["seed"], words=model.kv_words), progress=False)
    assert abs(acc.accuracy - ev["by_pairs"]["10"]["accuracy"]) <= 0.02
    assert sum(f.stat().st_size for f in (zoo_dir() / SHIPPED).iterdir()) < 1.5 * 2**20


def test_cli_builds_from_a_saved_scan_and_refuses_bad_arguments(teacher, tmp_path, capsys):
    from gna_interp.circuits.scan import scan_heads
    from gna_interp.cli import main

    scan = scan_heads(teacher, KVRetrieval(5, 8, seed=1, words=teacher.kv_words), strategy="naive", progress=False)
    scan.save(tmp_path / "scan.json")
    out = tmp_path / "run"
    argv = ["hybrid", "build", "--keep", "top,none", "--k", "1", "--seeds", "1", "--steps", "1", "--pairs", "3",
            "--samples", "4", "--scan", str(tmp_path / "scan.json"), "--out", str(out), "--no-png"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    top = scan.top(1)[0].name
    assert f"top heads {top}" in printed and "top beats none at every size" in printed
    assert read_card(out / "students" / "top-s0")["hybrid"]["kept"] == [top]
    assert main(argv) == 2 and "--resume" in capsys.readouterr().err  # a finished run is not overwritten silently
    assert main(["hybrid", "build", "--keep", "best"]) == 2
    assert main(["hybrid", "build", "--scan", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err
