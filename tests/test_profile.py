"""The cost of each stage, measured: the Meter counts the blocks a model runs (a full forward is one call per layer,
a replay from layer L one per later layer) with their rows and tokens; discover records each stage's cost in the
circuit (saved, loaded, in summary.md), and `gna scan --profile` prints the table."""

from __future__ import annotations

import pytest
import torch

import gna_interp as gna
from gna_interp.engine.profile import Cost, Meter
from gna_interp.engine.replay import capture, replay


@pytest.fixture(scope="module")
def m():
    return gna.load_model("zoo:transformer-kv")


def test_a_forward_and_a_replay_are_counted_in_blocks_rows_and_tokens(m):
    batch = m.tokenize([f"{m.kv_words[0]}:1\n{m.kv_words[1]}:2\n{m.kv_words[0]}:"] * 3)
    b, p = batch.ids.shape
    with Meter(m) as meter:
        with meter.stage() as full:
            prefix = capture(m, batch)
        with meter.stage() as tail:
            replay(m, prefix, start=1, copies=2)
    assert (full.block_calls, full.block_rows, full.block_tokens) == (m.n_layers, b * m.n_layers, b * p * m.n_layers)
    assert (tail.block_calls, tail.block_rows, tail.block_tokens) == (m.n_layers - 1, 2 * b, 2 * b * p)
    assert full.wall_s >= 0 and full.cpu_s >= 0 and full.peak_rss_mb > 0 and full.peak_cuda_mb is None
    with meter.stage() as after:  # outside the Meter's block nothing is counted: its hooks are gone
        m(batch)
    assert after.block_calls == 0


def test_the_hooks_go_even_when_a_stage_fails(m):
    with pytest.raises(RuntimeError):
        with Meter(m):
            raise RuntimeError("a stage failed")
    assert all(not blk._forward_pre_hooks for blk in m.blocks())


def test_costs_add_up_and_round_trip():
    a, b = Cost(1.0, 2.0, 3, 4, 5, 100.0, None), Cost(0.5, 0.5, 1, 1, 1, 50.0, 7.0)
    s = a + b
    assert (s.wall_s, s.block_calls, s.peak_rss_mb, s.peak_cuda_mb) == (1.5, 4, 100.0, 7.0)
    assert Cost.from_dict(s.to_dict()) == s


def test_discover_keeps_each_stages_cost_and_the_folder_shows_it(m, tmp_path, capsys):
    from gna_interp.circuits import Circuit
    from gna_interp.cli import main

    out = tmp_path / "scan"
    assert main(["scan", "--model", "zoo:transformer-kv", "--threads", "1", "--no-png", "--profile",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| stage | wall s | CPU s | blocks run |" in printed
    c = Circuit.load(out)
    assert {"calibrate", "scan", "curve", "paths"} <= set(c.profile)
    assert c.profile["scan"].block_calls > 0 and c.profile["curve"].block_rows > 0
    assert "## Cost by stage" in (out / "summary.md").read_text()
    task = gna.KVRetrieval(n_pairs=4, n_samples=6, words=m.kv_words)
    direct = gna.discover(m, task, k=1, seeds=1, control=False, paths=0, n_cards=0, progress=False)
    assert "calibrate" not in direct.profile and direct.profile["scan"].block_calls > 0
