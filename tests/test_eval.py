"""`gna eval`: the lm-evaluation-harness model over `Model` (GnaLM), `eval_heads` and the command.

Offline: local task YAML files over jsonl (a multiple-choice task and a generation task with exact match),
tiny random models from conftest. The harness's numbers are checked against gna_interp's own scoring
engine (`score_candidates` / `evaluate`, with `ablate` and `mask_pattern`) and against lm-eval's own
Hugging Face model (`HFLM`) loading the same checkpoint.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from gna_interp.cli import main  # noqa: E402
from gna_interp.errors import InputError  # noqa: E402
from gna_interp.experiments.eval import SUMMARY_COLUMNS, TABLE_COLUMNS, EvalResult, eval_heads  # noqa: E402
from gna_interp.experiments.eval_tasks import TASKS_DIR, task_paths, write_jsonl, write_task_folder  # noqa: E402
from gna_interp.experiments.harness import FullMask, GnaLM  # noqa: E402
from gna_interp.interventions import ablate, mask_pattern  # noqa: E402
from gna_interp.tasks import KVRetrieval, Sample, evaluate  # noqa: E402
from gna_interp.engine import score_candidates  # noqa: E402

SHIPPED = TASKS_DIR  # gna_interp/data/eval_tasks: package data of the wheel
# multi-digit values: " 4" is a prefix of " 42" on the byte tokenizer, so rows are shared and deduplicated
MC = KVRetrieval(n_pairs=4, n_samples=6, max_value=60, seed=5)
GEN = KVRetrieval(n_pairs=4, n_samples=5, max_value=60, seed=6)
HEADS = ["L1H0", "L2H3"]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two lm-eval tasks in the plain lm-eval way (`dataset_path: json` over absolute jsonl paths)."""
    d = tmp_path_factory.mktemp("tasks")
    with open(d / "mc.jsonl", "w") as f:
        for s in MC:
            f.write(json.dumps({"prompt": s.prompt, "choices": list(s.candidates), "answer": s.gold}) + "\n")
    with open(d / "gen.jsonl", "w") as f:
        for s in GEN:
            f.write(json.dumps({"prompt": s.prompt, "answer": str(s.meta["value"])}) + "\n")
    (d / "t_mc.yaml").write_text(f"""task: t_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {d / 'mc.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: prompt
doc_to_choice: choices
doc_to_target: answer
target_delimiter: ""
metric_list:
  - metric: acc
""")
    (d / "t_gen.yaml").write_text(f"""task: t_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {d / 'gen.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: prompt
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 5
  do_sample: false
metric_list:
  - metric: exact_match
""")
    return d


@pytest.fixture(scope="module")
def manager(task_dir: Path) -> TaskManager:
    return TaskManager(include_path=str(task_dir), include_defaults=False)


def _choice_logprobs(lm: GnaLM, manager: TaskManager) -> tuple[torch.Tensor, float]:
    """Per-document, per-choice log-likelihoods of t_mc through lm-eval, and its accuracy."""
    res = lm_eval.simple_evaluate(model=lm, tasks=["t_mc"], task_manager=manager, log_samples=True,
                                  bootstrap_iters=0)
    docs = sorted(res["samples"]["t_mc"], key=lambda s: s["doc_id"])
    n_c = max(len(s.candidates) for s in MC)
    out = torch.full((len(docs), n_c), -math.inf, dtype=torch.float64)
    for i, d in enumerate(docs):
        for j, (ll, _greedy) in enumerate(r[0] for r in d["resps"]):
            out[i, j] = ll
    return out, res["results"]["t_mc"]["acc,none"]


def test_registered_with_lm_eval(tiny_dirs):
    from lm_eval.api.registry import get_model

    assert get_model("gna") is GnaLM
    lm = GnaLM.create_from_arg_string(f"model={tiny_dirs['llama']},heads=L1H0 L2H3", {"batch_size": 4})
    assert [h.name for h in lm.heads] == HEADS and lm.batch_size == 4
    assert "zero-ablated L1H0,L2H3" in lm.describe()


@pytest.mark.parametrize("family", ["llama", "mamba2", "bamba"])
def test_loglikelihoods_equal_the_scoring_engine(tiny_models, manager, family):
    """lm-eval's multiple-choice log-likelihoods through GnaLM equal score_candidates on the same items (1e-6),
    intact and with heads ablated; lm-eval's accuracy equals evaluate's."""
    model = tiny_models[family]
    heads = [h.name for h in model.heads()[:2]]
    got, acc = _choice_logprobs(GnaLM(model, batch_size=4, progress=False), manager)
    want = score_candidates(model, MC.samples, batch_size=4).scores
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    assert (got - want)[finite].abs().max().item() < 1e-6
    assert acc == pytest.approx(evaluate(model, MC, batch_size=4, progress=False).accuracy, abs=1e-7)  # float32 mean

    cut, _ = _choice_logprobs(GnaLM(model, heads=heads, batch_size=3, progress=False), manager)
    with ablate(model, heads):
        want_cut = score_candidates(model, MC.samples, batch_size=3).scores
    assert (cut - want_cut)[finite].abs().max().item() < 1e-6
    assert (cut - got)[finite].abs().max().item() > 1e-3  # the ablation is real


def test_mean_ablation_uses_the_neutral_reference(tiny_models, manager):
    """method="mean": each head's mean output over the shipped neutral prose, as ablate(..., "mean") gives."""
    from gna_interp.experiments.harness import neutral_reference

    model = tiny_models["llama"]
    got, _ = _choice_logprobs(GnaLM(model, heads=HEADS, method="mean", batch_size=4, progress=False), manager)
    with ablate(model, HEADS, "mean", reference=neutral_reference()):
        want = score_candidates(model, MC.samples, batch_size=4).scores
    zero, _ = _choice_logprobs(GnaLM(model, heads=HEADS, batch_size=4, progress=False), manager)
    finite = torch.isfinite(want)
    assert (got - want)[finite].abs().max().item() < 1e-6
    assert (got - zero)[finite].abs().max().item() > 1e-4


def test_loglikelihoods_equal_lm_evals_hf_model(tiny_dirs, tiny_models):
    """The same requests through lm-eval's own HFLM on the same checkpoint: log-likelihoods, greedy flags,
    rolling log-likelihoods over several windows, and generations agree."""
    from lm_eval.models.huggingface import HFLM

    hf = HFLM(pretrained=str(tiny_dirs["llama"]), device="cpu", batch_size=3, max_length=24)
    lm = GnaLM(tiny_models["llama"], batch_size=3, max_length=24, progress=False)
    pairs = [("Hello there", " world"), ("Hello there", " w"), ("A longer context with words:", " 42"),
             ("", "abc"), ("x ", "yz"), ("The value of the key 'dog' is", " 17")]
    reqs = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    a, b = lm.loglikelihood(reqs, disable_tqdm=True), hf.loglikelihood(reqs, disable_tqdm=True)
    assert [x[1] for x in a] == [y[1] for y in b]
    assert max(abs(x[0] - y[0]) for x, y in zip(a, b)) < 1e-4  # HFLM sums in float32
    text = "a rolling text longer than one window of twenty-four tokens, " * 2
    rolling = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate([text, "short"])]
    ra, rb = lm.loglikelihood_rolling(rolling, disable_tqdm=True), hf.loglikelihood_rolling(rolling, disable_tqdm=True)
    assert len(lm.tok_encode(text)) > 3 * 24 and ra == pytest.approx(rb, abs=1e-3)
    gens = [Instance("generate_until", {}, (c, {"until": ["zz"], "max_gen_toks": 6}), i)
            for i, c in enumerate(["The value is", "Hi", "Another, longer prompt"])]
    assert lm.generate_until(gens, disable_tqdm=True) == hf.generate_until(gens, disable_tqdm=True)


def test_rolling_equals_one_forward(tiny_models):
    """A text within one window: the rolling log-likelihood is the summed float32 log-softmax of one forward."""
    model = tiny_models["llama"]
    lm = GnaLM(model, progress=False)
    text = "Memorize the following dictionary"
    ids = [lm.prefix_token_id] + lm.tok_encode(text)
    logp = torch.log_softmax(model.forward(torch.tensor([ids]))[0].float(), -1)
    want = sum(logp[i, ids[i + 1]].item() for i in range(len(ids) - 1))
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)[0]
    assert got == pytest.approx(want, abs=1e-5)


def test_masks_through_the_harness(tiny_models, manager):
    """A fully masked attention pattern outputs zero: the same as zero-ablating the head; an all-ones mask
    changes nothing (and runs unpacked full rows, which must give the packed numbers)."""
    model = tiny_models["llama"]
    intact, _ = _choice_logprobs(GnaLM(model, batch_size=4, progress=False), manager)
    ones, _ = _choice_logprobs(GnaLM(model, mask=lambda b: {"L1H0": torch.ones(b.ids.shape[1], b.ids.shape[1])},
                                     batch_size=4, progress=False), manager)
    full, _ = _choice_logprobs(GnaLM(model, mask="L1H0 L2H3", batch_size=4, progress=False), manager)
    cut, _ = _choice_logprobs(GnaLM(model, heads=HEADS, batch_size=4, progress=False), manager)
    finite = torch.isfinite(intact)
    assert (ones - intact)[finite].abs().max().item() < 1e-6
    assert (full - cut)[finite].abs().max().item() < 1e-6
    assert (full - intact)[finite].abs().max().item() > 1e-3
    lm = GnaLM(model, mask=FullMask(("L1H0",)), progress=False)
    assert lm.describe().endswith("patterns masked (L1H0)")


def _reference_generation(model, prompt: str, n: int) -> list[int]:
    """Greedy tokens by full forwards of one unpadded prompt (Model.generate's loop, no cache)."""
    ids = model.tokenize(prompt).ids
    out = []
    for _ in range(n):
        nxt = model.forward(ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
        out.append(int(nxt))
    return out


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_generation_is_greedy_batched_and_stops(tiny_models, family):
    """Batched, left-padded generation (KV cache on attention models, recomputed rows on SSMs) equals one
    prompt at a time; max_gen_toks bounds it; a stop string cuts it; ablation applies to every step."""
    model = tiny_models[family]
    lm = GnaLM(model, batch_size=3, progress=False)
    prompts = [s.prompt for s in GEN][:3] + ["Hi"]
    refs = [_reference_generation(model, p, 6) for p in prompts]
    got = lm.generate_until([Instance("generate_until", {}, (p, {"until": [], "max_gen_toks": 6}), i)
                             for i, p in enumerate(prompts)], disable_tqdm=True)
    assert got == [lm.tok_decode(r) for r in refs]
    # a stop string: the first printable ASCII character generated after the first token (random weights
    # mostly emit bytes >= 0x80, so look along 16 tokens of every prompt)
    longer = {p: _reference_generation(model, p, 16) for p in prompts}
    p, stop = next((p, c) for p, toks in longer.items() for c in (lm.tok_decode([t]) for t in toks[1:])
                   if c.isascii() and c.isprintable() and c.strip())
    stopped = lm.generate_until([Instance("generate_until", {}, (p, {"until": [stop], "max_gen_toks": 16}), 0)],
                                disable_tqdm=True)[0]
    full = lm.tok_decode(longer[p])
    assert stopped == full.split(stop)[0] and len(stopped) < len(full)
    heads = [h.name for h in model.heads()[:2]]
    with ablate(model, heads):
        cut_ref = [lm.tok_decode(_reference_generation(model, p, 4)) for p in prompts]
    cut = GnaLM(model, heads=heads, batch_size=3, progress=False).generate_until(
        [Instance("generate_until", {}, (p, {"until": [], "max_gen_toks": 4}), i) for i, p in enumerate(prompts)],
        disable_tqdm=True)
    assert cut == cut_ref


def test_generation_refuses_sampling(tiny_models):
    lm = GnaLM(tiny_models["llama"], progress=False)
    with pytest.raises(InputError, match="greedily"):
        lm.generate_until([Instance("generate_until", {}, ("x", {"do_sample": True, "temperature": 0.7}), 0)])
    with pytest.raises(InputError, match="num_beams"):
        lm.generate_until([Instance("generate_until", {}, ("x", {"num_beams": 4}), 0)])


def test_harness_rejects_bad_arguments(tiny_models, tiny_dirs, tmp_path):
    model = tiny_models["llama"]
    from gna_interp.errors import HeadError

    with pytest.raises(HeadError):
        GnaLM(model, heads="L9H0")
    with pytest.raises(InputError, match="resample"):
        GnaLM(model, heads="L1H0", method="resample")
    with pytest.raises(InputError, match="not both"):
        GnaLM(model, heads="L1H0", circuit=tmp_path)
    with pytest.raises(InputError, match="circuit.json"):
        GnaLM(model, circuit=tmp_path)


def test_eval_heads_table_and_resume(tiny_models, manager, task_dir, tmp_path):
    """The paper's table from three conditions; the numbers are those of evaluate (MC) and of greedy
    generation + exact match (generation); a rerun with resume reuses every condition."""
    model = tiny_models["llama"]
    res = eval_heads(model, ["t_mc", "t_gen"], heads=HEADS, random_k=1, seeds=2, out=tmp_path / "ev",
                     include_path=task_dir, batch_size=4, progress=False, png=False)
    t = res.table
    assert list(t.columns) == TABLE_COLUMNS
    assert sorted(t["condition"].unique()) == ["intact", "random", "removed"]
    assert len(t) == 4 * 2 and set(t["task"]) == {"t_mc", "t_gen"}
    mc = t[t["task"] == "t_mc"].set_index(t[t["task"] == "t_mc"]["condition"] + t[t["task"] == "t_mc"]["seed"]
                                          .fillna(-1).astype(int).astype(str))
    assert mc.loc["intact-1", "value"] == pytest.approx(evaluate(model, MC, batch_size=4, progress=False).accuracy)
    with ablate(model, HEADS):
        assert mc.loc["removed-1", "value"] == pytest.approx(evaluate(model, MC, progress=False).accuracy)
    with ablate(model, res.random_heads[1]):
        assert mc.loc["random1", "value"] == pytest.approx(evaluate(model, MC, progress=False).accuracy)
    assert mc.loc["intact-1", "stderr"] > 0 and mc.loc["intact-1", "n_samples"] == len(MC)
    assert all(len(h) == 1 and h[0] not in HEADS for h in res.random_heads)
    s = res.summary
    assert list(s.columns) == SUMMARY_COLUMNS and len(s) == 2
    row = s[s["task"] == "t_mc"].iloc[0]
    assert row["random_seeds"] == 2
    assert row["random_mean"] == pytest.approx(mc.loc[["random0", "random1"], "value"].mean())
    out = tmp_path / "ev"
    for f in ("eval.csv", "eval_summary.csv", "eval.json", "report.html", "conditions/intact.json",
              "conditions/random-1.json"):
        assert (out / f).is_file(), f
    back = EvalResult.load(out)
    assert back.heads == HEADS and back.summary.equals(s)
    assert "t_mc" in res.format_table() and "2 heads removed" in res.format_table()
    again = eval_heads(model, ["t_mc", "t_gen"], heads=HEADS, random_k=1, seeds=2, out=out, include_path=task_dir,
                       batch_size=4, progress=False, png=False, resume=True)
    assert set(again.seconds.values()) == {0.0} and again.table.equals(res.table)
    with pytest.raises(InputError, match="other settings"):
        eval_heads(model, ["t_mc", "t_gen"], heads=HEADS, random_k=1, seeds=2, out=out, include_path=task_dir,
                   limit=2, progress=False, png=False, resume=True)
    with pytest.raises(InputError, match="--resume continues it"):  # neither resume nor fresh: refused up front
        eval_heads(model, ["t_mc", "t_gen"], heads=HEADS, random_k=1, seeds=2, out=out, include_path=task_dir,
                   limit=2, progress=False, png=False)
    again = eval_heads(model, ["t_mc", "t_gen"], heads=HEADS, random_k=1, seeds=2, out=out, include_path=task_dir,
                       limit=2, progress=False, png=False, fresh=True)
    assert again.settings["limit"] == 2 and min(again.seconds.values()) > 0  # every condition ran again
    assert (out / "conditions/random-1.json").is_file()


def test_eval_heads_takes_a_circuits_top_k(tiny_models, task_dir, tmp_path):
    """--circuit: its top-k heads are removed, and the random draws are the scan curve's random heads."""
    from gna_interp.circuits import discover

    model = tiny_models["llama"]
    circuit = discover(model, KVRetrieval(n_pairs=3, n_samples=4, max_value=20, seed=3), strategy="auto",
                       allow_chance=True, verify=6, k=3, seeds=2, batch_size=4, role_samples=2, progress=False,
                       control=False, n_cards=0)
    folder = circuit.save(tmp_path / "scan")
    res = eval_heads(model, "t_mc", circuit=folder, top_k=3, random_k=2, seeds=2, include_path=task_dir,
                     progress=False, limit=3)
    assert res.heads == [h.name for h in circuit.heads[:3]]
    curve = circuit.curve
    for s in (0, 1):  # the curve measures seed 1's order at k = 3 only (its band is seed 0): its first two heads
        drawn = curve[(curve["series"] == "random") & (curve["seed"] == s) & (curve["k"] == 3)]["heads"].iloc[0]
        assert res.random_heads[s] == drawn.split(",")[:2]
    with pytest.raises(InputError, match="random-k"):
        eval_heads(model, "t_mc", heads=HEADS, random_k=len(model.default_heads()), include_path=task_dir,
                   progress=False)


def test_unknown_task_lists_close_names(task_dir):
    from gna_interp.experiments.eval import resolve_tasks

    with pytest.raises(InputError, match="close: t_mc"):
        resolve_tasks("t_mcc", task_dir)
    assert resolve_tasks("t_mc, t_gen", task_dir)[0] == ["t_mc", "t_gen"]


def test_shipped_example_tasks(tiny_models, tmp_path, monkeypatch):
    """gna_interp/data/eval_tasks: the MC and generation tasks are found with no include path, load from any
    working directory (custom loader), their documents are gna_interp KV samples, and the MC task scores as
    evaluate does."""
    from gna_interp.experiments.eval import resolve_tasks
    from gna_interp.tasks.kv import KVRetrieval as KV

    rows = [json.loads(x) for x in (SHIPPED / "gna_kv_mc.jsonl").read_text().splitlines()]
    want = KV(10, 50, seed=101, max_value=9)
    assert [r["prompt"] for r in rows] == want.prompts and [r["answer"] for r in rows] == [s.gold for s in want]
    rebuilt = tmp_path / "rebuilt"  # the generator writes the shipped files byte for byte
    rebuilt.mkdir()
    write_jsonl(rebuilt)
    for f in ("gna_kv_mc.jsonl", "gna_kv_gen.jsonl"):
        assert (rebuilt / f).read_bytes() == (SHIPPED / f).read_bytes(), f
    names, manager = resolve_tasks("gna_kv_mc,gna_kv_gen")  # no include path; only the shipped folder indexed
    assert names == ["gna_kv_mc", "gna_kv_gen"] and set(manager.all_tasks) == {"gna_kv_mc", "gna_kv_gen"}
    monkeypatch.chdir(tmp_path)
    model = tiny_models["llama"]
    res = eval_heads(model, "gna_kv_mc,gna_kv_gen", heads=HEADS, random_k=0, limit=3, progress=False)
    t = res.table
    assert set(t["condition"]) == {"intact", "removed"} and res.random_heads == []
    assert set(zip(t["task"], t["metric"], t["filter"])) == {("gna_kv_mc", "acc", "none"),
                                                              ("gna_kv_gen", "exact_match", "first-digit")}
    three = [Sample(r["prompt"], tuple(r["choices"]), r["answer"]) for r in rows[:3]]
    acc = score_candidates(model, three).correct.float().mean().item()
    assert t[(t["task"] == "gna_kv_mc") & (t["condition"] == "intact")]["value"].iloc[0] == pytest.approx(acc)


def test_the_shipped_tasks_need_no_include_path(task_dir, tmp_path):
    """task_paths: the shipped folder first, then the user's; a folder that redefines a shipped task replaces the
    shipped folder. gna lm-eval adds it to lm-eval's --include_path (or its --config file's include_path)."""
    import argparse

    from gna_interp.cli.eval import _with_shipped_tasks

    assert task_paths() == [str(TASKS_DIR)]
    assert task_paths(task_dir) == [str(TASKS_DIR), str(task_dir)]
    copy = write_task_folder(tmp_path / "copy")
    assert task_paths([task_dir, copy]) == [str(task_dir), str(copy)]
    assert _with_shipped_tasks(argparse.Namespace(include_path=None)) == [str(TASKS_DIR)]
    assert _with_shipped_tasks(argparse.Namespace(include_path=str(task_dir), config=None)) == \
        [str(TASKS_DIR), str(task_dir)]
    config = tmp_path / "run.yaml"
    config.write_text(f"include_path: {task_dir}\n")
    assert _with_shipped_tasks(argparse.Namespace(include_path=None, config=str(config))) == \
        [str(TASKS_DIR), str(task_dir)]


def test_cli_writes_its_folder(tiny_dirs, task_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["eval", "--model", str(tiny_dirs["llama"]), "--tasks", "t_mc,t_gen", "--include-path", str(task_dir),
                 "--ablate", "L1H0,L2H3", "--random-k", "1", "--seeds", "2", "--limit", "3", "--out", str(out),
                 "--no-png", "--batch-size", "4"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "intact" in printed and "2 heads removed" in printed and "t_gen" in printed
    for f in ("eval.csv", "eval_summary.csv", "eval.json", "report.html"):
        assert (out / f).is_file()
    assert "<table>" in (out / "report.html").read_text()
    # a second run into the same folder must say what to do with the finished conditions
    code = main(["eval", "--model", str(tiny_dirs["llama"]), "--tasks", "t_mc", "--include-path", str(task_dir),
                 "--ablate", "L1H0", "--out", str(out)])
    assert code == 2 and "--resume" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "t_mcc"], "close: t_mc"),
    (["--tasks", "t_mc", "--ablate", "L9H0"], "layer 9 is out of range"),
    (["--tasks", "t_mc", "--circuit", "/no/such/run"], "/no/such/run"),
    (["--tasks", "t_mc", "--include-path", "/no/such/dir"], "not a folder"),
    (["--tasks", "t_mc", "--limit", "0"], "--limit"),
    (["--tasks", "t_mc", "--ablate", "L1H0", "--circuit", "x"], "not allowed with"),
])
def test_cli_bad_input(tiny_dirs, task_dir, tmp_path, capsys, argv, message):
    if "--include-path" not in argv:
        argv = argv + ["--include-path", str(task_dir)]
    code = main(["eval", "--model", str(tiny_dirs["llama"]), "--out", str(tmp_path / "o")] + argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_cli_says_how_to_install_lm_eval(tiny_dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    code = main(["eval", "--model", str(tiny_dirs["llama"]), "--tasks", "mmlu", "--out", str(tmp_path / "o")])
    from gna_interp.errors import install_hint

    err = capsys.readouterr().err
    assert code == 2 and install_hint("eval") in err and "[eval]" in err


def test_zoo_transformer_loses_retrieval_with_its_ga_heads(tmp_path):
    """The shipped tasks rebuilt with the zoo Transformer's key words (eval_tasks.write_task_folder): intact it solves both;
    its two G&A heads removed, both fall near chance (0.1) while two random heads cost little -- the paper's
    table on a model small enough for CI. The generation score is the model's own greedy answers."""
    from gna_interp.models import load_model, zoo_names

    if "transformer-kv" not in zoo_names():
        pytest.skip("the zoo Transformer is not installed")
    model = load_model("zoo:transformer-kv")
    tasks = write_task_folder(tmp_path / "tasks", list(model.kv_words))
    assert task_paths(tasks) == [str(tasks)]  # a folder redefining the shipped tasks replaces them
    res = eval_heads(model, "gna_kv_mc,gna_kv_gen", heads="L0H3,L1H3", random_k=2, seeds=2, limit=20,
                     include_path=tasks, progress=False)
    s = res.summary.set_index("task")
    assert s.loc["gna_kv_mc", "intact"] >= 0.9 and s.loc["gna_kv_gen", "intact"] >= 0.9
    assert s.loc["gna_kv_mc", "removed"] <= 0.3 and s.loc["gna_kv_gen", "removed"] <= 0.3
    assert (s["random_mean"] >= 0.7).all()
    rows = [json.loads(x) for x in (tasks / "gna_kv_gen.jsonl").read_text().splitlines()][:20]
    lm = GnaLM(model, heads="L0H3,L1H3", progress=False)
    outs = lm.generate([lm.tok_encode(r["prompt"]) for r in rows], ["\n", "."], 4)
    hits = [bool(m) and m.group(0) == r["answer"] for m, r in zip((re.search(r"\d", o) for o in outs), rows)]
    assert s.loc["gna_kv_gen", "removed"] == pytest.approx(sum(hits) / len(hits))


def test_zoo_model_refuses_the_shipped_tasks_words_and_says_to_rebuild_them(tmp_path, capsys):
    """The shipped gna_kv_mc prompts draw keys from the whole word list, which the zoo Transformer does not know:
    every request reaches tok_encode, which refuses the unknown words (scored as [UNK] they gave chance accuracy)
    and says how to rebuild the tasks with the model's own words; `gna eval` on them exits with that message."""
    from gna_interp.models import load_model, zoo_names

    if "transformer-kv" not in zoo_names():
        pytest.skip("the zoo Transformer is not installed")
    model = load_model("zoo:transformer-kv")
    row = json.loads((SHIPPED / "gna_kv_mc.jsonl").read_text().splitlines()[0])
    lm = GnaLM(model, progress=False)
    rebuild = (r"an lm-eval request holds text outside zoo:transformer-kv's vocabulary \(it becomes '\[UNK\]'\): "
               r"\[.+\]; this model knows only its own keys \(model\.kv_words, 64 words\): rebuild the tasks with them "
               r"\(python -m gna_interp\.experiments\.eval_tasks --model zoo:transformer-kv --out DIR, or "
               r"eval_tasks\.write_task_folder\(DIR, model\.kv_words\)\) and pass --include-path DIR")
    with pytest.raises(InputError, match=rebuild):
        lm.tok_encode(row["prompt"])
    with pytest.raises(InputError, match=rebuild):
        lm.loglikelihood([Instance(request_type="loglikelihood", doc={}, arguments=(row["prompt"], c), idx=i)
                          for i, c in enumerate(row["choices"])], disable_tqdm=True)
    own = KVRetrieval(n_pairs=4, n_samples=1, max_value=9, seed=0, words=model.kv_words).samples[0].prompt
    assert lm.tok_encode(own) == model.to_tokens(own)[0].tolist()
    capsys.readouterr()
    assert main(["eval", "--model", "zoo:transformer-kv", "--tasks", "gna_kv_mc", "--ablate", "L0H3,L1H3",
                 "--random-k", "0", "--limit", "2", "--out", str(tmp_path / "o")]) == 2
    assert re.search(rebuild, capsys.readouterr().err)


def test_lm_evals_own_cli_finds_the_gna_model(tiny_dirs, monkeypatch, capsys):
    """`gna lm-eval run ...` hands its arguments to lm-eval's own parser with model class "gna" registered; the
    model built from what that parser made carries the heads (running the tasks themselves is what
    test_cli_writes_its_folder covers; lm-eval's CLI indexes every built-in task first, ~25 s)."""
    from lm_eval._cli import HarnessCLI
    from lm_eval.api.registry import get_model

    seen = {}
    monkeypatch.setattr(HarnessCLI, "execute", lambda self, args: seen.setdefault("args", args))
    code = main(["lm-eval", "run", "--model", "gna", "--model_args", f"model={tiny_dirs['llama']}", "heads=L1H0;L2H3",
                 "--tasks", "t_mc", "--limit", "2"])
    args = seen["args"]
    assert code == 0 and args.model == "gna" and args.tasks == ["t_mc"]
    assert args.device == ("cpu" if not torch.cuda.is_available() else args.device)
    lm = get_model(args.model).create_from_arg_obj(args.model_args, {"device": args.device})
    assert isinstance(lm, GnaLM) and [h.name for h in lm.heads] == HEADS
    assert sys.argv[0] != "lm-eval"  # put back
    assert main(["lm-eval", "--model", "gna"]) == 2
    assert main(["lm-eval"]) == 2 and "needs one of lm-eval's subcommands" in capsys.readouterr().err


def test_model_args_string_builds_gnalm_on_the_zoo_model():
    """lm-eval's own route from ``--model_args``: the registry's ``gna`` class built from an argument string
    carries the options in its config, and a loglikelihood request through it equals the plain path (GnaLM built
    directly, and the scoring engine with the head ablated)."""
    from lm_eval.api.registry import get_model

    from gna_interp.models import load_model

    lm = get_model("gna").create_from_arg_string("pretrained=zoo:transformer-kv,heads=L1H3,batch_size=4,progress=false")
    assert isinstance(lm, GnaLM)
    assert (lm.config.heads, lm.config.batch_size, lm.config.progress) == ("L1H3", 4, False)
    assert [h.name for h in lm.heads] == ["L1H3"] and lm.batch_size == 4 and lm.model.name == "zoo:transformer-kv"
    model = load_model("zoo:transformer-kv")
    sample = KVRetrieval(n_pairs=6, n_samples=1, max_value=9, seed=11, words=model.kv_words).samples[0]
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=(sample.prompt, c), idx=i)
                for i, c in enumerate(sample.candidates)]
    got = torch.tensor([ll for ll, _greedy in lm.loglikelihood(requests, disable_tqdm=True)], dtype=torch.float64)
    plain = GnaLM(model, heads="L1H3", batch_size=4, progress=False)
    assert got.tolist() == [ll for ll, _ in plain.loglikelihood(requests, disable_tqdm=True)]
    with ablate(model, ["L1H3"]):
        want = score_candidates(model, [sample], batch_size=4).scores[0].double()
    assert (got - want).abs().max().item() < 1e-5
    intact = torch.tensor([ll for ll, _ in GnaLM(model, progress=False).loglikelihood(requests, disable_tqdm=True)])
    assert (intact.double() - got).abs().max().item() > 1e-4  # the head's removal shows in the numbers
