"""The built wheel is the toolkit, not only the checkout: built from a copy of the package sources, installed
(``--no-deps``) into a folder of its own, and run from a folder outside the checkout -- ``gna scan`` on a zoo
model, ``gna lm-eval run`` and ``gna eval`` on a shipped task with no ``--include-path``.

No dependency is downloaded: the installed copy runs on this environment's torch, transformers and lm-eval
(``PYTHONPATH`` puts the wheel's folder first; each run checks that ``gna_interp`` comes from it). The
build needs setuptools >= 68: this environment's when it has it, else pip's isolated build fetches it
from the package index; only when that is impossible here (no index reachable) is the module skipped.
``pytest -m "not wheel"`` leaves it out.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.wheel, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
# pip's words when an isolated build cannot get setuptools (no index, no network): the only reason to skip
_NO_INDEX = re.compile(r"Could not find a version that satisfies the requirement setuptools|No matching distribution "
                       r"found for setuptools|Failed to establish a new connection|Temporary failure in name "
                       r"resolution|Network is unreachable|Name or service not known", re.I)


@dataclass
class Installed:
    wheel: Path  # the built .whl
    site: Path  # the folder it was installed into (pip --target)
    gna: Path  # its console script
    work: Path  # a folder outside the checkout to run in
    build_s: float


def _build_isolated_needed() -> bool:
    """Whether this environment lacks a setuptools that can build the wheel itself (>= 68, with ``wheel``
    before 70.1, which took ``bdist_wheel`` in)."""
    if importlib.util.find_spec("setuptools") is None:
        return True
    from importlib.metadata import version

    parts = tuple(int(x) for x in re.findall(r"\d+", version("setuptools"))[:2])
    if parts < (68, 0):
        return True
    return parts < (70, 1) and importlib.util.find_spec("wheel") is None


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"  # a copy: an in-tree build would write build/ and *.egg-info into the checkout
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    shutil.copytree(ROOT / "gna_interp", src / "gna_interp",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    dist = base / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(src)]
    if not _build_isolated_needed():
        cmd.insert(5, "--no-build-isolation")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    build_s = time.perf_counter() - start
    if proc.returncode != 0:
        out = proc.stdout + proc.stderr
        if "--no-build-isolation" not in cmd and _NO_INDEX.search(out):
            pytest.skip(f"cannot build the wheel here: no setuptools>=68 and no package index ({out[-300:]!r})")
        pytest.fail(f"building the wheel failed:\n{out[-4000:]}")
    wheels = sorted(dist.glob("gna_interp-*.whl"))
    assert len(wheels) == 1, wheels
    site = (base / "site").resolve()
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site),
                           str(wheels[0])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gna = site / "bin" / ("gna.exe" if os.name == "nt" else "gna")
    assert gna.is_file(), sorted(p.name for p in (site / "bin").iterdir()) if (site / "bin").is_dir() else site
    work = (base / "run").resolve()
    work.mkdir()
    return Installed(wheels[0], site, gna, work, build_s)


def _env(inst: Installed) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(inst.site)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TQDM_DISABLE="1",
               PYTHONDONTWRITEBYTECODE="1")
    return env


def _run(inst: Installed, *args: str, timeout: int = 300) -> tuple[str, float]:
    """``gna ARGS`` through the installed console script, in a folder outside the checkout; its output."""
    start = time.perf_counter()
    proc = subprocess.run([str(inst.gna), *args], cwd=inst.work, env=_env(inst), capture_output=True, text=True,
                          timeout=timeout)
    took = time.perf_counter() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"gna {' '.join(args)} exited {proc.returncode}:\n{out[-4000:]}"
    print(f"gna {' '.join(args)}: {took:.1f} s")
    return out, took


def test_the_wheel_holds_the_package_data(installed: Installed):
    """Every file of the package in the checkout (Python or not: zoo weights, word lists, task YAMLs, py.typed)
    is in the wheel, and the installed copy is the one that imports."""
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    here = {p.relative_to(ROOT).as_posix() for p in (ROOT / "gna_interp").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    missing = sorted(here - names)
    assert not missing, f"files of gna_interp/ missing from the wheel (package-data in pyproject.toml?): {missing}"
    for f in ("gna_interp/py.typed", "gna_interp/data/eval_tasks/gna_kv_mc.yaml",
              "gna_interp/data/eval_tasks/gna_kv_mc.jsonl", "gna_interp/data/eval_tasks/gna_local.py",
              "gna_interp/templates/page.html", "gna_interp/viz/static/graph.js",
              "gna_interp/viz/static/head_view.js"):
        assert f in names, f
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = zipfile.ZipFile(installed.wheel).read(meta).decode()
    assert "Project-URL:" in metadata and "Description-Content-Type: text/markdown" in metadata
    proc = subprocess.run([sys.executable, "-c", "import gna_interp, gna_interp.experiments.eval_tasks as t; "
                                                 "print(gna_interp.__file__); print(t.TASKS_DIR); "
                                                 "print(gna_interp.__version__)"],
                          cwd=installed.work, env=_env(installed), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    where, tasks, version = proc.stdout.split()
    assert Path(where).resolve().is_relative_to(installed.site), f"gna_interp imported from {where}, not the wheel"
    assert Path(tasks).resolve().is_relative_to(installed.site) and (Path(tasks) / "gna_kv_gen.yaml").is_file()
    assert f"Version: {version}" in metadata


def test_gna_scan_runs_from_the_wheel(installed: Installed):
    out, _ = _run(installed, "scan", "--model", "zoo:transformer-kv", "--samples", "8", "--top-k", "2", "--seeds",
                  "1", "--no-png", "--out", "scan")
    folder = installed.work / "scan"
    for f in ("circuit.json", "scan.csv", "summary.md", "report.html"):
        assert (folder / f).is_file(), (f, out[-2000:])
    assert "L0H3" in (folder / "summary.md").read_text(encoding="utf-8")  # the zoo Transformer's gather head
    page = (folder / "report.html").read_text(encoding="utf-8")
    assert "window.gnaShowHead = show;" in page and "window.gnaShowEdge = showEdge;" in page  # the shipped scripts


def test_gna_lm_eval_finds_the_shipped_tasks(installed: Installed, tiny_dirs):
    # a tiny Llama with a byte-level tokenizer: the shipped tasks' words are outside the zoo's vocabulary
    pytest.importorskip("lm_eval")
    out, _ = _run(installed, "lm-eval", "run", "--model", "gna", "--model_args", f"model={tiny_dirs['llama']}",
                  "heads=L0H3", "--tasks", "gna_kv_mc,gna_kv_gen", "--limit", "3", "--batch_size", "4")
    assert re.search(r"\|\s*gna_kv_mc\s*\|", out) and re.search(r"\|\s*gna_kv_gen\s*\|", out), out[-3000:]
    # the task files lm-eval read are the installed copy's
    assert str(installed.site / "gna_interp" / "data" / "eval_tasks" / "gna_kv_mc.yaml") in out, out[-3000:]


def test_gna_eval_finds_the_shipped_tasks(installed: Installed, tiny_dirs):
    pytest.importorskip("lm_eval")
    out, _ = _run(installed, "eval", "--model", str(tiny_dirs["llama"]), "--tasks", "gna_kv_mc", "--ablate", "L0H3",
                  "--random-k", "0", "--limit", "3", "--no-png", "--out", "eval")
    assert (installed.work / "eval" / "eval_summary.csv").is_file(), out[-3000:]
    assert "gna_kv_mc" in (installed.work / "eval" / "eval_summary.csv").read_text(encoding="utf-8")
    eval_help, _ = _run(installed, "eval", "--help")
    assert "tests/data" not in eval_help
