"""The notebooks are stored without outputs and run top to bottom offline (nbclient, a fresh kernel)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # a cell; 03_paper_claims runs SmolLM2 cells when it is installed


def _load(path: Path):
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(path, as_version=4)


def test_the_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_ssm_vs_attention.ipynb", "03_paper_claims.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path: Path):
    nb = _load(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    dirty = [i for i, c in enumerate(code) if c.outputs or c.execution_count is not None]
    assert not dirty, f"{path.name}: code cells {dirty} carry outputs; strip them before committing"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = _load(path)
    env_threads = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "TQDM_DISABLE": "1"}
    old = {k: os.environ.get(k) for k in env_threads}
    os.environ.update(env_threads)
    start = time.perf_counter()
    try:
        client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                         resources={"metadata": {"path": str(tmp_path)}})
        client.execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = time.perf_counter() - start
    print(f"{path.name}: {seconds:.1f}s on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    if path.stem == "01_quickstart":
        _check_figures_display_themselves(nb)
    if path.stem == "03_paper_claims":
        _check_claims_are_measured(nb)


def _check_figures_display_themselves(nb) -> None:
    """Cells whose value is a viz result show the figure: an offline circuitsvis iframe, plotly JSON."""
    def results(marker: str) -> list[dict]:
        cells = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
        assert cells, f"no cell calls {marker}"
        return [o.get("data", {}) for c in cells for o in c.outputs if o.output_type in ("execute_result", "display_data")]

    view = results("patterns_page(")
    assert view and "text/html" in view[0], view
    html = view[0]["text/html"]
    assert html.startswith("<iframe") and "CircuitsVis.render" in html and "var CircuitsVis" in html
    for marker in ("score_heatmap(", "ablation_curve(", "ga_card("):
        figs = results(marker)
        assert figs and "application/vnd.plotly.v1+json" in figs[0], (marker, list(figs[0]) if figs else None)


def _check_claims_are_measured(nb) -> None:
    """03_paper_claims prints each claim's numbers and shows the sweep and families figures."""
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                     if o.output_type == "stream")
    for marker in ("Transformer: intact", "dictionary sweep of zoo:transformer-kv", "smoother: gold share",
                   "more redundant: removing one head"):
        assert marker in text, marker
    figs = [c for c in nb.cells if c.cell_type == "code" and ("sw.figure()" in c.source or "fam.figure()" in c.source)]
    assert len(figs) == 2
    for c in figs:
        data = [o.get("data", {}) for o in c.outputs if o.output_type in ("execute_result", "display_data")]
        assert data and "application/vnd.plotly.v1+json" in data[0], c.source
