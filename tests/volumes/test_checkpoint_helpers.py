"""The checkpoint helpers and ``current.path`` in one process (the multi-node use is in
test_ddp_checkpoint_example.py)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from flow_sdk import current
from flow_sdk.wire import envvars
from flow_sdk.volumes import (
    ReadOnlyMountError,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)


@pytest.fixture()
def mounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A mapped volume at /shared/ckpt and a read-only S3 mount at /data, as a node sets them."""
    volume = tmp_path / "volume"
    volume.mkdir()
    table = {"/shared/ckpt": {"path": str(volume), "read_only": False, "source": "volume ckpt"},
             "/data": {"path": str(tmp_path / "cache"), "read_only": True,
                       "source": "s3://bucket/prefix"}}
    monkeypatch.setenv("FLOW_MOUNTS", json.dumps(table))
    for rank in ("RANK", envvars.NODE_RANK):  # rank 0, the one that writes
        monkeypatch.delenv(rank, raising=False)
    return volume


def test_save_latest_load_round_trip_on_a_mapped_volume(mounts: Path) -> None:
    assert latest_checkpoint("/shared/ckpt/run") is None
    assert load_checkpoint("/shared/ckpt/run") is None
    for step in (0, 1, 10):
        saved = save_checkpoint({"step": step, "w": torch.full((3,), float(step))},
                                "/shared/ckpt/run", step=step)
        assert saved == mounts / "run" / f"ckpt-{step:08d}.pt"
    # A temporary file of an interrupted save is never taken for a checkpoint.
    (mounts / "run" / ".ckpt-00000011.pt.123.abcd.tmp").write_bytes(b"half")
    latest = latest_checkpoint("/shared/ckpt/run")
    assert latest == mounts / "run" / "ckpt-00000010.pt" and checkpoint_step(latest) == 10
    state = load_checkpoint("/shared/ckpt/run")
    assert state["step"] == 10 and torch.equal(state["w"], torch.full((3,), 10.0))
    assert load_checkpoint(mounts / "run" / "ckpt-00000001.pt")["step"] == 1
    with pytest.raises(FileNotFoundError):
        load_checkpoint("/shared/ckpt/run/ckpt-00000005.pt")


def test_keep_prunes_the_oldest(mounts: Path) -> None:
    for step in range(5):
        save_checkpoint({"step": step}, "/shared/ckpt/k", step=step, keep=2)
    assert [checkpoint_step(p) for p in list_checkpoints("/shared/ckpt/k")] == [3, 4]


def test_only_rank_0_writes_without_a_process_group(mounts: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    path = save_checkpoint({"x": 1}, "/shared/ckpt/r", step=0)
    assert path == mounts / "r" / "ckpt-00000000.pt" and not path.exists()


def test_bad_steps_and_read_only_mounts_are_refused(mounts: Path) -> None:
    for step in (-1, 1.5, True):
        with pytest.raises(ValueError, match="non-negative int"):
            save_checkpoint({}, "/shared/ckpt/b", step=step)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep must be at least 1"):
        save_checkpoint({}, "/shared/ckpt/b", step=0, keep=0)
    with pytest.raises(ReadOnlyMountError) as info:
        save_checkpoint({}, "/data/ckpt", step=0)
    assert info.value.errno == errno.EROFS and isinstance(info.value, OSError)
    assert "/data is a read-only mount of s3://bucket/prefix" in str(info.value)
    assert not (mounts.parent / "cache").exists()


def test_current_path_maps_mount_paths_and_nothing_else(mounts: Path) -> None:
    assert current.path("/shared/ckpt") == str(mounts)
    assert current.path("/shared/ckpt/a/b.txt") == str(mounts / "a" / "b.txt")
    assert current.path(Path("/shared/ckpt/x")) == mounts / "x"
    assert current.path("/shared/ckpt-other") == "/shared/ckpt-other"  # a sibling, not under it
    assert current.path("relative/x") == "relative/x"
    assert current.path("/data/f", write=False).endswith("cache/f")
    assert current.mounts == {"/shared/ckpt": str(mounts),
                              "/data": str(mounts.parent / "cache")}


def test_current_path_outside_a_task_is_the_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOW_MOUNTS", raising=False)
    assert current.path("/shared/ckpt/x", write=True) == "/shared/ckpt/x"
    assert current.mounts == {}
