"""The tiny model zoo: tokenizer, smoke training, reproducibility, and the shipped checkpoints."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gna_interp import load_model, patterns
from gna_interp.cli import main
from gna_interp.errors import InputError, UnknownModelError
from gna_interp.models import zoo_dir, zoo_names
from gna_interp.tasks import KVRetrieval, Sample, evaluate
from gna_interp.engine.plan import plan_scoring
from gna_interp.tasks.words import word_list
from gna_interp.zoo import RECIPES, build_tokenizer, read_card, recipe, train, training_batch
from gna_interp.zoo.tokenizer import DROPPED, N_KEYS, zoo_keys

ZOO = ("transformer-kv", "mamba1-kv", "mamba2-kv", "hybrid-kv")
# the accuracy each zoo model must reach at its training dictionary size (SSMs are reported, not gated)
BARS = {"transformer-kv": 0.95, "hybrid-kv": 0.90}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_tokenizer_covers_the_official_template(tok) -> None:
    task = KVRetrieval(40, 8, seed=3, words=zoo_keys())
    for s in task:
        prompt = tok(s.prompt)["input_ids"]
        ids = tok(s.prompt + s.answer)["input_ids"]
        assert tok.unk_token_id not in ids
        # separators, line breaks, quotes and the cue's closing "' is" are dropped, nothing else
        assert tok.decode(prompt) == re.sub(DROPPED, "", s.prompt)
        # 4 header tokens, then key and value (one token each), then the 6-token cue ending with the key
        assert len(prompt) == 4 + 2 * 40 + 6
        assert tok.convert_ids_to_tokens(prompt[-6:]) == ["The", " value", " of", " the", " key", s.meta["key"]]
        # the answer " V" is one token, the very token of its dictionary line
        assert ids[:-1] == prompt and ids[-1] == tok.convert_tokens_to_ids(str(s.meta["value"]))
    seg = task[0].segments(tok)
    assert seg.aligned and len(seg.items) == 40 and seg.final == len(tok(task[0].prompt)["input_ids"]) - 1
    # each line's summary token is its value
    ids = tok(task[0].prompt)["input_ids"]
    assert all(tok.convert_ids_to_tokens(ids[it.summary]).isdigit() for it in seg.items)


def test_training_batch_is_deterministic_and_official(tok) -> None:
    r = recipe("transformer-kv")
    x1, p1, v1 = training_batch(tok, r, 7)
    x2, p2, v2 = training_batch(tok, r, 7)
    assert torch.equal(x1, x2) and torch.equal(p1, p2) and torch.equal(v1, v2)
    assert x1.shape[0] == r.batch_size and v1.shape == (r.batch_size, len(p1))
    keys = set(zoo_keys())
    cue = ["The", " value", " of", " the", " key"]
    for row in range(3):
        toks = tok.convert_ids_to_tokens(x1[row].tolist())
        assert toks[:4] == ["Memorize", " the", " following", " dictionary"]
        cut = toks.index("The")
        lines = dict(zip(toks[4:cut:2], toks[5:cut:2]))  # key, value per line
        assert set(lines) <= keys and all(v.isdigit() for v in lines.values())
        # every answer is predicted at the asked key; the first query is exactly an official prompt,
        # then restated lines and official questions alternate
        at = [toks[p] for p in p1]
        assert all(a in lines for a in at)
        assert int(p1[0]) == cut + 5 and toks[cut:cut + 5] == cue
        assert all(toks[p - 5:p] == cue for p in p1[2::2].tolist())
        assert all(toks[p - 1].isdigit() for p in p1[1::2].tolist())
        assert all(tok.convert_ids_to_tokens(int(v)) == lines[k] for v, k in zip(v1[row], at))
    x3, _, _ = training_batch(tok, r, 8)
    assert x1.shape != x3.shape or not torch.equal(x1, x3)


def test_unknown_zoo_name_lists_the_names() -> None:
    with pytest.raises(UnknownModelError, match="transformer-kv"):
        recipe("nope")
    with pytest.raises(UnknownModelError, match="available zoo models"):
        load_model("zoo:nope")
    assert main(["zoo", "train", "nope"]) == 2


@pytest.mark.parametrize("name", ZOO)
def test_smoke_training_writes_a_loadable_checkpoint(name: str, tmp_path: Path) -> None:
    res = train(name, tmp_path / name, steps=2, eval_sizes=(3,), eval_samples=4, log=None)
    assert len(res.losses) == 2 and all(torch.isfinite(torch.tensor(res.losses)))
    for f in ("config.json", "model.safetensors", "tokenizer.json", "card.json", "MODEL_CARD.md"):
        assert (tmp_path / name / f).is_file(), f
    card = read_card(tmp_path / name)
    assert card["training"]["steps"] == 2 and card["architecture"] == RECIPES[name].hf_class
    assert 0.0 <= card["evaluation"]["by_pairs"]["3"]["accuracy"] <= 1.0


def test_short_run_is_reproducible_from_its_seed(tmp_path: Path) -> None:
    runs = [train("transformer-kv", tmp_path / f"r{i}", steps=4, seed=s, eval_sizes=(4,), eval_samples=8, log=None)
            for i, s in enumerate((5, 5, 6))]
    w = [load_file(str(r.out / "model.safetensors")) for r in runs]
    assert runs[0].losses == runs[1].losses
    assert all(torch.equal(w[0][k], w[1][k]) for k in w[0])
    assert runs[0].card["evaluation"] == runs[1].card["evaluation"]
    assert runs[0].losses != runs[2].losses


def test_all_four_models_are_shipped_within_10_mb() -> None:
    assert set(ZOO) <= set(zoo_names())
    total = sum(f.stat().st_size for n in ZOO for f in (zoo_dir() / n).iterdir())
    assert total <= 10 * 2**20, f"zoo is {total / 2**20:.1f} MiB"


@pytest.mark.parametrize("name", ZOO)
def test_shipped_model_card(name: str) -> None:
    card = read_card(zoo_dir() / name)
    t = card["training"]
    for key in ("seed", "steps", "wall_seconds", "batch_size", "lr", "pairs", "train_pairs", "loss"):
        assert key in t, key
    assert card["parameters"]["total"] > 0 and card["architecture"] == RECIPES[name].hf_class
    by = card["evaluation"]["by_pairs"]
    assert {"5", "10", "20", "40", str(t["train_pairs"])} <= set(by)
    assert (zoo_dir() / name / "MODEL_CARD.md").read_text().count("|") > 10
    # same data and steps for every family (the comparison the zoo is for)
    ref = read_card(zoo_dir() / "transformer-kv")["training"]
    assert (t["steps"], t["batch_size"], t["pairs"], t["seed"]) == (ref["steps"], ref["batch_size"], ref["pairs"], ref["seed"])


def _expected_heads(card: dict) -> Counter:
    c = card["config"]
    if card["family"] == "transformer":
        return Counter({"attn": c["num_hidden_layers"] * c["num_attention_heads"]})
    if card["family"] == "mamba1":
        return Counter({"ssm1": c["num_hidden_layers"] * c["expand"] * c["hidden_size"]})
    if card["family"] == "mamba2":
        return Counter({"ssm2": c["num_hidden_layers"] * c["num_heads"]})
    n_attn = len(c["attn_layer_indices"])
    return Counter({"attn": n_attn * c["num_attention_heads"],
                    "ssm2": (c["num_hidden_layers"] - n_attn) * c["mamba_n_heads"]})


@pytest.mark.parametrize("name", ZOO)
def test_shipped_model_loads_with_parity_and_matches_its_card(name: str) -> None:
    model = load_model(f"zoo:{name}", device="cpu")
    card = read_card(zoo_dir() / name)
    assert Counter(h.kind for h in model.heads()) == _expected_heads(card)
    n = card["training"]["train_pairs"]
    assert model.kv_words == tuple(card["keys"]) == zoo_keys()
    batch = model.tokenize(KVRetrieval(n, 4, seed=11, words=model.kv_words).prompts)
    with torch.no_grad():
        hf = model.hf_model(input_ids=batch.ids, attention_mask=batch.attention_mask).logits
    assert (model.forward(batch) - hf).abs().max().item() <= 1e-4
    # the card's accuracy at the training size is what the shipped weights really score
    ev = card["evaluation"]
    acc = evaluate(model, KVRetrieval(n, ev["n_samples"], seed=ev["seed"], words=model.kv_words), progress=False).accuracy
    assert abs(acc - ev["by_pairs"][str(n)]["accuracy"]) <= 0.02, (acc, ev["by_pairs"][str(n)])


@pytest.mark.parametrize("name", sorted(BARS))
def test_acceptance_bar_at_the_training_size(name: str) -> None:
    card = read_card(zoo_dir() / name)
    n = str(card["training"]["train_pairs"])
    assert card["evaluation"]["by_pairs"][n]["accuracy"] >= BARS[name]


def test_cli_zoo_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert all(f"zoo:{n}" in out for n in ZOO)


def test_zoo_model_refuses_keys_outside_its_vocabulary() -> None:
    """A KV task with the default 900-word list has keys the zoo tokenizer maps to [UNK]: clear error."""
    model = load_model("zoo:transformer-kv", device="cpu")
    assert len(model.kv_words) == N_KEYS
    outside = KVRetrieval(10, 4, seed=0).prompts[0]
    with pytest.raises(InputError, match="model.kv_words"):
        evaluate(model, KVRetrieval(10, 4, seed=0), progress=False)
    with pytest.raises(InputError, match="outside"):
        model.tokenize(outside)
    evaluate(model, KVRetrieval(10, 4, seed=0, words=model.kv_words), progress=False)  # its own keys are fine


def test_unknown_text_is_refused_wherever_it_enters() -> None:
    """Every way text enters a zoo model refuses a word outside its vocabulary with the same message, naming the
    word; a candidate too. Text that writes the unknown token itself is taken as written."""
    model = load_model("zoo:transformer-kv", device="cpu")
    stranger = word_list()[N_KEYS]  # a shipped word outside the zoo's keys
    text = f"apple:12\n{stranger}:7\napple:"
    for enter in (model.to_str_tokens, model.token_labels, model.to_tokens, model.run_with_cache,
                  lambda t: patterns(model, t, heads="L0H3")):
        with pytest.raises(InputError, match=rf"the prompt holds text outside zoo:transformer-kv's vocabulary "
                                             rf"\(it becomes '\[UNK\]'\): \['{stranger}'\]; .*model\.kv_words"):
            enter(text)
    with pytest.raises(InputError, match=rf"sample 0: candidate ' {stranger}' holds text outside"):
        plan_scoring(model, [Sample("apple:12\napple:", (" 12", f" {stranger}"), 0)])
    assert model.to_str_tokens("apple [UNK]") == ["apple", " ", "[UNK]"]  # the unknown token written out is text
    assert model.token_labels(KVRetrieval(2, 1, seed=0, words=model.kv_words).prompts[0])  # known words pass


def test_discover_finds_the_zoo_transformers_circuit() -> None:
    """On the trained zoo transformer discovery finds a layer-0 gather head feeding a layer-1 aggregate
    head, and removing the top heads hurts far more than removing as many random heads."""
    from gna_interp.circuits.search.discovery import discover

    model = load_model("zoo:transformer-kv", device="cpu")
    task = KVRetrieval(8, 32, seed=0, words=model.kv_words, max_value=99)
    circuit = discover(model, task, k=2, seeds=3, role_samples=8, progress=False)
    assert circuit.baseline["accuracy"] >= 0.9
    gather, aggregate = circuit.pair()
    assert (gather.layer, aggregate.layer) == (0, 1)
    roles = circuit.to_frame().set_index("name")
    assert roles.loc[aggregate.name, "selectivity"] >= 0.9 and roles.loc[gather.name, "line_tokens"] == 2
    c = circuit.curve.groupby(["series", "k"])["accuracy"].mean()
    assert c["top", 2] <= 0.25 and c["random", 2] - c["top", 2] >= 0.2


def test_default_model_without_smollm2_is_the_zoo_transformer(monkeypatch: pytest.MonkeyPatch) -> None:
    import gna_interp.models as models
    from gna_interp.cli.args import default_model_specs

    monkeypatch.setattr(models, "smollm2_gguf_path", lambda: None)
    assert default_model_specs()[0] == "zoo:transformer-kv"
