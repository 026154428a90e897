"""Shared fixtures for the catalog tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_flow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point FLOW_HOME at an empty folder so a user's refreshed catalog never leaks in."""
    home = tmp_path / "flow_home"
    monkeypatch.setenv("FLOW_HOME", str(home))
    return home
