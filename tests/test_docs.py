"""The documentation: the mkdocs site builds strictly and offline, its API page lists every top-level
name, every top-level name has a docstring, and the code in the guide pages runs."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gna_interp as gna

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _mkdocs() -> list[str]:
    exe = Path(sys.executable).parent / "mkdocs"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "mkdocs"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mkdocs build --strict`` into a temporary folder (no network: the config fetches nothing)."""
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([*_mkdocs(), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return out


def test_site_builds_strictly_and_the_api_page_lists_every_top_level_name(site: Path):
    page = (site / "api" / "index.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'id="(gna_interp[\w.]*)"', page))
    missing = [name for name in gna.__all__ if f"gna_interp.{name}" not in ids]
    assert not missing, f"the API page has no entry for gna_interp.{missing}"
    for sub in ("models", "mixing", "interventions", "tasks", "circuits", "viz", "report", "experiments"):
        assert (site / "api" / sub / "index.html").is_file(), sub
    # the reST of the docstrings was turned into Markdown (docs/_ext/rst_docstrings.py)
    for html in (site / "api").rglob("index.html"):
        text = html.read_text(encoding="utf-8")
        leftovers = re.findall(r":(?:class|func|meth|mod|data|attr):`", text)
        assert not leftovers, f"{html.relative_to(site)} shows raw Sphinx roles: {leftovers[:3]}"


def test_every_top_level_name_has_a_docstring():
    bare = []
    for name in gna.__all__:
        obj = getattr(gna, name)
        doc = obj.__doc__ or ""
        # a dataclass without a docstring gets its signature as __doc__: that does not count
        if not doc.strip() or (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")):
            bare.append(name)
    assert not bare, f"top-level names without a docstring: {bare}"


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (DOCS / page).read_text(encoding="utf-8"), flags=re.S | re.M)


@pytest.mark.slow
@pytest.mark.parametrize("page", ["python.md", "architecture.md"])
def test_the_code_in_the_guide_runs(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Every ```python block of the page, in order, in one namespace (on the shipped zoo Transformer)."""
    import torch

    from gna_interp.models import kinds, zoo_names

    if "transformer-kv" not in zoo_names():
        pytest.skip("the zoo Transformer is not installed")
    import gna_interp.report.build as build

    def no_png(*args, **kwargs):
        raise RuntimeError("PNG export skipped in the docs test")

    monkeypatch.setattr(build, "write_pngs", no_png)  # the report still says why; saves a browser start
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    before = kinds()
    blocks = _python_blocks(page)
    assert blocks, f"no python code in docs/{page}"
    namespace: dict = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/{page} block {i + 1}", "exec"), namespace)
    assert kinds() == before, "a docs example left a head kind registered"
