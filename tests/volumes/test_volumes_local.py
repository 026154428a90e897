"""Volumes and S3 mounts on real local nodes: what node 1 writes node 0 reads, the next task
sees it, block volumes hold one node, S3 mounts are read-only and downloaded once per task."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from volumes_helpers import flow_processes, wait_for

from flow_sdk import FlowApp, TaskStatus
from flow_sdk.volumes import (
    Volume,
    VolumeError,
    VolumeInUseError,
    create_volume,
    delete_volume,
    list_volumes,
)

app = FlowApp("volumes-local")
CKPT = {"name": "ckpt", "size_gb": 500, "interface": "file"}


@app.function(num_instances=2, volumes={"/shared/ckpt": CKPT})
def node_1_writes_node_0_reads(literal: bool) -> dict[str, Any]:
    import os
    import time

    from flow_sdk import current

    wanted = "/shared/ckpt/from-node-1.txt"
    path = wanted if literal else current.path(wanted)
    if current.node_index == 1:
        with open(path + ".tmp", "w") as fh:
            fh.write(f"written by node {current.node_index} of {current.task_id}")
        os.replace(path + ".tmp", path)
        return {"node": 1, "path": path}
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"node 1 never wrote {path}")
        time.sleep(0.05)
    with open(path) as fh:
        text = fh.read()
    return {"node": 0, "path": path, "read": text, "mounts": current.mounts,
            "literal_visible": os.path.isdir("/shared/ckpt")}


@app.function(volumes={"/shared/ckpt": "ckpt"})
def second_task_reads() -> str:
    from flow_sdk import current
    with open(current.path("/shared/ckpt/from-node-1.txt")) as fh:
        return fh.read()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "mapped"])
def test_node_1_writes_node_0_reads_and_the_next_task_sees_it(
        flow_home: Path, monkeypatch: pytest.MonkeyPatch, literal_paths: bool, mode: str) -> None:
    monkeypatch.setenv("FLOW_VOLUME_MODE", mode)
    literal = mode == "auto" and literal_paths
    shared_existed = os.path.exists("/shared")
    task = node_1_writes_node_0_reads.spawn(literal)
    node0, node1 = task.results(timeout=120)
    volume_dir = Volume("ckpt").local_path
    assert node0["read"] == f"written by node 1 of {task.task_id}"
    assert (volume_dir / "from-node-1.txt").read_text() == node0["read"]
    if literal:  # the literal path on both nodes, in their private mount namespaces
        assert node0["path"] == node1["path"] == "/shared/ckpt/from-node-1.txt"
        assert node0["mounts"] == {"/shared/ckpt": "/shared/ckpt"}
        assert node0["literal_visible"] is True
        assert any("literal in this node's private mount namespace" in line
                   for line in task.logs(source="agent"))
    else:  # the mapped path is what current.path / FLOW_MOUNTS report
        assert node0["mounts"] == {"/shared/ckpt": str(volume_dir)}
        assert node0["path"] == node1["path"] == str(volume_dir / "from-node-1.txt")
        assert any("mount paths are mapped" in line for line in task.logs(source="agent"))
    assert os.path.exists("/shared") == shared_existed  # the host's root was never touched

    assert second_task_reads.remote() == node0["read"]  # named volumes outlive tasks
    [info] = list_volumes()
    assert (info.name, info.interface, info.size_gb, info.in_use_by) == ("ckpt", "file", 500, ())
    assert info.location == str(volume_dir)
    assert flow_processes(flow_home) == []


@app.function(volumes={"/scratch": {"name": "scratch", "interface": "block", "size_gb": 5}})
def hold_block_volume() -> str:
    import os
    import time

    from flow_sdk import current
    release = current.path("/scratch/release")
    deadline = time.monotonic() + 90
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.05)
    return "released"


@pytest.mark.slow
def test_block_volume_attaches_to_one_node_at_a_time(flow_home: Path) -> None:
    first = hold_block_volume.spawn()
    wait_for(lambda: any("volume 'scratch' (block)" in line
                         for line in first.logs(source="agent")), 60, "the block volume")
    second = hold_block_volume.spawn()
    assert second.wait(timeout=60) is TaskStatus.FAILED
    outcome = second.outcome()
    assert outcome is not None
    assert f"block volume 'scratch' is attached to a node of task {first.task_id}" in \
        outcome.message
    info = Volume("scratch", 5, "block").info()
    assert info is not None and info.in_use_by == (first.task_id,)
    with pytest.raises(VolumeInUseError, match=first.task_id):
        delete_volume("scratch")
    (Volume("scratch").local_path / "release").write_text("go")
    assert first.result(timeout=60) == "released"
    wait_for(lambda: not flow_processes(flow_home), 10, "every process to exit")
    assert delete_volume("scratch") is True
    assert not Volume("scratch").local_path.parent.exists()


@app.function(num_instances=2, mounts={"/data": "s3://flow-volumes-test/mixed"})
def read_the_mount(literal: bool) -> dict[str, Any]:
    import hashlib
    import os

    from flow_sdk import current
    root = "/data" if literal else current.path("/data")
    with open(os.path.join(root, "big/multipart.bin"), "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    files = sorted(os.path.relpath(os.path.join(d, n), root)
                   for d, _, names in os.walk(root) for n in names)
    raw_write = None
    if literal or os.geteuid() != 0:  # root ignores mode bits: see flow_sdk.volumes
        try:
            with open(os.path.join(root, "new.txt"), "w") as fh:
                fh.write("x")
        except OSError as exc:
            raw_write = f"{type(exc).__name__}: {exc}"
    try:
        current.path("/data/new.txt", write=True)
        checked = None
    except OSError as exc:
        checked = f"{type(exc).__name__}: {exc}"
    return {"digest": digest, "files": files, "raw_write": raw_write, "checked": checked}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "mapped"])
def test_s3_mount_is_read_only_on_every_node_and_downloaded_once(
        flow_home: Path, monkeypatch: pytest.MonkeyPatch, s3_env: str, s3_data: dict[str, Any],
        literal_paths: bool, mode: str) -> None:
    import hashlib
    monkeypatch.setenv("FLOW_VOLUME_MODE", mode)
    literal = mode == "auto" and literal_paths
    task = read_the_mount.spawn(literal)
    results = task.results(timeout=120)
    for result in results:
        assert result["digest"] == hashlib.sha256(s3_data["big"]).hexdigest()
        assert result["files"] == ["a.txt", "big/multipart.bin", "nested/deeper/b.txt"]
        assert result["checked"] == (
            "ReadOnlyMountError: [Errno 30] /data is a read-only mount of "
            "s3://flow-volumes-test/mixed; S3 mounts cannot be written: write to a volume "
            "(volumes={...}) instead: '/data/new.txt'")
        if literal:  # the kernel refuses the write, whoever asks
            assert result["raw_write"] == \
                "OSError: [Errno 30] Read-only file system: '/data/new.txt'"
        elif os.geteuid() != 0:
            assert result["raw_write"] is not None and "Permission denied" in result["raw_write"]
    mount_lines = [line for line in task.logs(source="agent") if "mount s3://" in line]
    assert len(mount_lines) == 2  # one per node: one downloaded, the other reused its cache
    assert sum("downloaded 3, reused 0" in line for line in mount_lines) == 1
    assert sum("downloaded 0, reused 3" in line for line in mount_lines) == 1
    wait_for(lambda: not (flow_home / "local" / "cache" / "s3" / task.task_id).exists(), 10,
             "the task's S3 cache to be removed")


@app.function(num_instances=2, mounts={"/data": "s3://flow-volumes-test/no-such-prefix"})
def never_runs() -> None:
    raise AssertionError("the mount failed: this must not run")


@pytest.mark.slow
def test_a_failing_mount_fails_the_task_naming_it_and_leaves_nothing(
        flow_home: Path, s3_env: str, s3_data: dict[str, Any]) -> None:
    task = never_runs.spawn()
    assert task.wait(timeout=60) is TaskStatus.FAILED
    outcome = task.outcome()
    assert outcome is not None
    assert "s3://flow-volumes-test/no-such-prefix/ holds no objects" in outcome.message
    wait_for(lambda: not flow_processes(flow_home), 10, "every process to exit")


def test_volume_api_create_list_delete(flow_home: Path) -> None:
    ckpt = Volume("ckpt", size_gb=50)
    assert not ckpt.exists() and Volume.list() == []
    created = ckpt.create()
    assert (created.name, created.interface, created.size_gb) == ("ckpt", "file", 50)
    assert ckpt.local_path.is_dir() and created.location == str(ckpt.local_path)
    assert create_volume("ckpt", 50) == created  # idempotent
    with pytest.raises(VolumeError, match="exists as a file volume, not interface='block'"):
        create_volume("ckpt", 50, "block")
    create_volume("blk", 10, "block")
    assert [(v.name, v.interface) for v in list_volumes()] == [("blk", "block"), ("ckpt", "file")]
    (ckpt.local_path / "kept.txt").write_text("data")
    assert ckpt.delete() is True
    assert not ckpt.exists() and not ckpt.local_path.exists()
    assert delete_volume("ckpt") is False
    assert [v.name for v in Volume.list()] == ["blk"]
