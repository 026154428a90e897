"""``provider="slurm"`` on the test runner's real Slurm cluster: a task is one batch job whose
nodes each run an agent; results of every rank, a raised exception naming its rank, a 2x2
gloo DDP run; nothing left in ``squeue`` after any of them (``slurm_clean``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from flow_sdk import FlowApp, current
from flow_sdk.client.progress import describe_plan
from flow_sdk.errors import ValidationError
from flow_sdk.providers.slurm import SlurmProvider, SlurmSettings
from flow_sdk.providers.slurm._commands import Cluster
from flow_sdk.spec import build_task_spec
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow
TIMEOUT_S = 120


def where() -> dict[str, Any]:
    return {"rank": current.rank, "world": current.world_size, "node": current.node_index,
            "slurm_node": os.environ.get("SLURMD_NODENAME"), "leader": current.main_ip}


def test_remote_returns_rank_0s_value_and_every_rank_ran_on_its_own_node(
        app: FlowApp, slurm_clean: SlurmCluster, tmp_path: Path) -> None:
    function = app.function(num_instances=2, max_run_time_hours=0.1)(where)
    assert function.remote()["rank"] == 0
    task = function.spawn()
    results = task.results(timeout=TIMEOUT_S)
    assert [(r["rank"], r["world"], r["node"]) for r in results] == [(0, 2, 0), (1, 2, 1)]
    assert len({r["slurm_node"] for r in results}) == 2
    addresses = {node.name: node.address for node in slurm_clean.nodes}
    assert {r["leader"] for r in results} == {addresses[results[0]["slurm_node"]]}
    instances = task.provider.list_instances(task.task_id)
    assert [i.state for i in instances] == ["terminated", "terminated"]
    shared = tmp_path / "shared"
    assert not list(shared.glob("jobs/*/boot/*.json"))  # the 0600 boot files (the secret)
    assert len(list(shared.glob("envs/*/flow_sdk/__init__.py"))) == 1  # built once, reused


def fails_on_rank_1() -> int:
    if current.rank == 1:
        raise ValueError("rank 1 found a bad shard")
    return current.rank


def test_a_raised_exception_fails_the_task_naming_its_rank(app: FlowApp) -> None:
    function = app.function(num_instances=2, max_run_time_hours=0.1)(fails_on_rank_1)
    with pytest.raises(ValueError, match="bad shard") as raised:  # the user's own exception
        function.remote()
    assert "raised on node 1, rank 1 of task" in "\n".join(raised.value.__notes__)


def ddp_sum() -> list[float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    model(torch.ones(1, 2)).sum().backward()
    dist.destroy_process_group()
    return [value.item(), float(dist.is_available())]


def test_a_2x2_gloo_ddp_run_reduces_across_both_nodes(app: FlowApp) -> None:
    function = app.function(num_instances=2, workers_per_node=2, max_run_time_hours=0.1)(ddp_sum)
    task = function.spawn()
    assert task.results(timeout=TIMEOUT_S) == [[10.0, 1.0]] * 4


class _RecordedCluster(Cluster):
    """Slurm's answers as recorded from a partition that sets no time limit, with one node of
    eight H100s (GRES type nvidia_h100) and two without GPUs."""

    def run(self, argv: Any) -> str:
        if argv[0] == "sinfo":
            return "gpu:nvidia_h100:8(S:0-1)\n(null)\n(null)\n"
        assert list(argv[:3]) == ["scontrol", "-o", "show"], argv
        return ("PartitionName=debug Default=YES DefaultTime=NONE MaxTime=UNLIMITED "
                "Nodes=n[1-3] State=UP TotalNodes=3\n")


def test_gpus_are_checked_against_the_gres_types_of_the_partitions_nodes(
        tmp_path: Path) -> None:
    provider = SlurmProvider(SlurmSettings.parse({"shared_dir": str(tmp_path), "gpu_types":
                                                  {"h100": "nvidia_h100"}}),
                             cluster=_RecordedCluster())
    ok = build_task_spec(app="a", name="t", provider="slurm", gpu="h100:8",
                         max_run_time_hours=1)
    assert provider.problems(ok) == []
    wrong = build_task_spec(app="a", name="t", provider="slurm", gpu="a100:2",
                            max_run_time_hours=1)
    [problem] = provider.problems(wrong)
    assert problem.field == "gpu"
    assert "has GPUs of type nvidia_h100, not a100" in problem.message


def test_a_task_without_a_time_limit_on_a_partition_without_one_is_refused(
        tmp_path: Path) -> None:
    provider = SlurmProvider(SlurmSettings.parse({"shared_dir": str(tmp_path)}),
                             cluster=_RecordedCluster())
    spec = build_task_spec(app="a", name="t", provider="slurm", num_instances=2)
    [problem] = provider.problems(spec)
    assert problem.field == "max_run_time_hours"
    assert "the default partition sets none" in problem.message
    capped = build_task_spec(app="a", name="t", provider="slurm", num_instances=2,
                             max_run_time_hours=1)
    assert provider.problems(capped) == []


def test_a_price_cap_needs_the_node_hours_price_and_then_holds(tmp_path: Path) -> None:
    def provider(**config: object) -> SlurmProvider:
        return SlurmProvider(SlurmSettings.parse({"shared_dir": str(tmp_path), **config}),
                             cluster=_RecordedCluster())

    capped = build_task_spec(app="a", name="t", provider="slurm", num_instances=2,
                             max_run_time_hours=1, max_price_per_hour=3.0)
    [unknown] = provider().problems(capped)
    assert unknown.field == "max_price_per_hour"
    assert "provider_config['usd_per_node_hour']" in unknown.message
    [above] = provider(usd_per_node_hour=4.5).problems(capped)
    assert "costs $4.50" in above.message and "above the cap of $3.00" in above.message
    priced = provider(usd_per_node_hour=2.5)
    assert priced.problems(capped) == []
    plan = priced.plan(capped)
    assert (plan.usd_per_hour, plan.cost_per_hour, plan.cost_at_cap) == (2.5, 5.0, 5.0)
    assert describe_plan(plan).endswith("prices from provider_config['usd_per_node_hour']")


def test_gc_finds_our_jobs_by_name_and_comment_and_never_touches_another(
        slurm_clean: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose launcher died before it recorded the job id is still found (by its name
    and comment); it is cancelled once lifecycle judges its task ended; a job that is not
    ours, even one that names a task in its comment, lives on."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_clean.conf))
    provider = SlurmProvider.from_config({"shared_dir": str(tmp_path / "shared")})
    ours = slurm_clean.run("sbatch", "--parsable", "--time=5", "-J", "flow-orphan-1",
                           "--comment=flow-task:orphan-1", "-o", "/dev/null",
                           "--wrap", "sleep 300").stdout.strip()
    other = slurm_clean.run("sbatch", "--parsable", "--time=5", "-J", "someone-else",
                            "--comment=flow-task:orphan-1", "-o", "/dev/null",
                            "--wrap", "sleep 300").stdout.strip()
    try:
        kept = provider.gc()
        assert kept.live_tasks == ["orphan-1"] and kept.reasons == {}
        dry = provider.gc(dry_run=True, ended={"orphan-1": "task ended FAILED"})
        assert dry.reasons == {"orphan-1": "task ended FAILED"}
        assert dry.terminated_instances == [f"job {ours}"]
        assert provider.gc(ended={"orphan-1": "task ended FAILED"}).reasons
        queued = slurm_clean.run("squeue", "-h", "-o", "%i").stdout.split()
        assert ours not in queued and other in queued
    finally:
        slurm_clean.run("scancel", other, ours, check=False)


def test_a_job_slurm_has_forgotten_lists_as_terminated(
        slurm_clean: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_clean.conf))
    provider = SlurmProvider.from_config({"shared_dir": str(tmp_path / "shared")})
    job_dir = tmp_path / "shared" / "jobs" / "gone-1"
    job_dir.mkdir(parents=True)
    (job_dir / "job.json").write_text('{"job_id": "987654", "nodes": 2, "launched_at": 1.0}')
    assert [(i.instance_id, i.state) for i in provider.list_instances("gone-1")] == [
        ("sl987654-0000", "terminated"), ("sl987654-0001", "terminated")]
    provider.terminate("gone-1")  # nothing left to cancel: no error


def test_what_the_partition_can_never_run_is_refused_before_submitting_all_at_once(
        app: FlowApp, slurm_clean: SlurmCluster) -> None:
    """More nodes than the partition has, a cap above its MaxTime (60 min here), more GPUs
    than any of its nodes has (two each): Slurm would queue such a job for ever where limits
    are not enforced at submission; each is named, with its fix, and nothing is
    submitted."""
    with pytest.raises(ValidationError) as raised:  # as the function is declared
        app.function(num_instances=4, max_run_time_hours=2, gpu="h100:4")(where)
    fields = {problem.field: problem.message for problem in raised.value.problems}
    assert set(fields) == {"num_instances", "max_run_time_hours", "gpu"}
    assert "has 3 node(s), fewer than the 4 asked" in fields["num_instances"]
    assert "at most 60 min (MaxTime)" in fields["max_run_time_hours"]
    assert "give at most 0.97" in fields["max_run_time_hours"]
    assert "no node of the default partition has 4 GPUs of type h100: 2 at most" in fields[
        "gpu"]
    assert not slurm_clean.run("squeue", "-h").stdout.strip()


def test_the_plan_shows_the_partition_its_idle_nodes_and_the_time_limit(app: FlowApp) -> None:
    plan = app.plan(app.function(num_instances=2, max_run_time_hours=0.5)(where))
    assert plan.provider == "slurm" and plan.nodes == 2 and plan.usd_per_hour == 0.0
    assert "one job of 2 node(s) on the default partition (3 of 3 idle, MaxTime 01:00:00)" \
        in plan.summary
    assert "time limit 32 min" in plan.summary


def prints_lines() -> int:
    import time

    for step in range(3):
        print(f"rank {current.rank} line {step}", flush=True)
        time.sleep(0.2)
    return current.rank


def test_spawn_then_follow_streams_both_nodes_lines_until_the_task_ends(app: FlowApp) -> None:
    task = app.function(num_instances=2, max_run_time_hours=0.1)(prints_lines).spawn()
    lines = list(task.logs(follow=True))  # returns once the task has ended
    for node in (0, 1):
        mine = [line for line in lines if line.startswith(f"[Node {node}]")]
        assert [line.split("] ")[-1] for line in mine if "line" in line] == [
            f"rank {node} line {step}" for step in range(3)], lines
    assert task.results(timeout=TIMEOUT_S) == [0, 1]
