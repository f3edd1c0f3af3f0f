"""Sharpness metrics against a brute-force, one-row-at-a-time computation in plain Python."""

from __future__ import annotations

import math

import pytest
import torch

from gna_interp import patterns
from gna_interp.errors import InputError
from gna_interp.mixing.sharpness import FRAME_COLUMNS, row_distribution, sharpness, sharpness_frame


def brute_row(values: list[float], valid: list[bool]) -> tuple[float, float, int, float, int]:
    """(entropy, top1, argmax, support, n_keys) of one row, from the definitions."""
    keys = [k for k, ok in enumerate(valid) if ok]
    w = {k: abs(values[k]) for k in keys}
    total = sum(w.values())
    if total == 0:
        return math.nan, math.nan, -1, math.nan, len(keys)
    p = {k: v / total for k, v in w.items()}
    h = -sum(v * math.log(v) for v in p.values() if v > 0)
    best = max(keys, key=lambda k: p[k])
    return h, p[best], best, math.exp(h), len(keys)


def _check(stats, pattern, key_mask, causal):
    *batch, q, k = pattern.shape
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in batch]).reshape(-1, len(batch)).tolist():
        for i in range(q):
            valid = [(not causal or j <= i + (k - q)) and (key_mask is None or bool(key_mask[idx[0], j]))
                     for j in range(k)]
            h, top, _, sup, n = brute_row(pattern[tuple(idx)][i].tolist(), valid)
            at = tuple(idx) + (i,)
            assert int(stats.n_keys[at]) == n
            if math.isnan(h):
                assert math.isnan(float(stats.entropy[at])) and math.isnan(float(stats.top1[at]))
                assert int(stats.argmax[at]) == -1
                continue
            assert float(stats.entropy[at]) == pytest.approx(h, abs=1e-5)
            assert float(stats.top1[at]) == pytest.approx(top, abs=1e-6)
            assert float(stats.support[at]) == pytest.approx(sup, rel=1e-5)
            # argmax points at a key holding the top mass (ties may pick any of them)
            assert p_at(pattern[tuple(idx)][i], valid, int(stats.argmax[at])) == pytest.approx(top, abs=1e-6)


def p_at(row: torch.Tensor, valid: list[bool], k: int) -> float:
    w = [abs(float(v)) if ok else 0.0 for v, ok in zip(row, valid)]
    return w[k] / sum(w)


@pytest.mark.parametrize("causal", [True, False])
def test_matches_brute_force_on_signed_patterns_with_padding(causal):
    g = torch.Generator().manual_seed(0)
    pattern = torch.randn(2, 3, 6, 6, generator=g)  # signed, unnormalised: like SSM implicit attention
    pattern[0, 1, 4] = 0.0  # an all-zero row
    pattern[1, 2, 5, :3] = 0.0  # zeros inside a row: 0 log 0 = 0
    key_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])  # left padding in sample 0
    stats = sharpness(pattern, key_mask[:, None, :], causal=causal)
    assert stats.entropy.shape == (2, 3, 6)
    _check(stats, pattern, key_mask, causal)
    # padding query rows of sample 0 (no valid key when causal) are NaN
    if causal:
        assert torch.isnan(stats.entropy[0, :, :2]).all()


def test_rectangular_rows_and_known_values():
    # queries are the last q positions of k keys
    stats = sharpness(torch.tensor([[1.0, 1.0, 1.0, 9.0], [0.0, 0.0, 0.0, 5.0]]))
    assert stats.n_keys.tolist() == [3, 4]
    assert float(stats.entropy[0]) == pytest.approx(math.log(3))  # the 9 is in the future
    assert float(stats.support[0]) == pytest.approx(3.0)
    assert float(stats.entropy[1]) == 0.0 and float(stats.top1[1]) == 1.0 and int(stats.argmax[1]) == 3
    assert float(stats.support[1]) == pytest.approx(1.0)
    assert float(stats.normalized_entropy[0]) == pytest.approx(1.0)
    single = sharpness(torch.ones(1, 1))
    assert int(single.n_keys) == 1 and math.isnan(float(single.normalized_entropy))


def test_row_distribution_is_normalised_abs():
    pat = torch.tensor([[2.0, 0.0], [-1.0, 3.0]])
    assert torch.allclose(row_distribution(pat), torch.tensor([[1.0, 0.0], [0.25, 0.75]]))
    with pytest.raises(InputError, match="key_mask has 3 keys"):
        sharpness(pat, torch.ones(3))


@pytest.fixture(scope="module")
def bamba(tiny_models):
    return tiny_models["bamba"]


def test_frame_over_a_pattern_set(bamba):
    prompts = ["pear:12\nfig:7\nThe value of 'fig' is", "fig:7 is"]
    pset = patterns(bamba, prompts, ["L0S1", "L1H2"])
    frame = sharpness_frame(pset)
    assert list(frame.columns) == list(FRAME_COLUMNS)
    n_real = [len(t) for t in pset.str_tokens]
    assert len(frame) == 2 * sum(n_real)
    attn = frame[(frame.name == "L1H2")]
    assert attn.top1.between(0, 1).all() and (attn.support >= 1 - 1e-5).all()
    assert (attn.n_keys == attn["query"] + 1).all()  # real keys only, causal
    # the frame equals the tensor API on the trimmed sample
    one = frame[(frame.name == "L0S1") & (frame["sample"] == 1)]
    stats = sharpness(pset.sample(1, ["L0S1"])[0])
    assert one.entropy.to_numpy() == pytest.approx(stats.entropy.numpy(), abs=1e-6)
    assert one.token.tolist() == pset.str_tokens[1]
    assert len(sharpness_frame(pset, [])) == 0
