"""What the browser tests share: the Chromium they drive and where a graph point sits on the page."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

CHROMIUM = os.environ.get("GNA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run"]

# page.evaluate(GRAPH_POINT, [trace name, customdata key]): the page coordinates of that point of the #gna-graph plot
GRAPH_POINT = """([trace, key]) => {
    const gd = document.getElementById('gna-graph');
    const d = gd.data.find(t => t.name === trace);
    const i = d.customdata.indexOf(key), fl = gd._fullLayout, box = gd.getBoundingClientRect();
    return {x: box.left + fl.xaxis._offset + fl.xaxis.d2p(d.x[i]),
            y: box.top + fl.yaxis._offset + fl.yaxis.d2p(d.y[i])}; }"""


@contextmanager
def graph_page(report: Path, errors: list[str]) -> Iterator[Any]:
    """A Chromium page (1280 x 900) showing ``report`` scrolled to its drawn circuit graph; the page's script errors
    are appended to ``errors``. Skips the test when playwright is not installed."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(report.as_uri(), wait_until="load", timeout=120_000)
            page.wait_for_function("document.querySelector('#gna-graph .scatterlayer') !== null", timeout=120_000)
            page.evaluate("document.getElementById('gna-graph').scrollIntoView()")
            yield page
        finally:
            browser.close()


def click_point(page: Any, trace: str, key: Any, until: str, waits_ms: tuple[int, ...] = (5_000, 30_000, 30_000)) -> None:
    """Click the point ``key`` of ``trace`` on the #gna-graph plot with the mouse until the JavaScript condition
    ``until`` holds, waiting ``waits_ms[i]`` after try ``i``: the point is looked up again before each try, since a
    busy page may still be laying the plot out (a scroll bar, a responsive resize) when the first click lands, and a
    click that missed shows within a moment (clicking a point again shows the same thing)."""
    for attempt, wait in enumerate(waits_ms):
        page.evaluate("document.getElementById('gna-graph').scrollIntoView()")
        at = page.evaluate(GRAPH_POINT, [trace, key])
        page.mouse.click(at["x"], at["y"])
        try:
            page.wait_for_function(until, timeout=wait)
            return
        except Exception:  # noqa: BLE001 -- playwright's TimeoutError: try again, the last time let it raise
            if attempt == len(waits_ms) - 1:
                raise
