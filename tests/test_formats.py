"""Scans on several retrieval formats: relative drops per format, the consistent effect, and the circuit ranked by it."""

from __future__ import annotations

import pytest

from gna_interp import ablate, discover, load_model
from gna_interp.circuits import Circuit
from gna_interp.circuits.search.formats import one_format_heads
from gna_interp.cli import main
from gna_interp.tasks import KVRetrieval, evaluate
from gna_interp.report import circuit_summary


@pytest.fixture(scope="module")
def zoo():
    return load_model("zoo:transformer-kv", device="cpu")


def test_discover_on_two_formats_ranks_by_the_consistent_effect(zoo, tmp_path):
    official = KVRetrieval(6, 8, seed=1, template="official", words=zoo.kv_words)
    completion = KVRetrieval(6, 8, seed=1, template="completion", words=zoo.kv_words)
    c = discover(zoo, official, formats=(completion,), control=False, k=2, seeds=1, certify=3, progress=False)
    assert list(c.formats) == ["kv6-completion"]
    df = c.to_frame().set_index("name")
    lead = set(c.scan.top(3)) | set(c.formats["kv6-completion"].top(3))
    assert all(h in c.scan.exact and h in c.formats["kv6-completion"].exact for h in lead)  # compared exactly
    for name in df.index:  # the consistent effect is the smaller relative drop
        assert df.loc[name, "consistent"] == pytest.approx(min(df.loc[name, "rel_drop_kv6-official"],
                                                               df.loc[name, "rel_drop_kv6-completion"]))
    h = next(iter(lead))  # an independent evaluation of one relative drop in the second format
    base = evaluate(zoo, completion, progress=False).scores.logit_diff.mean().item()
    with ablate(zoo, [h]):
        abl = evaluate(zoo, completion, progress=False).scores.logit_diff.mean().item()
    assert df.loc[h.name, "rel_drop_kv6-completion"] == pytest.approx((base - abl) / abs(base), abs=1e-4)
    order = df.sort_values("circuit_rank").index.tolist()
    assert [x.name for x in c.heads] == order
    assert df.loc[order, "consistent"].is_monotonic_decreasing
    assert "formats scanned: kv6-official, kv6-completion" in circuit_summary(c)
    back = Circuit.load(c.save(tmp_path / "c"))
    assert list(back.formats) == ["kv6-completion"] and back.heads == c.heads
    from gna_interp.report import build_report

    page = build_report(tmp_path / "c", png=False).read_text()
    assert "Retrieval formats" in page and "rel_drop_kv6-completion" in page
    assert back.format_tasks["kv6-completion"]["args"]["template"] == "completion"


def test_one_format_heads_names_heads_that_matter_in_one_format_only():
    import pandas as pd

    df = pd.DataFrame({"name": ["A", "B", "C"], "rel_drop_x": [0.8, 0.5, 0.1], "rel_drop_y": [0.7, 0.05, 0.1]})
    df["consistent"] = df[["rel_drop_x", "rel_drop_y"]].min(axis=1)
    assert one_format_heads(df, ["x", "y"]) == [("B", "x", 0.5, 0.05)]


def test_gna_scan_formats_option(tmp_path):
    out = tmp_path / "f"
    assert main(["--device", "cpu", "scan", "--model", "zoo:transformer-kv", "--template", "official", "--pairs", "6",
                 "--max-value", "99", "--samples", "6", "--formats", "completion,official", "--top-k", "1",
                 "--seeds", "1", "--no-control", "--no-png", "--out", str(out)]) == 0
    c = Circuit.load(out)
    assert list(c.formats) == ["kv6-completion"]  # official is the task's own template: not scanned twice
    assert "rel_drop_kv6-completion" in (out / "scan.csv").read_text().splitlines()[0]
