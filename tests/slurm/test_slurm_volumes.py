"""Volumes and S3 mounts on the test runner's real Slurm cluster: a file volume is a folder on
the shared filesystem that every node of the job sees at the task's path (and the next task
too), an S3 mount is read on every node, and a block volume is refused before anything is
submitted."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from flow_sdk import FlowApp, current
from flow_sdk.errors import ValidationError
from flow_testing import fake_aws_environment, moto_server
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow
TIMEOUT_S = 120


def write_then_list(name: str) -> tuple[str, list[str]]:
    folder = current.path("/ckpt", write=True)
    with open(os.path.join(folder, f"{name}-rank{current.rank}"), "w") as fh:
        fh.write(os.environ["SLURMD_NODENAME"])
    return os.environ["SLURMD_NODENAME"], sorted(os.listdir(folder))


def test_a_file_volume_is_one_folder_every_node_and_the_next_task_see(
        app: FlowApp, tmp_path: Path) -> None:
    function = app.function(num_instances=2, max_run_time_hours=0.1,
                            volumes={"/ckpt": "ckpt"})(write_then_list)
    first = function.spawn("first").results(timeout=TIMEOUT_S)
    assert len({node for node, _ in first}) == 2  # two Slurm nodes
    data = tmp_path / "shared" / "volumes" / "ckpt" / "data"
    assert sorted(p.name for p in data.iterdir()) == ["first-rank0", "first-rank1"]
    second = function.spawn("second").results(timeout=TIMEOUT_S)
    for rank, (_, seen) in enumerate(second):  # what the first task left, and its own file
        assert {"first-rank0", "first-rank1", f"second-rank{rank}"} <= set(seen)
    assert (data / "first-rank1").read_text() == first[1][0]  # written on node 1


def test_a_block_volume_is_refused_before_submitting(app: FlowApp,
                                                     slurm_clean: SlurmCluster) -> None:
    with pytest.raises(ValidationError, match="slurm provider does not support block"):
        app.function(num_instances=1, max_run_time_hours=0.1,
                     volumes={"/disk": {"name": "disk", "interface": "block",
                                        "size_gb": 10}})(write_then_list).spawn("x")
    assert not slurm_clean.run("squeue", "-h").stdout.strip()


@pytest.fixture
def s3_bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A moto S3 server on loopback holding s3://flow-slurm-data/set/; fake credentials and
    its endpoint in this process's environment, which the job's nodes are given (sbatch
    passes the submitter's environment)."""
    fake_aws_environment(monkeypatch, tmp_path)
    with moto_server() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        client.create_bucket(Bucket="flow-slurm-data")
        client.put_object(Bucket="flow-slurm-data", Key="set/a.txt", Body=b"alpha")
        client.put_object(Bucket="flow-slurm-data", Key="set/deep/b.txt", Body=b"beta")
        yield "s3://flow-slurm-data/set"


def read_the_data() -> dict[str, str]:
    root = current.path("/data")
    return {name: open(os.path.join(root, name)).read() for name in ("a.txt", "deep/b.txt")}


def test_an_s3_mount_is_read_on_every_node(app: FlowApp, s3_bucket: str) -> None:
    function = app.function(num_instances=2, max_run_time_hours=0.1,
                            mounts={"/data": s3_bucket})(read_the_data)
    assert function.spawn().results(timeout=TIMEOUT_S) == [
        {"a.txt": "alpha", "deep/b.txt": "beta"}] * 2
