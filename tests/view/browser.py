"""Headless Chromium for the dashboard's tests: Debian's `chromium`, driven by Playwright.

Playwright is pointed at the system browser (`executable_path`); it never downloads one. Tests
that need it are skipped, saying why, where either is missing. Screenshots go to
results/view/ (git-ignored).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
RESULTS = Path(__file__).resolve().parents[2] / "results" / "view"


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def launch() -> Iterator[Any]:
    """A Playwright Chromium browser (a generator for a fixture); skips without one."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install playwright)")
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium: `apt-get install -y chromium` (.ci/run does it in CI)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_dashboard(browser: Any, url: str, timeout_ms: float = 30_000) -> Any:
    """A page on `url`, once the dashboard says every panel has drawn; page errors fail."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("window.heddleView && window.heddleView.ready.all", timeout=timeout_ms)
    page.errors = errors  # type: ignore[attr-defined]
    return page


def view_stats(page: Any) -> dict[str, Any]:
    return dict(page.evaluate("() => window.heddleView.stats"))


def screenshot(page: Any, name: str, panels: tuple[str, ...] = ()) -> Path:
    """The whole page as results/view/<name>.png, and each panel as <name>-<panel>.png."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    for panel in panels:
        page.locator(f"#panel-{panel}").screenshot(path=str(RESULTS / f"{name}-{panel}.png"))
    return path
