"""The benchmarks stay runnable: every gna_interp name a benchmark imports (at the top or inside a function) exists,
and each benchmark runs at its smallest, printing its headline (the scan benchmark: exact equals naive).

A benchmark's real runs are by hand, so without these a renamed or moved function broke it silently
(``benchmarks/scan.py`` imported two names that had moved before this test was written)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("*.py"))


def _gna_imports(path: Path) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` of every ``from gna_interp... import name`` in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    return [(n.module, a.name, n.lineno) for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "gna_interp" for a in n.names]


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_every_name_a_benchmark_imports_from_gna_interp_exists(path):
    missing = []
    for module, name, line in _gna_imports(path):
        mod = importlib.import_module(module)
        if not hasattr(mod, name) and not (hasattr(mod, "__path__") and importlib.util.find_spec(f"{module}.{name}")):
            missing.append(f"line {line}: from {module} import {name}")
    assert not missing, f"{path.name} imports names gna_interp no longer has: {missing}"


def test_the_benchmarks_are_found():
    assert {"identity.py", "scan.py", "scoring.py"} <= {p.name for p in BENCHMARKS}


SMOKE = {  # each benchmark at its smallest: it starts, runs its comparison and prints its headline
    "scan.py": (["--model", "tiny:llama", "--samples", "4", "--pairs", "3", "--max-value", "9", "--naive-heads", "2",
                 "--stacks", "none", "--threads", "1"], "exact vs naive: max |diff|"),
    "scoring.py": (["--models", "tiny-llama", "--n", "4", "--pairs", "3", "--threads", "1"], "| shared |"),
    "vocab.py": (["--vocabs", "1024", "--d-model", "64", "--layers", "1", "--samples", "2", "--repeat", "1",
                  "--threads", "1"], "exact per head / eval grows"),
    "vocab.py:short": (["--vocabs", "1024", "--d-model", "64", "--layers", "1", "--samples", "2", "--repeat", "1",
                        "--threads", "1", "--short"], "word-level tokens (short prompts)"),
    "implicit_attention.py": (["--lengths", "32", "--threads", "1"], "speed-up / mem ratio"),
    "peers.py": (["--smallest", "--threads", "1"], "| zoo transformer | gna exact |"),
}


# Runs each job ``[name, script, args, folder]`` of ``argv[1]`` (JSON) as ``python script args`` in ``folder`` would,
# in a process forked from this one once torch, transformers and TransformerLens are imported (their import is most
# of a small benchmark's time); each one's output goes to ``folder/stdout`` and ``folder/stderr``, and the exit codes
# are printed as JSON.
FORKED = r"""
import json, os, runpy, signal, sys, traceback
import torch, transformers  # noqa: F401
from transformer_lens.model_bridge import TransformerBridge  # noqa: F401
codes = {}
for name, script, args, folder in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        signal.alarm(600)
        os.chdir(folder)
        for fd, file in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv, sys.path[0] = [script, *args], os.path.dirname(script)
        code = 0
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:  # sys.exit("message"): Python prints it and exits 1
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    codes[name] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(codes))
"""


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> dict[str, tuple[int, str, str]]:
    """``{name: (exit code, stdout, stderr)}`` of every benchmark of :data:`SMOKE`, each run as ``python
    benchmarks/NAME ARGS`` in a folder of its own and a process of its own (forked after the heavy imports)."""
    import json
    import os
    import subprocess
    import sys

    jobs = []
    for name, (args, _) in SMOKE.items():
        folder = tmp_path_factory.mktemp(name.replace(":", "-"))
        jobs.append([name, str(BENCHMARKS[0].parent / name.split(":")[0]), args, str(folder)])
    done = subprocess.run([sys.executable, "-c", FORKED, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    codes = json.loads(done.stdout.splitlines()[-1])
    return {name: (codes[name], (Path(folder) / "stdout").read_text(), (Path(folder) / "stderr").read_text())
            for name, _, _, folder in jobs}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_a_benchmark_runs_at_its_smallest(name, smoke_runs):
    import re

    _, headline = SMOKE[name]
    code, stdout, stderr = smoke_runs[name]
    assert code == 0, stderr[-2000:]
    assert headline in stdout, stdout[-2000:]
    if name == "peers.py":  # every tool that ran gives gna exact's drops; ours and TransformerLens's always run
        lines = stdout.split("\n\n")[1].splitlines()
        col = [c.strip() for c in lines[0].split("|")].index("max abs diff") - 1
        table = [line.split("|")[1:-1] for line in lines[2:]]
        ran = {cells[1].strip(): cells for cells in table if "not run" not in cells[col]}
        assert {"gna exact", "gna auto", "gna attribution", "TransformerLens run_with_hooks loop",
                "TransformerLens best", "TransformerLens patching.generic_activation_patch",
                "TransformerLens gradient attribution (plain form)", "gna edge screen (EAP)",
                "gna edge screen (EAP-IG)"} <= set(ran), stdout[-3000:]
        assert all(float(cells[col]) < 1e-4 for cells in ran.values()), stdout[-3000:]
    if name == "scan.py":  # the stacked exact scan equals the naive loops
        diffs = re.search(r"max \|diff\| (\S+) \(scorer\), (\S+) \(full logits\)", stdout)
        assert diffs is not None and max(float(diffs[1]), float(diffs[2])) < 1e-4, stdout[-2000:]


def _benchmark(name: str):
    """A benchmark module, imported from ``benchmarks/`` (which the module's own imports expect on the path)."""
    import sys

    folder = str(BENCHMARKS[0].parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def test_autocircuit_node_names_are_the_edge_screens():
    ac = _benchmark("peers_autocircuit")
    assert [ac.node_name(n) for n in ("Resid Start", "A1.2", "A0.3.Q", "A5.0.V", "MLP 4", "Resid End")] == \
        ["embed", "L1H2", "L0H3.q", "L5H0.v", "MLP4", "logits"]


def test_edge_agreement_compares_shared_edges_and_sums_a_kv_group_against_its_exact_effect():
    peers = _benchmark("peers")
    ref = {"tool": "gna-eap", "drops": {"embed -> L1H0.q": 1.0, "embed -> L1H0.k": 0.5, "embed -> L1H1.k": 0.25,
                                        "L0H0 -> logits": -2.0, "embed -> L1H0.other": 9.0}}
    row = {"tool": "ac-eap", "drops": {"embed -> L1H0.q": 1.0 + 1e-7, "embed -> L1H0.k": 0.5, "embed -> L1H1.k": 0.25,
                                       "L0H0 -> logits": -2.0}}
    exact = {"tool": "gna-edge-exact", "drops": {"embed -> L1H0+L1H1.k": 0.7, "L0H0 -> logits": -1.9}}
    got = peers.edge_agreement(row, ref, exact)
    assert got["compared_heads"] == 4 and got["max_abs_diff"] < 1e-6 and got["spearman"] == pytest.approx(1.0)
    assert got["exact_n"] == 2 and got["exact_max_abs_diff"] == pytest.approx(0.1)  # the group: 0.5 + 0.25 vs 0.7
    assert peers._members("L1H0+L1H1.k") == ["L1H0.k", "L1H1.k"] and peers._members("MLP3") == ["MLP3"]


def test_peers_stamps_our_rows_with_the_version_and_the_commit(tmp_path, monkeypatch):
    import re
    import shutil
    import subprocess

    import gna_interp

    peers = _benchmark("peers")
    peers.gna_version.cache_clear()
    stamp = peers.gna_version()
    if shutil.which("git") and (peers.HERE.parent / ".git").exists():
        head = subprocess.run(["git", "-C", str(peers.HERE.parent), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert re.fullmatch(rf"gna_interp {re.escape(gna_interp.__version__)} \(commit {head}(\+dirty)?\)", stamp)
    monkeypatch.setattr(peers, "HERE", tmp_path / "benchmarks")  # a copy of the scripts outside any checkout
    peers.gna_version.cache_clear()
    try:
        assert peers.gna_version() == f"gna_interp {gna_interp.__version__}"
    finally:
        peers.gna_version.cache_clear()


@pytest.mark.slow
def test_autocircuit_edge_attribution_equals_the_edge_screen(tmp_path):
    """auto-circuit's EAP and its edges left out one at a time equal ours on the zoo transformer (zero ablation,
    the logit difference): needs auto-circuit's environment, which ``benchmarks/peers.py`` builds on first use."""
    import json
    import os
    import subprocess
    import sys

    peers = _benchmark("peers")
    venv = peers.cache_dir() / "auto-circuit-venv"
    if peers.pinned_python(venv, peers.AC_PROBE, peers.AC_PINS, build=False)[0] is None:
        pytest.skip(f"no auto-circuit environment at {venv} (benchmarks/peers.py --models zoo builds it)")
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS[0].parent / "peers.py"), "--models", "zoo", "--samples",
                           "4", "--pairs", "3", "--threads", "1", "--no-build", "--edge-exact", "30", "--repeats", "1", "--tools",
                           "gna-eap,ac-eap,gna-edge-exact,ac-exact", "--json", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["tool"]: r for r in json.loads(out.read_text())}
    assert "error" not in rows["ac-eap"] and "error" not in rows["ac-exact"], done.stdout[-2000:]
    assert rows["ac-eap"]["compared_heads"] == len(rows["gna-eap"]["drops"]) > 0
    assert rows["ac-eap"]["max_abs_diff"] < 1e-4 and rows["ac-exact"]["max_abs_diff"] < 1e-4, done.stdout[-2000:]


def test_the_first_tokens_every_candidate_shares_join_the_prompt():
    peers = _benchmark("peers")
    got = peers.shared_first_tokens({"prompt": [1, 2], "cands": [[9, 5], [9, 6], [9, 7, 8]], "gold": 0})
    assert got == {"prompt": [1, 2, 9], "cands": [[5], [6], [7, 8]], "gold": 0}
    same = {"prompt": [1], "cands": [[9], [9, 4]], "gold": 1}  # a candidate keeps one token at least
    assert peers.shared_first_tokens(same) == same


def test_floors_price_each_stage_of_a_scan_against_a_clean_forward(tmp_path):
    """benchmarks/floors.py on a zoo scan: the scan's and the curve's floors -- one attribution pass and one replay
    per exact head, one replay per ablated set, each from its first layer -- never exceed the blocks those stages
    ran (else they would not be floors); a stage of clean forwards only is its own floor; every price is positive."""
    from gna_interp.cli import main

    out = tmp_path / "scan"
    assert main(["scan", "--model", "zoo:transformer-kv", "--out", str(out), "--quiet", "--no-png", "--threads",
                 "1"]) == 0
    table = _benchmark("floors").stage_floors(out, repeat=1).set_index("stage")
    for stage in ("scan", "curve"):
        assert 0 < table.loc[stage, "floor_block_tokens"] <= table.loc[stage, "block_tokens"], table
    assert table.loc["roles", "floor_block_tokens"] == table.loc["roles", "block_tokens"]
    assert table.attrs["cpu_s_per_block_token"] > 0 and (table["floor_cpu_s"].dropna() >= 0).all()
    assert table.loc["scan", "ratio"] > 0
