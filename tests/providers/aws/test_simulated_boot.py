"""The simulated cloud boots every node through the real bootstrap (the rendered user-data, run
by bash as root in the instance's own mount namespace): the caller's SDK wheel fetched from the
store and checked by digest, installed offline, volumes mounted through the shims, the runtime
cap's power-off timer, and the boot log shipped whatever happens."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aws_moto_world import BUCKET, AwsWorld, live_pids
from flow_testing import results_or_cancel, wait_until

from flow_sdk import FlowApp, TaskFailedError, TaskStatus, ValidationError
from flow_sdk.providers import sdkwheel
from flow_sdk.errors import ProviderError
from flow_sdk.sim import AwsSimProvider
from flow_sdk.wire import envvars

pytestmark = pytest.mark.slow

# Each poll of a wait here asks the moto server (which runs in this process) or reads /proc:
# at wait_until's default 20 per second, the polling alone costs seconds of CPU a test.
POLL_S = 0.5


def package_digest() -> str:
    """SHA-256 over the files of the flow_sdk package this process imports."""
    h = hashlib.sha256()
    for name, data in sdkwheel.package_files(sdkwheel.package_dir()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _whoami(n: int) -> dict[str, Any]:
    import hashlib
    import os

    import flow_sdk
    from flow_sdk.providers import sdkwheel

    h = hashlib.sha256()
    for name, data in sdkwheel.package_files(sdkwheel.package_dir()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    rank = int(os.environ["RANK"])
    return {"sdk": flow_sdk.__file__, "digest": h.hexdigest(), "rank": rank,
            "world": int(os.environ["WORLD_SIZE"]), "value": sum(i * i for i in range(n)) + rank}


def _mounts_under(root: Path) -> list[str]:
    """Mount points on this machine (the host's namespace) under ``root``."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in lines if line.split()[4].startswith(str(root))]


def _no_leftovers(aws: AwsWorld, provider: AwsSimProvider, task_id: str) -> None:
    assert aws.non_terminated() == []
    assert live_pids(provider, task_id) == []
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit()
                and _tagged(p, task_id)]
    assert _mounts_under(aws.sim_root) == []


def _tagged(proc: Path, task_id: str) -> bool:
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return any(item.startswith(f"{envvars.SIM_INSTANCE}={task_id}/".encode()) for item in environ)


def _sim(aws: AwsWorld, **settings: Any) -> FlowApp:
    return FlowApp("boot", provider="aws-sim", provider_config=aws.sim_config(**settings))


def test_two_nodes_boot_the_callers_sdk_by_digest_even_60s_apart_and_match_local(
        aws: AwsWorld) -> None:
    # the second instance boots 60 s late (a slow image pull): the availability clock starts
    # at the first agent up, so it still joins
    fn = _sim(aws, boot_delay_s=[0, 60]).function(num_instances=2, priority="high")(_whoami)
    local = FlowApp("boot-local", provider="local").function(num_instances=2)(_whoami)
    started = time.monotonic()
    task = fn.spawn(1000)
    local_task = local.spawn(1000)  # runs while the late node waits
    try:
        results = results_or_cancel(task, 300)
    finally:
        local_results = results_or_cancel(local_task, 120)
    assert task.status is TaskStatus.SUCCEEDED
    assert time.monotonic() - started >= 60
    mine = package_digest()
    for r in results:  # each node imports the SDK the bootstrap installed from the wheel
        assert r["sdk"].startswith("/opt/flow/venv/"), r["sdk"]
        assert r["digest"] == mine
    # the wheel the nodes fetched is the one the launch stored, by content digest
    wheel = sdkwheel.build()
    listed = aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="flow/code/")
    assert [o["Key"] for o in listed["Contents"]] == [f"flow/code/{wheel.sha256}.whl"]
    boot = "\n".join(task.logs(source="boot"))
    assert "[Node 0]" in boot and "[Node 1]" in boot and "agent started" in boot
    # the late node boots from the SDK environment already built for this wheel's digest
    assert any(line.startswith("[Node 1]") and "environment for this wheel is already on this "
               "machine" in line for line in task.logs(source="boot"))

    def shape(rows: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
        return [(r["rank"], r["world"], r["value"]) for r in rows]

    assert shape(results) == shape(local_results)
    provider = task.provider
    assert isinstance(provider, AwsSimProvider)
    _no_leftovers(aws, provider, task.task_id)


def test_a_tampered_sdk_wheel_is_refused_by_the_node(aws: AwsWorld) -> None:
    fn = _sim(aws, boot_delay_s=[4]).function(num_instances=1, priority="high")(_whoami)
    task = fn.spawn(10)
    wheel = sdkwheel.build()
    key = f"flow/code/{wheel.sha256}.whl"
    aws.client("s3").put_object(Bucket=BUCKET, Key=key, Body=wheel.data + b"tampered")
    with pytest.raises(TaskFailedError) as failed:
        task.result(timeout=180)
    message = str(failed.value)
    assert wheel.sha256 in message and "altered" in message
    assert "nothing was installed" in message  # the boot log's last lines are in the error
    assert "nothing was installed" in "\n".join(task.logs(source="boot"))
    provider = task.provider
    assert isinstance(provider, AwsSimProvider)
    _no_leftovers(aws, provider, task.task_id)


def test_a_node_whose_boot_fails_before_the_agent_leaves_its_output(aws: AwsWorld) -> None:
    fn = _sim(aws, boot_delay_s=[4]).function(num_instances=1, priority="high")(_whoami)
    task = fn.spawn(10)
    wheel = sdkwheel.build()
    aws.client("s3").delete_object(Bucket=BUCKET, Key=f"flow/code/{wheel.sha256}.whl")
    with pytest.raises(TaskFailedError) as failed:
        task.result(timeout=180)
    message = str(failed.value)
    assert "died in boot" in message or "boot" in message
    assert "404" in message or "Not Found" in message or "does not exist" in message
    assert "finished with exit code" in "\n".join(task.logs(source="boot"))
    provider = task.provider
    assert isinstance(provider, AwsSimProvider)
    _no_leftovers(aws, provider, task.task_id)


def test_an_image_python_of_another_version_is_refused_before_launch(
        aws: AwsWorld, tmp_path: Path) -> None:
    other = tmp_path / "python3"
    other.write_text("#!/bin/sh\necho 3.99\n")
    other.chmod(0o755)
    aws_cli = shutil.which("aws", path=str(Path(sys.executable).parent))
    assert aws_cli is not None
    (tmp_path / "aws").symlink_to(aws_cli)  # the image has the AWS CLI, but another Python
    app = _sim(aws, python=str(other))
    whoami = app.function(num_instances=2, priority="high", quiet=True)(_whoami)
    with pytest.raises(ValidationError, match=r"Python 3\.99.*Python 3\.\d+"):
        whoami.spawn()
    assert aws.instances() == []


_CALLER = """
import json, sys, time
from flow_sdk import FlowApp

def sleeper() -> None:
    time.sleep(3600)

config = json.loads(sys.argv[1])
fn = FlowApp("capped", provider="aws-sim", provider_config=config).function(
    num_instances=1, priority="high", max_run_time_hours=1)(sleeper)
task = fn.spawn()
print(task.task_id, flush=True)
"""


def test_the_runtime_cap_timer_terminates_the_instance_with_the_caller_gone(
        aws: AwsWorld, tmp_path: Path) -> None:
    # 1 h cap + 10 min grace = a 70-minute power-off timer; 0.15 s minutes make it 10.5 s
    config = aws.sim_config(minute_s=0.15)
    script = tmp_path / "caller.py"
    script.write_text(_CALLER)
    caller = subprocess.run([sys.executable, str(script), json.dumps(config)],
                            capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert caller.returncode == 0, caller.stderr
    task_id = caller.stdout.split()[-1]  # the caller has exited: nobody will cancel the task
    wait_until(lambda: aws.non_terminated() == [] and aws.instances() != [], 150,
               "the node's power-off timer to terminate its instance", POLL_S)
    instance_log = next((aws.sim_root / "nodes" / task_id).glob("i-*/instance.log"), None)
    if instance_log is not None:  # still on disk until the provider tidies the task
        assert "terminated through EC2 (the node powered off)" in instance_log.read_text()
    wait_until(lambda: not [p for p in Path("/proc").iterdir()
                            if p.name.isdigit() and _tagged(p, task_id)], 30,
               "every process of the instance to stop", POLL_S)
    assert _mounts_under(aws.sim_root) == []


def _share(path: str) -> dict[str, Any]:
    import os
    import time
    from pathlib import Path

    rank = int(os.environ["RANK"])
    shared = Path("/shared/ckpt")
    (shared / f"from-{rank}").write_text(f"node {rank}")
    deadline = time.monotonic() + 60
    while len(list(shared.glob("from-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    data = Path(path).read_text()
    try:
        (Path(path).parent / "mine").write_text("no")
        refused = ""
    except OSError as exc:
        refused = type(exc).__name__
    return {"seen": sorted(p.name for p in shared.glob("from-*")), "data": data,
            "refused": refused}


def test_an_efs_volume_is_shared_by_two_nodes_and_an_s3_mount_is_read_only(
        aws: AwsWorld) -> None:
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="datasets")
    s3.put_object(Bucket="datasets", Key="train/part-0.txt", Body=b"rows")
    fn = _sim(aws).function(
        num_instances=2, priority="high",
        volumes={"/shared/ckpt": {"name": "ckpt", "size_gb": 5, "interface": "file"}},
        mounts={"/data/train": "s3://datasets/train"})(_share)
    task = fn.spawn("/data/train/part-0.txt")
    results = results_or_cancel(task, 240)
    assert task.status is TaskStatus.SUCCEEDED, task.logs()
    for r in results:
        assert r["seen"] == ["from-0", "from-1"]
        assert r["data"] == "rows"
        assert r["refused"] in ("OSError", "PermissionError")
    [fs] = aws.client("efs").describe_file_systems(CreationToken="ckpt")["FileSystems"]
    shared = aws.sim_root / "efs" / fs["FileSystemId"]
    assert sorted(p.name for p in shared.iterdir()) == ["from-0", "from-1"]
    provider = task.provider
    assert isinstance(provider, AwsSimProvider)
    _no_leftovers(aws, provider, task.task_id)


def _keep(text: str) -> dict[str, Any]:
    from pathlib import Path

    scratch = Path("/scratch")
    before = (scratch / "note").read_text() if (scratch / "note").exists() else ""
    (scratch / "note").write_text(before + text)
    return {"before": before, "mount": scratch.is_mount()}


def test_an_ebs_volume_is_formatted_once_and_keeps_its_data(aws: AwsWorld) -> None:
    volume = {"/scratch": {"name": "scratch", "size_gb": 1, "interface": "block"}}
    fn = _sim(aws).function(num_instances=1, priority="high", volumes=volume, quiet=True)(_keep)
    assert fn.remote("first ") == {"before": "", "mount": True}
    [made] = aws.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:flow:volume", "Values": ["scratch"]}])["Volumes"]
    tags = {t["Key"]: t["Value"] for t in made["Tags"]}
    assert tags["flow:formatted"] == "true"  # the node formatted it, then said so
    assert fn.remote("second") == {"before": "first ", "mount": True}  # not formatted again
    assert _mounts_under(aws.sim_root) == []
    wait_until(lambda: str(aws.sim_root) not in _loops(), 15,
               "the volume's loop device to be detached", POLL_S)


def _loops() -> str:
    return subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout


def test_a_blank_ebs_volume_flow_did_not_create_is_never_formatted(aws: AwsWorld) -> None:
    ec2 = aws.client("ec2")
    zone = ec2.describe_availability_zones()["AvailabilityZones"][0]["ZoneName"]
    ec2.create_volume(AvailabilityZone=zone, Size=1, TagSpecifications=[
        {"ResourceType": "volume", "Tags": [{"Key": "flow:volume", "Value": "theirs"}]}])
    volume = {"/scratch": {"name": "theirs", "size_gb": 1, "interface": "block"}}
    fn = _sim(aws).function(num_instances=1, priority="high", volumes=volume, quiet=True)(_keep)
    with pytest.raises(TaskFailedError, match="was not formatted"):
        fn.remote("x")
    assert aws.non_terminated() == []


@pytest.mark.parametrize(("settings", "named"), [
    ({"minute_s": 0}, "minute_s"), ({"minute_s": True}, "minute_s"),
    ({"boot_delay_s": [0, -1]}, "boot_delay_s"), ({"boot_delay_s": "60"}, "boot_delay_s"),
    ({"wheelhouse": ""}, "wheelhouse"), ({"python": "python3"}, "provider_config.python"),
    ({"speed": 2}, "unknown key(s) ['speed']"),
])
def test_bad_simulate_settings_name_the_setting(aws: AwsWorld, settings: dict[str, Any],
                                                named: str) -> None:
    with pytest.raises(ProviderError, match=re.escape(named)):
        aws.sim_provider(**settings)
    assert aws.instances() == []
