"""Whatever the arguments alone decide is refused before any model loads: exit 2, one ``gna: error:`` line, and the
loader never called (it is replaced by one that fails the test)."""

from __future__ import annotations

import pytest

import gna_interp.experiments.run as run
import gna_interp.models as models
import gna_interp.models.loading as loading
from gna_interp.cli import main

QUESTIONS_MISSING = "no/such/questions.jsonl"


@pytest.fixture
def no_load(monkeypatch):
    """Every way a command loads a model raises; the calls are recorded."""
    calls: list[object] = []

    def boom(spec, *a, **k):
        calls.append(spec)
        raise AssertionError(f"a model was loaded ({spec!r}) though the arguments alone decide the refusal")

    monkeypatch.setattr(models, "load_model", boom)
    monkeypatch.setattr(run, "load_model", boom)
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=3.0: False)
    return calls


CASES = {
    "scan pairs too many": (["scan", "--pairs", "1000000"], "at most 10,000"),
    "scan pairs beyond every value range": (["scan", "--pairs", "150"], "no KV form fits"),
    "scan max-value below the pairs": (["scan", "--max-value", "5"], "no KV form fits"),
    "scan pairs with too small max-value": (["scan", "--pairs", "150", "--max-value", "99"], "fewer than --pairs"),
    "scan on the meta device": (["--device", "meta", "scan"], "--device 'meta'"),
    "scan missing questions file": (["scan", "--task", "mc", "--questions", QUESTIONS_MISSING], "question source"),
    "scan hub questions offline": (["scan", "--task", "mc", "--questions", "hub:anatomy"], "not reachable"),
    "patterns on the meta device": (["--device", "meta", "patterns", "--prompt", "x"], "--device 'meta'"),
    "prune pairs too many": (["prune", "--pairs", "1000000", "--max-value", "1000000"], "at most 10,000"),
    "prune max-value 5 with 10 pairs": (["prune", "--max-value", "5"], "fewer than --pairs"),
    "prune missing questions file": (["prune", "--questions", QUESTIONS_MISSING], "question source"),
    "prune hub questions offline": (["prune", "--questions", "hub"], "not reachable"),
    "mask pairs with too small max-value": (["mask", "--pairs", "150"], "fewer than pairs"),
    "mask max-value 5 with 10 pairs": (["mask", "--max-value", "5"], "fewer than pairs"),
    "mask on the meta device": (["--device", "meta", "mask"], "--device 'meta'"),
    "sweep sizes beyond the values": (["sweep", "--pairs", "10,150"], "fewer than --pairs"),
    "eval limit inf": (["eval", "--tasks", "gna_kv_mc", "--limit", "inf"], "--limit"),
    "eval limit nan": (["eval", "--tasks", "gna_kv_mc", "--limit", "nan"], "--limit"),
}


@pytest.mark.parametrize("argv, says", list(CASES.values()), ids=list(CASES))
def test_refused_before_the_model_loads(no_load, tmp_path, capsys, argv, says):
    code = main([*argv, "--out", str(tmp_path / "out")] if argv[0] != "--device" else
                [*argv, "--out", str(tmp_path / ("out.html" if "patterns" in argv else "out"))])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("gna: error:") and err.count("\n") == 1, err
    assert says in err, err
    assert not no_load


def test_the_python_api_refuses_the_same_knobs_before_loading(no_load):
    from gna_interp.errors import InputError
    from gna_interp.experiments.mask import MaskConfig
    from gna_interp.experiments.prune import PruneConfig, prune
    from gna_interp.experiments.sweep import sweep
    from gna_interp.tasks.choice import TaskChoice

    with pytest.raises(InputError, match="fewer than pairs"):
        prune("zoo:transformer-kv", pairs=12, max_value=9)
    with pytest.raises(InputError, match="at most 10,000"):
        sweep("zoo:transformer-kv", pairs=[10, 20_000], max_value=10**6)
    with pytest.raises(InputError, match="question source"):
        PruneConfig(tasks="mc", questions=QUESTIONS_MISSING)
    with pytest.raises(InputError, match="no KV form fits"):
        TaskChoice(max_value=5)
    with pytest.raises(InputError, match="fewer than pairs"):
        MaskConfig().resolve({"n_pairs": 150})
    assert not no_load
