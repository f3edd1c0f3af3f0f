"""Edge tables are checked for meaning: on load (circuit.json's ``edges``), and on the Python :class:`Edge`. A sender
after its receiver, a ``logits`` receiver with a ``k`` input, a reversed interval, an edge measured twice, a head the
model does not have: refused in one line naming the row. The ``edge`` label is derived from its row, never read
back. A property test throws generated hostile tables at the check."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gna_interp.circuits.edges.causal import EDGE_COLUMNS, causal_roles, check_edge_table, strongest_path
from gna_interp.circuits.edges.paths import Edge
from gna_interp.models.mixer import INPUTS
from gna_interp.models.graph import LOGITS, POSITIONS
from gna_interp.cli import main
from gna_interp.errors import GnaError, HeadError, InputError
from gna_interp.models.heads import HeadRef
from made_up import edited_copy

HEADS = [HeadRef(layer, head) for layer in range(3) for head in range(4)]
NAMES = [h.name for h in HEADS]


def _row(sender: str, receiver: str, inp: str, positions: str = "items", effect=1.0, low=0.5, high=1.5,
         label: str | None = None) -> dict:
    return {"edge": label if label is not None else "whatever", "sender": sender, "receiver": receiver, "input": inp,
            "positions": positions, "effect": effect, "low": low, "high": high}


GOOD = [_row("L0H1", "L1H2", "k"), _row("L0H1", "L1H2", "v"), _row("L0H1", LOGITS, LOGITS, "all"),
        _row("L1H2", LOGITS, LOGITS, "all", 2.0, 1.0, 3.0)]


def test_a_good_table_is_read_with_its_labels_derived():
    rows = [dict(r, edge="<script>alert(1)</script>") for r in GOOD]
    table = check_edge_table(rows, HEADS)
    assert list(table.columns) == EDGE_COLUMNS
    assert list(table["edge"]) == ["L0H1 -> L1H2.k@items", "L0H1 -> L1H2.v@items", "L0H1 -> logits", "L1H2 -> logits"]


@pytest.mark.parametrize("row, needle", [
    (_row("L2H0", "L2H3", "k"), "later layer"),
    (_row("L2H1", "L2H3", "k"), "later layer"),
    (_row("L0H2", LOGITS, "k", "all"), "reads the logits"),
    (_row("L0H2", "L2H3", LOGITS), "belongs to a direct edge"),
    (_row("L0H2", "L2H3", "key"), "unknown receiver input"),
    (_row("L0H2", "L2H3", "k", "everywhere"), "unknown positions"),
    (_row("L0H2", "L2H3", "k", low=2.0, high=1.0), "interval is reversed"),
    (_row("L0H2", "L9H9", "k"), "not among the 12 scanned heads"),
    (_row("L0H2", "L2H3", "k", effect="big"), "effect must be a number"),
    (_row("L0H2", "L2H3", "k", high=math.inf), "not a finite number"),
    (_row("nobody", "L2H3", "k"), "malformed head name"),
    (_row("L0H2", "L2H3+4", "k"), "groupable kinds"),
    (_row("L0H1", "L1H2", "k", effect=-1.0), "measures L0H1 -> L1H2.k@items again"),
])
def test_a_table_row_without_meaning_is_refused(row, needle):
    with pytest.raises(InputError, match="row 4") as e:
        check_edge_table([*GOOD, row], HEADS, "circuit.json")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_the_python_edge_is_checked_when_made():
    h = HeadRef.parse
    with pytest.raises(HeadError, match="later layer"):
        Edge(h("L2H0"), h("L1H0"), "k")
    with pytest.raises(InputError, match="reads the logits"):
        Edge(h("L0H0"), None, "k")
    with pytest.raises(InputError, match="belongs to a direct edge"):
        Edge(h("L0H0"), h("L1H0"), LOGITS)
    with pytest.raises(InputError, match="unknown positions"):
        Edge(h("L0H0"), h("L1H0"), "k", "nowhere")
    with pytest.raises(InputError, match="or a HeadRef"):
        Edge(3, None)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="name the receiver's input"):
        Edge(h("L0H0"), h("L1H0"))
    with pytest.raises(InputError, match="must be a string"):
        Edge(h("L0H0"), h("L1H0"), 5)  # type: ignore[arg-type]
    assert Edge("L0H0", "L1H0", "k", "items") == Edge(h("L0H0"), h("L1H0"), "k", "items")  # names are parsed


# ---- the same through circuit.json and the commands that read it ------------------------------------------------

@pytest.fixture(scope="module")
def edge_folder(tiny_models, tmp_path_factory) -> Path:
    """A made-up scan folder of the tiny Llama whose circuit.json carries a measured-looking edge table."""
    from made_up import write_scan_folder

    model = tiny_models["llama"]
    folder = write_scan_folder(tmp_path_factory.mktemp("edges") / "run", model, model.heads())
    doc = json.loads((folder / "circuit.json").read_text())
    first, later = model.heads()[0].name, next(h.name for h in model.heads() if h.layer > 0)
    doc["edges"] = [_row(first, later, "k"), _row(first, later, "v"), _row(first, LOGITS, LOGITS, "all"),
                    _row(later, LOGITS, LOGITS, "all")]
    (folder / "circuit.json").write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize("change, needle", [
    (lambda e: e[0].update(sender=e[0]["receiver"], receiver=e[0]["sender"]), "later layer"),
    (lambda e: e[2].update(input="k"), "reads the logits"),
    (lambda e: e[0].update(low=3.0, high=-3.0), "interval is reversed"),
    (lambda e: e.append(dict(e[0], effect=-e[0]["effect"], low=-2.0, high=-0.1)), "again"),
    (lambda e: e[1].update(receiver="L9H9"), "not among the"),
])
def test_a_circuit_json_edge_table_without_meaning_is_refused(change, needle, edge_folder, tmp_path, capsys):
    folder = edited_copy(edge_folder, tmp_path / "run", lambda doc: change(doc["edges"]))
    before = (folder / "report.html").read_bytes() if (folder / "report.html").exists() else None
    assert main(["report", str(folder), "--no-png"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "field 'edges'" in err[0] and needle in err[0], err
    after = (folder / "report.html").read_bytes() if (folder / "report.html").exists() else None
    assert after == before


def test_a_stored_label_is_never_read_back(edge_folder, tmp_path):
    from gna_interp.circuits import Circuit
    from gna_interp.report import build_report

    folder = tmp_path / "run"
    shutil.copytree(edge_folder, folder)
    doc = json.loads((folder / "circuit.json").read_text())
    doc["edges"][0]["edge"] = "<script>alert(1)</script> L9H9 -> L0H0"
    (folder / "circuit.json").write_text(json.dumps(doc))
    circuit = Circuit.load(folder)
    assert not circuit.edges["edge"].str.contains("script").any()
    build_report(folder, png=False)
    assert "alert(1)" not in (folder / "summary.md").read_text() + (folder / "report.html").read_text()


# ---- property: generated hostile tables are refused in one line or read with every invariant -------------------

_names = st.one_of(st.sampled_from(NAMES + [LOGITS]), st.sampled_from(["L9H9", "L0H0+2", "", "x", "L-1H0"]),
                   st.text(max_size=8))
_numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30), st.none(),
                     st.booleans(), st.text(max_size=3))
_rows = st.fixed_dictionaries({
    "edge": st.text(max_size=20), "sender": _names, "receiver": _names,
    "input": st.one_of(st.sampled_from([*INPUTS, LOGITS]), st.text(max_size=4), st.none()),
    "positions": st.one_of(st.sampled_from(POSITIONS), st.text(max_size=6)),
    "effect": _numbers, "low": _numbers, "high": _numbers})
_tables = st.lists(st.one_of(_rows, st.sampled_from(GOOD)), max_size=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=_tables)
def test_hostile_edge_tables_are_refused_or_read_with_meaning(table):
    try:
        got = check_edge_table(table, HEADS, "circuit.json")
    except GnaError as e:
        assert isinstance(e, InputError) and "\n" not in str(e) and str(e).startswith("circuit.json: row ")
        return
    seen = set()
    for _, r in got.iterrows():
        sender = HeadRef.parse(r["sender"])
        assert sender.name in NAMES
        if r["receiver"] == LOGITS:
            assert r["input"] == LOGITS and r["edge"] == f"{sender.name} -> logits" + (
                "" if r["positions"] == "all" else f"@{r['positions']}")
        else:
            receiver = HeadRef.parse(r["receiver"])
            assert receiver.name in NAMES and receiver.layer > sender.layer and r["input"] in INPUTS
            assert r["edge"] == f"{sender.name} -> {receiver.name}.{r['input']}@{r['positions']}"
        assert r["positions"] in POSITIONS and r["edge"] not in seen
        seen.add(r["edge"])
        for k in ("effect", "low", "high"):
            assert isinstance(r[k], float) and not math.isinf(r[k])
        assert not r["low"] > r["high"]
    roles = causal_roles(got, {n: 1.0 for n in NAMES})  # what the circuit reads off an accepted table
    assert set(roles["causal_role"]) <= {"aggregate", "gather", "output", "query", "none"}
    strongest_path(got, roles)
