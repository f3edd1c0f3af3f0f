"""KV-retrieval prompts: templates, seeded reproducibility, bad input."""

from __future__ import annotations

import hashlib

import pytest

from gna_interp.errors import InputError
from gna_interp.tasks import KVRetrieval, word_list
from gna_interp.tasks.seeding import StableRng


def test_word_list_is_shipped_and_clean():
    words = word_list()
    assert len(words) >= 500
    assert len(set(words)) == len(words)
    assert all(w.isalpha() and w.islower() for w in words)


def test_official_template_text():
    t = KVRetrieval(n_pairs=3, n_samples=1, seed=1, template="official")
    s = t[0]
    keys = [line.split(":")[0] for line in s.prompt.splitlines()[1:4]]
    values = [line.split(":")[1] for line in s.prompt.splitlines()[1:4]]
    expected = ("Memorize the following dictionary:\n" + "\n".join(f"{k}:{v}" for k, v in zip(keys, values))
                + f"\nThe value of the key '{s.meta['key']}' is")
    assert s.prompt == expected
    assert s.candidates == tuple(f" {v}" for v in values)
    assert s.answer == f" {s.meta['value']}" and keys[s.gold] == s.meta["key"]
    assert s.prompt[s.cue_start:] == f"The value of the key '{s.meta['key']}' is"


def test_completion_template_text():
    s = KVRetrieval(n_pairs=4, n_samples=1, seed=2, template="completion")[0]
    assert s.prompt.endswith(f"\n{s.meta['key']}:")
    assert s.answer == f"{s.meta['value']}\n"
    assert all(c.endswith("\n") for c in s.candidates)
    assert KVRetrieval(4, 1, 2, "completion").with_value_suffix("")[0].answer == str(s.meta["value"])


def test_keys_and_values_distinct_and_in_range():
    for s in KVRetrieval(n_pairs=50, n_samples=20, seed=3):
        lines = s.prompt.splitlines()[1:51]
        keys = [x.split(":")[0] for x in lines]
        values = [int(x.split(":")[1]) for x in lines]
        assert len(set(keys)) == 50 and len(set(values)) == 50
        assert all(0 <= v <= 99 for v in values) and set(keys) <= set(word_list())
        assert s.meta["depth"] == s.gold and keys[s.gold] == s.meta["key"]


def test_same_seed_same_prompts_other_seed_other_prompts():
    a, b, c = KVRetrieval(10, 16, seed=7), KVRetrieval(10, 16, seed=7), KVRetrieval(10, 16, seed=8)
    assert a.prompts == b.prompts and [s.gold for s in a] == [s.gold for s in b]
    assert a.prompts != c.prompts
    # the sample stream does not depend on n_samples
    assert KVRetrieval(10, 4, seed=7).prompts == a.prompts[:4]


def test_prompts_are_identical_on_every_machine():
    """Golden digest: StableRng uses only random.random(), which Python keeps stable across versions."""
    t = KVRetrieval(n_pairs=10, n_samples=8, seed=0, template="official")
    digest = hashlib.sha256("\x00".join(t.prompts).encode()).hexdigest()
    assert digest == GOLDEN_KV10_SEED0
    rng = StableRng("check", 0)
    assert [rng.below(100) for _ in range(5)] == GOLDEN_RNG


def test_gold_depth_covers_all_positions():
    depths = {s.gold for s in KVRetrieval(n_pairs=10, n_samples=200, seed=0)}
    assert depths == set(range(10))


def test_more_pairs_than_distinct_values():
    with pytest.raises(InputError, match=r"n_pairs=101 needs 101 distinct values .* 0\.\.99"):
        KVRetrieval(n_pairs=101, n_samples=1)
    assert len(KVRetrieval(n_pairs=101, n_samples=1, max_value=200)[0].candidates) == 101


def test_bad_arguments():
    with pytest.raises(InputError, match="unknown KV template"):
        KVRetrieval(template="chatty")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="distinct keys"):
        KVRetrieval(n_pairs=5, words=["a", "b", "c"])
    with pytest.raises(InputError, match=">= 1"):
        KVRetrieval(n_pairs=0)
    with pytest.raises(InputError, match="may not"):
        KVRetrieval(n_pairs=2, words=["a:b", "c", "d"])


# Computed once with this code and word list; a change here means prompts changed for every user.
GOLDEN_KV10_SEED0 = "ce7ec66dc85c0e8266ed5dbc395deb12da61d75d0e999c990fde4bc01547dfed"
GOLDEN_RNG = [83, 34, 12, 69, 17]


def test_a_task_too_large_to_build_is_refused_at_once():
    import time

    from gna_interp.errors import InputError
    from gna_interp.tasks import KVRetrieval

    start = time.perf_counter()
    for kw in (dict(n_pairs=5, n_samples=10**9), dict(n_pairs=10**6, n_samples=1, max_value=10**7)):
        with pytest.raises(InputError, match="too large"):
            KVRetrieval(**kw)
    with pytest.raises(InputError, match="max_value must be an integer"):
        KVRetrieval(5, 8, max_value=float("nan"))
    assert time.perf_counter() - start < 1
