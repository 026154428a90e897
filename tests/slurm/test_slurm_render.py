"""The Slurm provider's pure parts: what Slurm's commands print, parsed (recorded output), the
batch script and launch file it renders, and its configuration, checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flow_sdk.errors import ProviderError
from flow_sdk.providers.base import LaunchRequest
from flow_sdk.providers.launch import ShippedWheel, node_launch
from flow_sdk.providers.slurm import SlurmProvider, SlurmSettings
from flow_sdk.providers.slurm._batch import (
    LOW_PRIORITY_NICE,
    JobOptions,
    instance_id,
    render_batch_script,
    render_launch_file,
    time_limit_minutes,
    warn_before_s,
)
from flow_sdk.providers.slurm._commands import (
    SlurmCommandError,
    job_from_scontrol,
    minutes,
    parse_fields,
    parse_records,
    parse_sbatch,
    parse_squeue,
    waiting,
)
from flow_sdk.spec import build_task_spec
from flow_sdk.wire import BootConfig, envvars

# recorded from Slurm 22.05 (`scontrol -o show ...`, `squeue -h -o '%i|%T|%N|%r'`)
PARTITION = ("PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL "
             "AllocNodes=ALL Default=YES QoS=N/A DefaultTime=NONE DisableRootJobs=NO "
             "ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime=01:00:00 "
             "MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=n[1-3] PriorityJobFactor=1 "
             "State=UP TotalCPUs=6 TotalNodes=3")
JOB_DONE = ("JobId=7 JobName=flow-train-1 UserId=root(0) GroupId=root(0) Priority=1 "
            "JobState=COMPLETED Reason=None Dependency=(null) NodeList=n[1-2] "
            "Comment=flow-task:train-1")
JOB_PENDING = ("JobId=8 JobName=flow-x JobState=PENDING Reason=Resources Dependency=(null) "
               "NodeList=(null)")
NODE = ("NodeName=n2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 NodeAddr=127.60.0.2 "
        "NodeHostName=vm State=IDLE Reason=Not responding [slurm@2026-12-02T11:17:52]")


def test_scontrol_lines_parse_into_their_fields() -> None:
    assert parse_fields(PARTITION)["MaxTime"] == "01:00:00"
    assert parse_fields(PARTITION)["DefaultTime"] == "NONE"
    node = parse_fields(NODE)
    assert node["NodeAddr"] == "127.60.0.2"
    assert node["Reason"] == "Not responding [slurm@2026-12-02T11:17:52]"
    assert [r["JobId"] for r in parse_records(f"{JOB_DONE}\n\n{JOB_PENDING}\n")] == ["7", "8"]


def test_a_job_after_it_left_squeue_and_a_pending_one() -> None:
    done = job_from_scontrol(parse_fields(JOB_DONE))
    assert (done.job_id, done.state, done.nodes, done.active) == ("7", "COMPLETED", "n[1-2]",
                                                                  False)
    pending = job_from_scontrol(parse_fields(JOB_PENDING))
    assert pending.nodes == "" and pending.reason == "Resources" and pending.active


def test_squeue_lines_by_job_and_junk_refused() -> None:
    jobs = parse_squeue("12|RUNNING|n[1-2]|None\n13|PENDING||Priority\n")
    assert jobs["12"].running and jobs["12"].nodes == "n[1-2]"
    assert not jobs["13"].running and jobs["13"].reason == "Priority"
    with pytest.raises(SlurmCommandError, match="not '%i|%T|%N|%r' fields"):
        parse_squeue("12 RUNNING n1\n")


def test_sbatch_answers_and_time_limits() -> None:
    assert parse_sbatch("41\n") == "41" and parse_sbatch("41;cluster\n") == "41"
    with pytest.raises(SlurmCommandError, match="not a job id"):
        parse_sbatch("sbatch: error: Batch job submission failed\n")
    assert minutes("UNLIMITED") is None and minutes("NONE") is None
    assert minutes("30") == 30 and minutes("01:00:00") == 60 and minutes("10:30") == 11
    assert minutes("1-00:00:00") == 1440 and minutes("2-12") == 3600
    with pytest.raises(SlurmCommandError, match="not a Slurm time limit"):
        minutes("soon")


def _launch(tmp_path: Path, **options: object):  # type: ignore[no-untyped-def]
    spec = build_task_spec(app="t", name="train", num_instances=2, max_run_time_hours=0.5,
                           provider="slurm", **options)
    boot = BootConfig("train-1", "slurm", {"shared_dir": str(tmp_path)}, secret="ab" * 32)
    wheel = ShippedWheel("code/sdk", "f" * 64, "flow_gang_sdk-0.1-py3-none-any.whl", "3.11")
    return spec, node_launch(LaunchRequest("train-1", spec, boot), (wheel,))


def test_the_batch_script_is_one_job_with_one_agent_step_per_node(tmp_path: Path) -> None:
    spec, launch = _launch(tmp_path)
    script = render_batch_script(
        launch, task_id="train-1", nodes=2, time_minutes=time_limit_minutes(0.5),
        gpus_per_node="h100:8", options=JobOptions(partition="gpu", account="ml",
                                                   extra_sbatch=("--mem=0",)),
        python="/opt/venv/bin/python", boot_script=tmp_path / "boot.py",
        launch_file=tmp_path / "my dir" / "launch.json", output=tmp_path / "slurm-%j.out")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for option in ("--job-name=flow-train-1", "--comment=flow-task:train-1", "--nodes=2",
                   "--time=32", "--no-requeue", "--gpus-per-node=h100:8",
                   "--partition=gpu", "--account=ml", "--mem=0"):
        assert f"#SBATCH {option}" in lines, option
    assert not any("--qos" in line or "--constraint" in line for line in lines)
    assert lines[-1] == (f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 "
                         f"/opt/venv/bin/python -I -S {tmp_path}/boot.py "
                         f"'{tmp_path}/my dir/launch.json'")
    assert "ab" * 32 not in script  # the secret is in the 0600 boot files only


def _script(tmp_path: Path, options: JobOptions, **extra: object) -> list[str]:
    _, launch = _launch(tmp_path)
    return render_batch_script(
        launch, task_id="train-1", nodes=4, time_minutes=10, gpus_per_node=None,
        options=options, python="/p", boot_script=tmp_path / "b.py",
        launch_file=tmp_path / "l.json", output=tmp_path / "o", **extra).splitlines()


def test_min_instances_lets_slurm_start_the_job_on_fewer_nodes(tmp_path: Path) -> None:
    lines = _script(tmp_path, JobOptions(), min_nodes=2)
    assert "#SBATCH --nodes=2-4" in lines and "#SBATCH --nodes=4" not in lines
    assert "#SBATCH --nodes=4" in _script(tmp_path, JobOptions(), min_nodes=4)
    # the one step runs on every node the job was given, however many that is
    assert "--nodes" not in lines[-1]
    # a task count would make Slurm give the least of the range (ntasks = MIN x 1 per node)
    assert not any(line.startswith("#SBATCH --ntasks") for line in lines)


def test_a_task_is_warned_before_its_time_limit_and_a_pool_is_not(tmp_path: Path) -> None:
    assert "#SBATCH --signal=USR1@300" in _script(tmp_path, JobOptions(), warn_before_s=300)
    assert not any("--signal" in line for line in _script(tmp_path, JobOptions()))
    assert [warn_before_s(m) for m in (3, 10, 11, 600)] == [90, 300, 300, 300]  # half, at most


def test_spares_keep_the_job_when_a_node_is_lost(tmp_path: Path) -> None:
    assert "#SBATCH --no-kill" in _script(tmp_path, JobOptions(), spares=1)
    assert "#SBATCH --no-kill" not in _script(tmp_path, JobOptions())


def test_priority_is_the_qos_the_site_maps_it_to_else_a_nice_for_low(tmp_path: Path) -> None:
    mapped = JobOptions(qos="normal", priority_qos={"high": "urgent", "low": "scavenger"})
    high = _script(tmp_path, mapped, priority="high")
    assert "#SBATCH --qos=urgent" in high and "#SBATCH --qos=normal" not in high
    assert "#SBATCH --qos=scavenger" in _script(tmp_path, mapped, priority="low")
    med = _script(tmp_path, mapped, priority="med")
    assert "#SBATCH --qos=normal" in med and not any("--nice" in line for line in med)
    assert f"#SBATCH --nice={LOW_PRIORITY_NICE}" in _script(tmp_path, JobOptions(),
                                                             priority="low")
    unmapped_high = _script(tmp_path, JobOptions(), priority="high")
    assert not any("--nice" in line or "--qos" in line for line in unmapped_high)


@pytest.mark.parametrize(("line", "shown"), [
    ("5|PENDING||Resources", "queued by Slurm: Resources (the nodes it needs are busy)"),
    ("5|PENDING||Priority", "queued by Slurm: Priority (jobs of higher priority are ahead of "
                            "it)"),
    ("5|PENDING||None", "queued by Slurm"),
    # limits of a QoS or an account need the accounting database: recorded output
    ("5|PENDING||QOSMaxJobsPerUserLimit", "queued by Slurm: QOSMaxJobsPerUserLimit (a limit "
                                          "of its QoS or account holds it)"),
    ("5|PENDING||AssocGrpGRES", "queued by Slurm: AssocGrpGRES (a limit of its QoS or account "
                                "holds it)"),
    ("5|PENDING||SomethingNew", "queued by Slurm: SomethingNew"),
    ("5|CONFIGURING|n[1-2]|None", "Slurm is starting its nodes (CONFIGURING)"),
])
def test_a_pending_job_says_why_it_waits(line: str, shown: str) -> None:
    assert waiting(parse_squeue(line)["5"]) == shown


def test_the_launch_file_names_what_each_node_needs_and_no_secret(tmp_path: Path) -> None:
    _, launch = _launch(tmp_path)
    text = render_launch_file(launch, task_id="train-1", wheels=[{"path": "/s/w", "sha256":
                                                                   "f" * 64, "filename": "w"}],
                              envs=tmp_path / "envs", boot_files=tmp_path / "boot",
                              nodes_dir=tmp_path / "nodes",
                              boot_log=str(tmp_path / "logs" / "boot.{instance}.log"))
    data = json.loads(text)
    assert data["python"] == "3.11" and data["module"] == "flow_sdk.node.agent"
    assert data["names"] == {"boot_file": envvars.BOOT_FILE, "instance_id": envvars.INSTANCE_ID,
                             "address": envvars.NODE_ADDRESS, "cores": envvars.NODE_CORES}
    assert data["instance_id"].format(job="12", node=1) == instance_id("12", 1) == "sl12-0001"
    assert "ab" * 32 not in text


def test_settings_are_checked_and_round_trip(tmp_path: Path) -> None:
    config = {"shared_dir": str(tmp_path), "python": "/usr/bin/python3", "partition": "gpu",
              "qos": "high", "extra_sbatch": ["--mem=0"], "gpu_types": {"h100": "nvidia_h100"},
              "priority_qos": {"low": "scavenger"}, "usd_per_node_hour": 2.5}
    settings = SlurmSettings.parse(config)
    assert settings.to_config() == config
    assert SlurmSettings.parse(settings.to_config()) == settings
    for bad, named in (({"partitions": "a"}, "unknown key"), ({"partition": "a b"}, "one word"),
                       ({"extra_sbatch": ["--mem=0\n#SBATCH --x"]}, "extra_sbatch"),
                       ({"extra_sbatch": "--mem=0"}, "extra_sbatch"),
                       ({"python": "python3"}, "absolute path"),
                       ({"gpu_types": {"h100": ""}}, "gpu_types"),
                       ({"priority_qos": {"urgent": "x"}}, "priority_qos"),
                       ({"priority_qos": {"high": "a b"}}, "priority_qos"),
                       ({"usd_per_node_hour": "2"}, "usd_per_node_hour"),
                       ({"usd_per_node_hour": -1}, "usd_per_node_hour")):
        with pytest.raises(ProviderError, match=named):
            SlurmSettings.parse(bad)


def test_gpus_per_node_take_the_sites_gres_type(tmp_path: Path) -> None:
    provider = SlurmProvider(SlurmSettings.parse({"shared_dir": str(tmp_path),
                                                  "gpu_types": {"h100": "nvidia_h100"}}))
    spec = build_task_spec(app="t", name="t", provider="slurm", gpu="h100:8",
                           max_run_time_hours=1)
    assert provider.gpus_per_node(spec) == "nvidia_h100:8"
    spec = build_task_spec(app="t", name="t", provider="slurm", gpu="a100:2",
                           max_run_time_hours=1)
    assert provider.gpus_per_node(spec) == "a100:2"
