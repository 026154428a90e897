"""Fixtures of the dashboard's browser tests: the system's Chromium under Playwright."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dashboard_testing import launch_chromium


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Chromium under Playwright, started with a FLOW_HOME of its own (the driver and the
    browser inherit it), so no test's check of its own FLOW_HOME's processes counts them."""
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLOW_HOME", str(tmp_path_factory.mktemp("browser-home")))
        with sync_playwright() as playwright:
            chromium = launch_chromium(playwright)
            try:
                yield chromium
            finally:
                chromium.close()  # type: ignore[attr-defined]
