"""The agent's volume step in this process, in mapped mode (the namespace mode would move this
test process into a private root; real nodes cover it in test_volumes_local.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flow_sdk.providers.local import LocalProvider
from flow_sdk.spec import build_task_spec
from flow_sdk.node.volumes.prepare import prepare_volumes
from flow_sdk.volumes import VolumeError, create_volume
from flow_sdk.node.volumes.prepare import _covered_node_paths


def test_mapped_env_for_local_volumes_and_a_second_call_reuses_it(
        flow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOW_VOLUME_MODE", "mapped")
    spec = build_task_spec(app="a", name="b", volumes={"/shared/ckpt": "ckpt",
                                                       "/scratch": {"name": "s", "interface": "block"}})
    lines: list[str] = []
    env = prepare_volumes(spec, LocalProvider(), tmp_path, "task-1", lines.append)
    table = json.loads(env["FLOW_MOUNTS"])
    root = flow_home / "local" / "volumes"
    assert table == {
        "/shared/ckpt": {"path": str(root / "ckpt" / "data"), "read_only": False,
                         "source": "volume ckpt (file)"},
        "/scratch": {"path": str(root / "s" / "data"), "read_only": False,
                     "source": "volume s (block)"}}
    assert any("created" in line for line in lines) and any("mapped" in line for line in lines)
    assert prepare_volumes(spec, LocalProvider(), tmp_path, "task-1", lines.append) == env
    assert prepare_volumes(build_task_spec(app="a", name="b"), LocalProvider(), tmp_path,
                           "task-2", lines.append) == {}


def test_bad_mode_and_interface_mismatch_are_volume_errors(
        flow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = build_task_spec(app="a", name="b", volumes={"/shared/ckpt": "ckpt"})
    monkeypatch.setenv("FLOW_VOLUME_MODE", "bind")
    with pytest.raises(VolumeError, match="FLOW_VOLUME_MODE='bind' is not one of"):
        prepare_volumes(spec, LocalProvider(), tmp_path, "task-3", print)
    monkeypatch.setenv("FLOW_VOLUME_MODE", "mapped")
    create_volume("ckpt", interface="block")
    with pytest.raises(VolumeError, match="exists as a block volume, not interface='file'"):
        prepare_volumes(spec, LocalProvider(), tmp_path, "task-4", print)


def test_a_mount_over_what_the_node_runs_from_is_never_literal(tmp_path: Path) -> None:
    workdir = tmp_path / "node"
    assert _covered_node_paths(["/shared/ckpt"], workdir) == []
    assert _covered_node_paths([str(tmp_path)], workdir) == [(str(tmp_path), str(workdir))]


def test_caches_of_ended_tasks_are_collected(flow_home: Path) -> None:
    import fcntl

    from flow_sdk import lifecycle, wire
    from flow_sdk.home import tasksecrets
    from flow_sdk.node.volumes.prepare import gc_mount_caches
    from flow_sdk.node.volumes.s3mount import set_writable
    from flow_sdk.wire import Outcome, signing

    provider = LocalProvider()
    root = flow_home / "local" / "cache" / "s3"
    tasks = ("ended", "running", "ended-but-held", "forged", "elsewhere")
    for task in tasks:
        files = root / task / "0123" / "files" / "sub"
        files.mkdir(parents=True)
        (files / "f").write_text("x")
        set_writable(root / task / "0123" / "files", False)  # as a finished mount leaves it
        tasksecrets.save_task_secret(task, signing.new_secret())
    for task in ("ended", "ended-but-held", "elsewhere"):
        store = signing.SignedStore(provider.store, tasksecrets.load_task_secret(task))
        lifecycle.record_outcome(store, task, Outcome("SUCCEEDED", "done", 0.0))
    provider.store.put(wire.outcome_key("forged"), b"{}")  # junk, from a store writer
    tasksecrets.remove_task_secret("elsewhere")  # ended, but this machine cannot check it
    with open(root / ".ended-but-held.users", "a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_SH)  # a node of that task still uses its cache
        assert gc_mount_caches(provider) == 1
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "elsewhere", "ended-but-held", "forged", "running"]
    assert gc_mount_caches(provider) == 1  # the holder is gone now
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "elsewhere", "forged", "running"]
