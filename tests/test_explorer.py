"""The live explorer: its Python side against ``evaluate`` under ``ablate``, and the widget
served live by Voila (a Jupyter server with a kernel) and driven in headless Chromium."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import torch

import gna_interp as gna
from gna_interp.errors import InputError
from gna_interp.viz import explore
from gna_interp.viz.explorer import Explorer

CHROMIUM = os.environ.get("GNA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run"]
HEAD = "L0H3"


@pytest.fixture(scope="module")
def zoo():
    torch.set_num_threads(1)
    model = gna.load_model("zoo:transformer-kv")
    task = gna.KVRetrieval(8, 16, seed=0, words=model.kv_words)
    return model, task


@pytest.fixture(scope="module")
def expected(zoo):
    model, task = zoo
    clean = gna.evaluate(model, task, progress=False).metrics
    with gna.ablate(model, [HEAD]):
        ablated = gna.evaluate(model, task, progress=False).metrics
    return clean, ablated


def test_removing_a_head_shows_what_evaluate_gives_under_ablate(zoo, expected):
    model, task = zoo
    clean, ablated = expected
    ex = Explorer(model, task)
    assert ex.state["removed"] == []
    assert ex.state["accuracy"] == pytest.approx(clean["accuracy"], abs=1e-6)
    assert ex.state["logit_diff"] == pytest.approx(clean["logit_diff"], abs=1e-6)
    state = ex.select([HEAD]).apply()
    assert state["removed"] == [HEAD] and state["method"] == "zero"
    assert state["accuracy"] == pytest.approx(ablated["accuracy"], abs=1e-6)
    assert state["logit_diff"] == pytest.approx(ablated["logit_diff"], abs=1e-6)
    assert state["clean_accuracy"] == pytest.approx(clean["accuracy"], abs=1e-6)
    probs = state["probs"]
    assert len(probs) == len(task.samples[0].candidates) and sum(probs) == pytest.approx(1.0, abs=1e-5)
    assert ex.restore()["accuracy"] == pytest.approx(clean["accuracy"], abs=1e-6)


def test_mean_method_and_prompt_choice_follow_ablate(zoo):
    model, task = zoo
    ex = Explorer(model, task).set_method("mean").set_sample(3)
    state = ex.select([HEAD]).apply()
    with gna.ablate(model, [HEAD], method="mean", reference=task):
        ev = gna.evaluate(model, task, progress=False)
    assert state["accuracy"] == pytest.approx(ev.metrics["accuracy"], abs=1e-6)
    assert state["logit_diff"] == pytest.approx(ev.metrics["logit_diff"], abs=1e-6)
    row = ev.scores.scores[3, :len(task.samples[3].candidates)]
    assert state["probs"] == pytest.approx(torch.softmax(row, -1).tolist(), abs=1e-5)
    assert state["sample"] == 3 and state["prompt"] == task.samples[3].prompt


def test_the_widget_shows_the_numbers_and_the_removed_heads_patterns(zoo, expected):
    model, task = zoo
    widget = explore(model, task)
    ex = widget.explorer
    ex.select([HEAD])
    assert ex._list.value == (HEAD,)
    ex._remove.click()  # the button's own handler, as a click in the browser runs it
    assert ex.state["accuracy"] == pytest.approx(expected[1]["accuracy"], abs=1e-6)
    assert f'class="gna-accuracy">{expected[1]["accuracy"]:.4f}<' in ex._metrics.value
    assert "<iframe" in ex._patterns.value and HEAD in ex._patterns.value
    with pytest.raises(InputError):
        ex.set_method("resample")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NOTEBOOK_SOURCE = """\
import torch
torch.set_num_threads(1)
import gna_interp as gna
from gna_interp.errors import InputError
from gna_interp.viz import explore
model = gna.load_model("zoo:transformer-kv")
task = gna.KVRetrieval(8, 16, seed=0, words=model.kv_words)
explore(model, task)
"""


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
@pytest.mark.skipif(importlib.util.find_spec("voila") is None,
                    reason="needs voila (pip install -e .[dev]) to serve live widgets from a kernel")
def test_removing_a_head_in_the_browser_shows_the_ablated_accuracy(expected, tmp_path):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": "explore", "metadata": {}, "outputs": [],
                     "source": NOTEBOOK_SOURCE}],
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
          "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "explore.ipynb").write_text(json.dumps(nb))
    port = _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    log = open(tmp_path / "voila.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "voila", "explore.ipynb", "--no-browser", f"--port={port}",
                               "--Voila.ip=127.0.0.1", "--show_tracebacks=True"],
                              cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(url, timeout=5)
                break
            except urllib.error.HTTPError:  # any answer: the server is up
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    pytest.fail("voila did not start:\n" + (tmp_path / "voila.log").read_text()[-3000:])
                time.sleep(0.5)
        want = f"{expected[1]['accuracy']:.4f}"
        clean = f"{expected[0]['accuracy']:.4f}"
        assert want != clean, "L0H3 should change the zoo Transformer's accuracy"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(url, timeout=120_000)
            page.wait_for_selector(".gna-explorer-heads select", timeout=180_000)
            assert page.inner_text(".gna-explorer-metrics .gna-accuracy").strip() == clean
            page.select_option(".gna-explorer-heads select", [HEAD])
            page.click(".gna-explorer-remove")
            page.wait_for_function(
                "() => (document.querySelector('.gna-explorer-metrics .gna-removed') || {}).textContent === 'L0H3'",
                timeout=120_000)
            shown = page.inner_text(".gna-explorer-metrics .gna-accuracy").strip()
            assert shown == want
            assert float(shown) == pytest.approx(expected[1]["accuracy"], abs=1e-4)
            frame = page.wait_for_selector(".gna-explorer-patterns iframe", timeout=60_000)  # sent after the numbers
            assert frame.get_attribute("title") == f"patterns: {HEAD}"
            page.wait_for_timeout(1500)  # let circuitsvis draw before the screenshot
            shot = os.environ.get("GNA_EXPLORER_SCREENSHOT")  # the whole page when asked for; else the view
            page.screenshot(path=str(tmp_path / "explorer.png"), full_page=bool(shot))
            if shot:
                shutil.copy(tmp_path / "explorer.png", shot)
            browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
