"""How often the Slurm provider asks the controller, on recorded answers: the states of many
tasks come from one listing of the user's queue (``flow list`` asks once, not once a task),
and a read the controller refuses as busy is asked again after a back-off, never a submit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flow_sdk.providers.host import LOCAL
from flow_sdk.providers.slurm import SlurmProvider, SlurmSettings
from flow_sdk.providers.slurm import _commands
from flow_sdk.errors import ProviderError
from flow_sdk.providers.slurm._commands import Cluster, SlurmCommandError

QUEUE = "11|RUNNING|n[1-2]|None\n12|PENDING||Priority\n"


class _Host:
    """``LocalHost`` whose Slurm commands answer from ``answers`` (argv[0] -> list of
    (exit code, stdout, stderr), the last one repeated), each call recorded."""

    def __init__(self, answers: dict[str, list[tuple[int, str, str]]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(LOCAL, name)

    def run(self, argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        self.calls.append(argv)
        said = self.answers[argv[0]]
        return said.pop(0) if len(said) > 1 else said[0]


def _provider(tmp_path: Path, host: _Host) -> SlurmProvider:
    return SlurmProvider(SlurmSettings.parse({"shared_dir": str(tmp_path)}),
                         cluster=Cluster(host))  # type: ignore[arg-type]


def test_the_states_of_many_tasks_come_from_one_listing_of_the_queue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "recorded.conf"))
    host = _Host({"squeue": [(0, QUEUE, "")]})
    for task, job in (("a", 11), ("b", 12)):
        (tmp_path / "jobs" / task).mkdir(parents=True)
        (tmp_path / "jobs" / task / "job.json").write_text(json.dumps(
            {"job_id": job, "nodes": 2, "launched_at": 0.0}))
    first, second = _provider(tmp_path, host), _provider(tmp_path, host)  # as Task.from_id
    a, b = first.job_state("a"), second.job_state("b")
    assert a is not None and (a.state, a.nodes) == ("RUNNING", "n[1-2]")
    assert b is not None and (b.state, b.reason) == ("PENDING", "Priority")
    assert [call[:3] for call in host.calls] == [["squeue", "-h", "--me"]]


def test_a_busy_controller_is_asked_again_after_a_back_off_and_a_submit_never(
        monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr(_commands.time, "sleep", waits.append)
    busy = (1, "", "squeue: error: slurm_load_jobs error: Socket timed out on send/recv "
                   "operation")
    host = _Host({"squeue": [busy, busy, (0, QUEUE, "")],
                  "sbatch": [(1, "", "sbatch: error: Batch job submission failed: Socket "
                                     "timed out on send/recv operation")]})
    cluster = Cluster(host)  # type: ignore[arg-type]
    assert cluster.run(["squeue", "-h"]) == QUEUE
    assert waits == list(_commands.RETRY_WAITS_S[:2])
    with pytest.raises(SlurmCommandError, match="Socket timed out"):
        cluster.run(["sbatch", "--parsable", "job.sh"])
    assert [call[0] for call in host.calls].count("sbatch") == 1
    host.answers["squeue"] = [busy]
    with pytest.raises(SlurmCommandError, match="exited 1: .*Socket timed out"):
        cluster.run(["squeue", "-h"])
    assert waits[2:] == list(_commands.RETRY_WAITS_S)


def test_a_job_that_failed_without_writing_its_output_names_shared_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm opens a job's output on its first node as the job starts; a FAILED job with
    none may be one whose nodes did not see ``shared_dir`` (recorded: every node here sees
    it)."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "recorded.conf"))

    host = _Host({"squeue": [(0, "", "")], "scontrol": [(0, (
        "JobId=13 JobState=FAILED Reason=NonZeroExitCode NodeList=n1\n"), "")]})
    host.answers["scontrol"].append((0, "n1\n", ""))  # show hostnames n1
    host.answers["scontrol"].append((0, "NodeName=n1 NodeAddr=127.60.0.1 State=IDLE\n", ""))
    (tmp_path / "jobs" / "t").mkdir(parents=True)
    (tmp_path / "jobs" / "t" / "job.json").write_text(json.dumps(
        {"job_id": 13, "nodes": 1, "launched_at": 0.0}))
    end = _provider(tmp_path, host).scheduler_end("t")
    assert end is not None and not end.cancelled
    assert end.message == (f"slurm: job 13 ended FAILED; the job wrote no output to "
                           f"{tmp_path}/jobs/t/slurm-13.out: its nodes may not see "
                           f"{tmp_path}. shared_dir must be a folder of the filesystem every "
                           "node mounts, at the same path")


def test_a_gpu_on_a_partition_without_any_is_refused_naming_the_fix(tmp_path: Path) -> None:
    from flow_sdk.spec import build_task_spec

    host = _Host({"sinfo": [(0, "(null)\n(null)\n", "")], "scontrol": [(0, (
        "PartitionName=cpu Default=YES MaxTime=60 Nodes=n[1-2] State=UP TotalNodes=2\n"), "")]})
    spec = build_task_spec(app="a", name="t", provider="slurm", gpu="h100:1",
                           max_run_time_hours=0.5)
    [problem] = _provider(tmp_path, host).problems(spec)
    assert (problem.field, problem.message) == ("gpu", "the default partition has no GPUs; "
                                                "drop gpu=, or name a partition with GPUs in "
                                                "provider_config['partition']")


def test_a_command_missing_on_the_login_node_names_ssh_s_path_and_the_check() -> None:
    host = _Host({"squeue": [(127, "", "bash: squeue: command not found")]})
    with pytest.raises(SlurmCommandError, match=(
            r"`squeue` is not on PATH on the login node me@login, as ssh runs a command there "
            r".*see `ssh me@login which squeue`")):
        Cluster(host, "me@login").run(["squeue", "-h"])  # type: ignore[arg-type]
    with pytest.raises(SlurmCommandError, match=r"`squeue` is not on PATH here: run on a login "
                                                r"node .*provider_config\['login'\]"):
        Cluster(host).run(["squeue", "-h"])  # type: ignore[arg-type]


@pytest.mark.parametrize(("config", "named"), [
    ({"login": "me@login"}, r"provider_config\['python'\] must be an absolute path .*with "
                            r"login=, this machine's interpreter means nothing there"),
    ({"ssh_config": "/etc/ssh/ssh_config"}, r"provider_config\['ssh_config'\] is for reaching "
                                             r"the login node: give provider_config\['login'\]"),
    ({"login": "-oProxyCommand=x"}, r"provider_config\['login'\] names the cluster's login "
                                    r"node as ssh takes it"),
    ({"shared_dir": "~bob/flow"}, r"provider_config\['shared_dir'\] .* under your home "
                                  r"folder \(~/\.\.\.\), not '~bob/flow'"),
])
def test_login_settings_are_checked_naming_the_key_and_the_fix(
        config: dict[str, str], named: str) -> None:
    with pytest.raises(ProviderError, match=named):
        SlurmSettings.parse(config)
