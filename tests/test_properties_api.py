"""Property tests (hypothesis) of the two untrusted inputs of the toolkit: the arguments of the public Python API and
the documents of a result folder. Whatever is passed or read, the answer is a correct result or a ``GnaError`` that
says what was wrong -- never another exception (AttributeError, TypeError, OverflowError, RuntimeError, ...)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gna_interp as gna
from gna_interp.errors import GnaError
from gna_interp.models.loading import quiet_transformers

QUICK = settings(max_examples=100, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# ---- hostile values: wrong types, out of range, huge, non-finite, empty ---------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([-(10**12), 10**9, 2**63, 10**400]),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.5, 1.5, 1e308]),
    st.text(max_size=12), st.sampled_from(["", " ", "zoo:nope", "L0H0", "L99H0", "L0H0,L0H0", "cpu", "meta",
                                           "cuda:7", "auto", "exact", "zero", "logit_diff", "/no/such/dir", "\0"]),
    st.binary(max_size=4),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.text(max_size=4), scalars, max_size=2),
    st.sampled_from(["tensor_float", "tensor_2x5", "tensor_neg", "object", "module", "tuple"]).map(
        lambda k: {"tensor_float": torch.rand(1, 3), "tensor_2x5": torch.ones(2, 5, dtype=torch.long),
                   "tensor_neg": torch.tensor([[-1, 2]]), "object": object(), "module": torch.nn.Linear(2, 2),
                   "tuple": ("L0H0", 3)}[k]),
)


def _outcome(call: Callable[[], Any]) -> str:
    """Run ``call``: "ok" for a result, "gna" for a GnaError; any other exception fails the test."""
    try:
        result = call()
        if hasattr(result, "__enter__"):  # a context manager: enter and leave it
            with result:
                pass
    except GnaError as e:
        assert str(e).strip(), "a GnaError must say what was wrong"
        return "gna"
    return "ok"


@pytest.fixture(scope="module")
def world(tiny_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_dirs["llama"]
    m = gna.load_model(path, device="cpu")
    task = gna.KVRetrieval(n_pairs=2, n_samples=2, max_value=9, seed=0)
    with quiet_transformers():
        hf, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    scan = gna.scan_heads(m, task, "L0H0,L1H1", strategy="exact", progress=False)
    saved = scan.save(tmp_path_factory.mktemp("api") / "scan.json")
    return {"m": m, "task": task, "path": path, "hf": hf, "tok": tok, "scan_file": saved}


def _calls(w: dict[str, Any]) -> dict[str, Callable[[Any], Any]]:
    """One public entry point each, with the hostile value ``v`` in one argument and valid values elsewhere."""
    m, task = w["m"], w["task"]
    quick = {"strategy": "exact", "progress": False}
    return {
        "evaluate(model=v)": lambda v: gna.evaluate(v, task, progress=False),
        "evaluate(task=v)": lambda v: gna.evaluate(m, v, progress=False),
        "evaluate(batch_size=v)": lambda v: gna.evaluate(m, task, batch_size=v, progress=False),
        "evaluate(method=v)": lambda v: gna.evaluate(m, task, method=v, progress=False),
        "scan_heads(model=v)": lambda v: gna.scan_heads(v, task, "L0H0", **quick),
        "scan_heads(task=v)": lambda v: gna.scan_heads(m, v, "L0H0", **quick),
        "scan_heads(heads=v)": lambda v: gna.scan_heads(m, task, v, **quick),
        "scan_heads(strategy=v)": lambda v: gna.scan_heads(m, task, "L0H0", strategy=v, progress=False),
        "scan_heads(batch_size=v)": lambda v: gna.scan_heads(m, task, "L0H0", batch_size=v, **quick),
        "scan_heads(metric=v)": lambda v: gna.scan_heads(m, task, "L0H0", metric=v, **quick),
        "KVRetrieval(n_pairs=v)": lambda v: gna.KVRetrieval(n_pairs=v, n_samples=2),
        "KVRetrieval(n_samples=v)": lambda v: gna.KVRetrieval(n_pairs=3, n_samples=v),
        "KVRetrieval(seed=v)": lambda v: gna.KVRetrieval(3, 2, seed=v),
        "KVRetrieval(max_value=v)": lambda v: gna.KVRetrieval(3, 2, max_value=v),
        "KVRetrieval(template=v)": lambda v: gna.KVRetrieval(3, 2, template=v),
        "KVRetrieval(words=v)": lambda v: gna.KVRetrieval(3, 2, words=v),
        "KVRetrieval.with_value_suffix(v)": lambda v: gna.KVRetrieval(3, 2).with_value_suffix(v),
        "load_model(spec=v)": lambda v: gna.load_model(v, device="meta"),
        "load_model(hf, v)": lambda v: gna.load_model(w["hf"], v),
        "load_model(hf, tok, device=v)": lambda v: gna.load_model(w["hf"], w["tok"], device=v),
        "load_model(dir, device=v)": lambda v: gna.load_model(w["path"], device=v),
        "load_model(dir, dtype=v)": lambda v: gna.load_model(w["path"], device="meta", dtype=v),
        "Circuit.load(v)": lambda v: gna.Circuit.load(v),
        "HeadScan.load(v)": lambda v: gna.HeadScan.load(v),
        "PatternSet.load(v)": lambda v: gna.PatternSet.load(v),
        "ablate(model=v)": lambda v: gna.ablate(v, "L0H0"),
        "ablate(heads=v)": lambda v: gna.ablate(m, v),
        "ablate(method=v)": lambda v: gna.ablate(m, "L0H0", method=v),
        "mask_pattern(masks=v)": lambda v: gna.mask_pattern(m, v),
        "skip_layers(layers=v)": lambda v: gna.skip_layers(m, v),
        "patterns(model=v)": lambda v: gna.patterns(v, "cat:3\ndog:4", "L0H0"),
        "patterns(inputs=v)": lambda v: gna.patterns(m, v, "L0H0"),
        "patterns(heads=v)": lambda v: gna.patterns(m, "cat:3\ndog:4", v),
        "role_scores(heads=v)": lambda v: gna.role_scores(m, task, v),
        "role_scores(model=v)": lambda v: gna.role_scores(v, task, "L0H0"),
        "path_effects(model=v)": lambda v: gna.path_effects(v, task, []),
        "compare_circuits(b=v)": lambda v: gna.compare_circuits(m, v, v),
        "discover(model=v)": lambda v: gna.discover(v, task),
        "model.forward(v)": lambda v: m.forward(v),
        "model.run(ids, attention_mask=v)": lambda v: m.run(torch.tensor([[1, 2, 3]]), attention_mask=v),
        "model.to_str_tokens(v)": lambda v: m.to_str_tokens(v),
        "model.check_heads(v)": lambda v: m.check_heads(v),
        "model.heads(kind=v)": lambda v: m.heads(kind=v),
    }


CALL_NAMES = list(_calls({"m": None, "task": None, "path": None, "hf": None, "tok": None, "scan_file": None}))


@QUICK
@given(name=st.sampled_from(CALL_NAMES), value=values)
@example(name="model.to_str_tokens(v)", value=10**400)  # found by this test: "'int' object is not iterable"
@example(name="skip_layers(layers=v)", value=-0.0)  # "'float' object is not iterable"
@example(name="KVRetrieval(max_value=v)", value=10**9)  # a billion-item list: the process was killed for memory
def test_the_public_api_answers_a_result_or_a_gna_error(world: dict[str, Any], name: str, value: Any) -> None:
    _outcome(lambda: _calls(world)[name](value))


@pytest.mark.parametrize("name, value", [
    ("scan_heads(model=v)", "zoo:transformer-kv"), ("scan_heads(model=v)", None), ("compare_circuits(b=v)", "dir"),
    ("Circuit.load(v)", 123), ("KVRetrieval(max_value=v)", math.nan), ("load_model(hf, v)", "not-a-tokenizer"),
    ("model.run(ids, attention_mask=v)", torch.ones(1, 5)), ("evaluate(batch_size=v)", "8"),
])
def test_the_issues_examples_are_gna_errors(world: dict[str, Any], name: str, value: Any) -> None:
    assert _outcome(lambda: _calls(world)[name](value)) == "gna"


def test_the_readme_form_takes_a_device_and_a_meta_model_is_refused(world: dict[str, Any]) -> None:
    m = gna.load_model(world["hf"], world["tok"], device="cpu")
    torch.testing.assert_close(m.forward("cat:3"), world["m"].forward("cat:3"), atol=1e-6, rtol=0)
    meta = gna.load_model(world["path"], device="meta")
    with pytest.raises(gna.GnaError, match="meta device"):
        gna.evaluate(meta, world["task"], progress=False)


# ---- result documents: random JSON and damaged valid documents into the loaders (and the report) --------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20),
                         st.sampled_from([10**400, -(10**30), 2**63, 7.5, -3, 1.5, 0, 1]),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                         st.sampled_from(["L0H0", "../../etc/passwd", "<script>x</script>", "kv", "zero", ""]))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3)),
                           max_leaves=8)


@pytest.fixture(scope="module")
def folder(tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved circuit (made-up drops, real files) with a calibration and a twin, as `gna scan` writes one."""
    from made_up import write_scan_folder

    model = tiny_models["llama"]
    out = write_scan_folder(tmp_path_factory.mktemp("schemas") / "run", model, model.heads())
    doc = json.loads((out / "circuit.json").read_text())
    doc["calibration"] = {"rows": [{"form": {"template": "completion", "n_pairs": 4}, "task": "kv4", "accuracy": 0.8,
                                    "chance": 0.25, "n_samples": 16, "tokens": 40.0, "verdict": "chosen"}],
                          "chosen": 0, "named": {}, "saturated": 0.95, "seconds": 1.0, "skipped": []}
    doc["twin"] = {"task": "cloze", "k": 4, "method": "zero", "intact": 0.7, "top": 0.6, "random": [0.7, 0.65],
                   "random_median": 0.675}
    (out / "circuit.json").write_text(json.dumps(doc))
    return out


def _paths(node: Any, at: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON document."""
    out = [at]
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out += _paths(v, (*at, k))
    return out


def _replace(doc: Any, at: tuple, value: Any) -> Any:
    if not at:
        return value
    node = doc
    for k in at[:-1]:
        node = node[k]
    node[at[-1]] = value
    return doc


def _load_and_report(folder: Path) -> None:
    from gna_interp.report import build_report

    gna.Circuit.load(folder)
    build_report(folder, png=False)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(file=st.sampled_from(["circuit.json", "scan.json"]), data=st.data())
def test_a_damaged_result_document_is_read_or_refused(folder: Path, tmp_path_factory: pytest.TempPathFactory,
                                                      file: str, data: st.DataObject) -> None:
    """One value anywhere in a valid document replaced by a hostile JSON value: `Circuit.load` and the report
    either work or raise a GnaError."""
    doc = json.loads((folder / file).read_text())
    at = data.draw(st.sampled_from(_paths(doc)[1:]), label="where")
    doc = _replace(doc, at, data.draw(json_values, label="value"))
    work = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(folder, work)
    (work / file).write_text(json.dumps(doc))
    _outcome(lambda: _load_and_report(work))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(["circuit", "scan", "comparison", "hybrid_plan", "delegation", "eval"]), doc=json_values)
def test_random_json_is_read_or_refused(tmp_path_factory: pytest.TempPathFactory, fmt: str, doc: Any) -> None:
    """Random JSON (also with the right ``format`` header) into every JSON loader, the calibration record and the
    task rebuilder."""
    from gna_interp.circuits.search.comparison import CircuitComparison
    from gna_interp.circuits.scan.delegation import Delegation
    from gna_interp.circuits.hybrid import HybridPlan
    from gna_interp.store import FORMAT_VERSIONS, read_json
    from gna_interp.tasks import task_from_dict
    from gna_interp.tasks.calibration import Calibration

    d = tmp_path_factory.mktemp("random")
    headed = {**doc, "format": fmt, "format_version": FORMAT_VERSIONS[fmt]} if isinstance(doc, dict) else doc
    for i, body in enumerate((doc, headed)):
        path = d / f"{i}.json"
        path.write_text(json.dumps(body))
        loaders = {"circuit": lambda: gna.Circuit.load(path), "scan": lambda: gna.HeadScan.load(path),
                   "comparison": lambda: CircuitComparison.load(path), "hybrid_plan": lambda: HybridPlan.load(path),
                   "delegation": lambda: Delegation.load(path), "eval": lambda: read_json(path, "eval")}
        _outcome(loaders[fmt])
    if isinstance(doc, dict):
        _outcome(lambda: Calibration.from_dict(doc))
        _outcome(lambda: task_from_dict(doc))
