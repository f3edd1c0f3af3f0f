"""The benchmarks stay runnable: every gna_interp name a benchmark imports (at the top or inside a function) exists.

A benchmark is run by hand, not by the suite, so a renamed or moved function would otherwise break it silently
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
