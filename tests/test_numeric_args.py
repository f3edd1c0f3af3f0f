"""Numeric arguments of the public Python API are validated as the command line's are: bootstrap sizes, interval
levels, prompt indices, shot counts. Any number (negative, zero, huge, fractional, NaN, a bool) gives a correct
result or a package error that says what was wrong -- never a torch error, a huge allocation or a silent rounding."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gna_interp as gna
from gna_interp.errors import GnaError, InputError
from gna_interp.options import N_BOOT_MAX

QUICK = settings(max_examples=60, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
numbers = st.one_of(st.integers(-10, 10), st.sampled_from([-(10**12), 10**12, 2**63, N_BOOT_MAX, N_BOOT_MAX + 1]),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none())


def _ok_or_gna(call):
    try:
        return call()
    except GnaError as e:
        assert str(e) and "\n" not in str(e)
        return None


@pytest.fixture(scope="module")
def scan(tiny_models, tmp_path_factory):
    from made_up import write_scan_folder

    model = tiny_models["llama"]
    folder = write_scan_folder(tmp_path_factory.mktemp("scan") / "run", model, model.heads())
    return gna.Circuit.load(folder).scan


@pytest.fixture(scope="module")
def question_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("q") / "q.jsonl"
    rows = [{"question": f"Question {i}?", "choices": ["yes", "no", "maybe"], "answer": i % 3} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


@QUICK
@given(n_boot=numbers, level=numbers)
def test_bootstrap_sizes_and_levels(scan, n_boot, level):
    from gna_interp.circuits.scan.interactions import InteractionOptions

    valid = (isinstance(n_boot, int) and not isinstance(n_boot, bool) and 1 <= n_boot <= N_BOOT_MAX
             and isinstance(level, (int, float)) and not isinstance(level, bool) and 0 < level < 1)
    got = _ok_or_gna(lambda: InteractionOptions(n_boot=n_boot, level=level))
    assert (got is not None) == valid
    small = n_boot if isinstance(n_boot, int) and not isinstance(n_boot, bool) and n_boot <= 50 else n_boot
    if valid and n_boot > 50:
        return  # a valid size: the intervals' cost grows with it; the refusals are what this test is about
    ci = _ok_or_gna(lambda: scan.intervals(level=level, n_boot=small))
    assert (ci is not None) == valid
    if valid:
        assert all(lo <= hi for lo, hi in ci.values())


@QUICK
@given(shots=numbers, n_samples=numbers)
def test_question_file_shots_are_a_count(question_file, shots, n_samples):
    got = _ok_or_gna(lambda: gna.MultipleChoice.from_file(question_file, n_samples=n_samples, shots=shots))
    count = isinstance(shots, int) and not isinstance(shots, bool) and 0 <= shots < 6
    size = n_samples is None or (isinstance(n_samples, int) and not isinstance(n_samples, bool) and n_samples >= 1)
    assert (got is not None) == (count and size)
    if got is not None:
        assert len(got.shots) == shots and len(got) == min(6 - shots, n_samples or 6)


@QUICK
@given(sample=numbers)
def test_explorer_sample_is_a_prompt_index(tiny_models, sample):
    from gna_interp.viz.explorer import Explorer

    model = tiny_models["llama"]
    task = gna.KVRetrieval(3, 4, seed=0, words=model.kv_words)
    got = _ok_or_gna(lambda: Explorer(model, task, sample=sample))
    whole = (isinstance(sample, int) or (isinstance(sample, float) and math.isfinite(sample)
                                         and sample.is_integer())) and not isinstance(sample, bool)
    assert (got is not None) == (whole and sample is not None and 0 <= sample < 4)
    if got is not None:
        assert got.sample == int(sample)


def test_the_examples_of_the_api(question_file, tiny_models, scan):
    from gna_interp.circuits.scan.interactions import InteractionOptions
    from gna_interp.viz import circuit_graph
    from gna_interp.viz.explorer import Explorer

    for bad in (-5, 0, 10**12):
        with pytest.raises(InputError, match="n_boot"):
            InteractionOptions(n_boot=bad)
    with pytest.raises(InputError, match="Circuit or the folder"):
        circuit_graph(42)
    with pytest.raises(InputError, match="circuit.json|no such|not"):
        circuit_graph("/no/such/DIR")
    assert gna.MultipleChoice.from_file(question_file, shots=0).shots == ()
    model = tiny_models["llama"]
    task = gna.KVRetrieval(3, 4, seed=0, words=model.kv_words)
    for bad in (math.nan, 1.7):
        with pytest.raises(InputError, match="index of a prompt"):
            Explorer(model, task, sample=bad)
