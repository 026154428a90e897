"""The flow data directory holds task secrets: flow refuses one it does not own outright."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from flow_sdk._config import flow_home


def _another_users_directory(tmp_path: Path) -> Path:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o755)
    os.chown(theirs, 4242, 4242)  # root here: make it another user's
    return theirs


def test_a_symlinked_flow_home_is_refused_and_its_target_left_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a link in another user's directory, to a directory flow would otherwise take over
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o755)
    link = _another_users_directory(tmp_path) / "flow"
    link.symlink_to(target)
    monkeypatch.setenv("FLOW_HOME", str(link))
    with pytest.raises(PermissionError, match="is a symbolic link") as info:
        flow_home()
    assert str(link) in str(info.value) and "remove the link and set FLOW_HOME" in \
        str(info.value)
    # through the command line too: refused, and nothing written or tightened there
    listed = subprocess.run(["flow", "list"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "FLOW_HOME": str(link)})
    assert listed.returncode != 0 and "is a symbolic link" in listed.stderr, listed
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert list(target.iterdir()) == []


def test_a_symlink_to_nowhere_is_refused_before_anything_is_created(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "not-yet" / "flow"
    link = tmp_path / "dangling"
    link.symlink_to(target)
    monkeypatch.setenv("FLOW_HOME", str(link))
    with pytest.raises(PermissionError, match="is a symbolic link"):
        flow_home()
    assert not (tmp_path / "not-yet").exists()


def test_a_flow_home_of_ones_own_is_created_private_and_a_foreign_one_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "a" / "flow"
    monkeypatch.setenv("FLOW_HOME", str(mine))
    assert flow_home() == mine and stat.S_IMODE(mine.stat().st_mode) == 0o700
    theirs = _another_users_directory(tmp_path)
    monkeypatch.setenv("FLOW_HOME", str(theirs))
    with pytest.raises(PermissionError, match="belongs to user 4242.*set FLOW_HOME"):
        flow_home()
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o755
