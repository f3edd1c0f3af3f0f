"""The zero-shot knowledge task: shipped facts, seeded same-category candidates that the prompt never
mentions, save/load, clear errors; and SmolLM2 knows the facts whether or not its KV circuit is removed."""

from __future__ import annotations

import json
import re

import pytest

import gna_interp as gna
from gna_interp.errors import InputError
from gna_interp.schemas import SCHEMAS
from gna_interp.tasks import Knowledge, Task, evaluate, fact_categories, facts, task_from_dict
from gna_interp.tasks.io import KINDS
from gna_interp.tasks.knowledge import FACTS_FILE, _parse, mentions

HEADER = "category\tsubject\tprompt\tanswer\n"


def round_trip(task: Task) -> Task:
    return task_from_dict(json.loads(json.dumps(task.to_dict(), allow_nan=False)))


def test_the_shipped_facts_parse_and_every_category_offers_four_candidates():
    shipped = facts()
    assert len(shipped) >= 300 and len(fact_categories()) >= 15
    assert all(len(answers) >= 4 for answers in fact_categories().values())
    assert len({f.prompt for f in shipped}) == len(shipped)
    assert all(f.subject in f.prompt and not f.prompt.endswith(" ") for f in shipped)


def test_the_facts_file_ships_in_the_package():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from pathlib import Path

    patterns = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["gna_interp"]
    rel = FACTS_FILE.relative_to(FACTS_FILE.parents[1]).as_posix()
    assert any(Path(rel).match(p) for p in patterns), (rel, patterns)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_samples_are_same_category_distinct_and_not_in_the_prompt(seed):
    task = Knowledge(n_samples=len(facts()), seed=seed)
    pools = fact_categories()
    assert len({s.prompt for s in task}) == len(task)  # facts drawn without replacement
    for s in task:
        fact = facts()[s.meta["fact"]]
        assert s.prompt == fact.prompt and s.meta["category"] == fact.category
        assert len(s.candidates) == 4 and len(set(s.candidates)) == 4 and 0 <= s.gold < 4
        assert s.answer == " " + fact.answer
        assert all(c.startswith(" ") and c.strip() in pools[fact.category] for c in s.candidates)
        for c in s.candidates:  # nothing to copy: not the word, not its stem
            assert not re.search(rf"\b{re.escape(c.strip())}\b", s.prompt, flags=re.IGNORECASE), (s.prompt, c)
            assert not mentions(s.prompt, c)
        assert s.spans.items == () and s.cue_start == 0
        a, b = s.spans.query
        assert s.prompt[a:b] == s.meta["subject"]


def test_the_gold_position_is_spread_over_the_candidates():
    golds = [s.gold for s in Knowledge(n_samples=200, seed=0)]
    assert all(golds.count(i) > 30 for i in range(4))


def test_seeded_deterministic_and_prefix_stable():
    a, b = Knowledge(n_samples=40, seed=3), Knowledge(n_samples=40, seed=3)
    assert a.samples == b.samples
    assert Knowledge(n_samples=10, seed=3).samples == a.samples[:10]
    assert Knowledge(n_samples=40, seed=4).samples != a.samples


def test_categories_and_n_choices():
    task = Knowledge(n_samples=20, seed=1, n_choices=3, categories=["capital", "opposite"])
    assert {s.meta["category"] for s in task} <= {"capital", "opposite"}
    assert all(len(s.candidates) == 3 for s in task)
    two = Knowledge(n_samples=5, n_choices=2, categories=["day"])
    assert all(len(s.candidates) == 2 and s.meta["category"] == "day" for s in two)
    assert two.chance == 0.5


def test_mentions():
    assert mentions("The capital of Germany is", "German")  # a stem counts
    assert mentions("If today is Monday, tomorrow is", "Monday")
    assert mentions("The capital of New Zealand is", "New Delhi")
    assert not mentions("The capital of France is", "Paris")
    assert not mentions("The chemical element with the symbol He is", "helium")


@pytest.mark.parametrize("kwargs", [{}, {"n_samples": 12, "seed": 5, "n_choices": 5,
                                          "categories": ["author", "capital"]}])
def test_round_trip(kwargs):
    task = Knowledge(**kwargs)
    d = task.to_dict()
    assert d["kind"] == "knowledge" and d["format_version"] == 1 and d["n_samples"] == len(task)
    loaded = round_trip(task)
    assert type(loaded) is Knowledge and loaded.name == task.name and loaded.samples == task.samples
    task.name = "renamed"
    assert round_trip(task).name == "renamed"


def test_every_loadable_kind_is_allowed_by_the_saved_circuit_schema():
    kinds = SCHEMAS["circuit"]["properties"]["task"]["properties"]["kind"]["enum"]
    assert set(kinds) == set(KINDS)


def test_bad_saved_dicts_are_clear_errors():
    d = Knowledge(n_samples=4).to_dict()
    with pytest.raises(InputError, match="unknown argument"):
        task_from_dict({**d, "args": {**d["args"], "shots": 3}})
    with pytest.raises(InputError, match="n_samples"):
        task_from_dict({**d, "n_samples": 5})
    with pytest.raises(InputError, match="'seed' must be int"):
        task_from_dict({**d, "args": {**d["args"], "seed": "0"}})


@pytest.mark.parametrize("kwargs, message", [
    ({"n_samples": 0}, "n_samples must be an integer >= 1"),
    ({"n_samples": -3}, "n_samples must be an integer >= 1"),
    ({"n_samples": 2.5}, "n_samples must be an integer >= 1"),
    ({"n_samples": True}, "n_samples must be an integer >= 1"),
    ({"n_samples": 10_000}, "lower n_samples"),
    ({"n_samples": 13, "categories": ["month"]}, "more facts than the 12"),
    ({"n_choices": 1}, "n_choices must be an integer >= 2"),
    ({"n_choices": 60}, "lower n_samples or n_choices"),
    ({"seed": "0"}, "seed must be an integer"),
    ({"categories": "capital"}, "single string"),
    ({"categories": ["capitals"]}, r"unknown fact categories \['capitals'\]"),
    ({"categories": []}, "categories is empty"),
    ({"categories": [3]}, "category names"),
])
def test_bad_arguments_are_clear_errors(kwargs, message):
    with pytest.raises(InputError, match=message):
        Knowledge(**kwargs)


@pytest.mark.parametrize("text, message", [
    ("cat\tsubject\tprompt\tanswer\n", "header"),
    (HEADER + "capital\tFrance\tThe capital of France is\n", "expected 4 tab-separated cells"),
    (HEADER + "capital\tSpain\tThe capital of France is\tParis\n", "subject 'Spain' is not in the prompt"),
    (HEADER + "language\tGermany\tPeople in Germany speak\tGerman\n", "already says the answer"),
    (HEADER + "capital\tFrance\tThe capital of France is\tParis\n" * 2, "appears twice"),
    (HEADER + "capital\tFrance\tThe capital of France is \tParis\n", "surrounding spaces"),
    ("# nothing\n" + HEADER, "holds no facts"),
])
def test_malformed_fact_files_are_refused(text, message):
    with pytest.raises(InputError, match=message):
        _parse(text, "'facts.tsv'")


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_evaluates_on_tiny_models(tiny_models, family):
    model = tiny_models[family]
    task = Knowledge(n_samples=6, seed=2)
    ev = evaluate(model, task, progress=False)
    assert ev.metrics["n_samples"] == 6 and 0 <= ev.accuracy <= 1 and ev.metrics["chance"] == 0.25
    for s, seg in zip(task, task.segments(model.tokenizer)):
        assert seg.items == () and seg.query is not None and seg.final == seg.n_tokens - 1


@pytest.mark.smollm2
def test_smollm2_knows_the_facts_with_or_without_its_kv_circuit(smollm2):
    """Intact SmolLM2-135M is far above chance (0.25); removing the KV circuit's top 5 heads, which
    takes KV retrieval to near chance, leaves it there (measured 0.875 both ways on 64 samples, seed 0)."""
    task = Knowledge(n_samples=32, seed=0)
    intact = evaluate(smollm2, task, progress=False)
    assert intact.accuracy > 0.7
    with gna.ablate(smollm2, ["L16H0", "L18H6", "L16H2", "L19H8", "L17H8"]):
        removed = evaluate(smollm2, task, progress=False)
    assert removed.accuracy > intact.accuracy - 0.1
