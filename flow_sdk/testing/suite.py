"""The contract every provider passes (see ``flow_sdk.testing``). Each test takes the
``provider_under_test`` fixture; nothing here branches on the provider's name."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

import pytest

from flow_sdk import TaskStatus, lifecycle, wire
from flow_sdk.home import tasksecrets
from flow_sdk.client.records import list_client_records
from flow_sdk.client.task import Task
from flow_sdk.errors import FlowError, ProviderError, ValidationError
from flow_sdk.providers.base import LaunchRequest, LogRecord, NoVolumes, Provider
from flow_sdk.providers.capabilities import Support
from flow_sdk.spec import VolumeSpec, build_task_spec
from flow_sdk.testing import calls
from flow_sdk.testing.target import ProviderUnderTest
from flow_sdk.wire import BootConfig, MembershipRecord, Outcome
from flow_sdk.wire.signing import SignedStore

TASK_TIMEOUT_S = 300.0  # a task's nodes boot and run within this (a cloud's boot included)
POLL_S = 0.25  # each poll asks the provider: a cloud's API, or a simulated one in-process
LARGE_OBJECT = 9 << 20  # above the 8 MiB where S3 clients switch to multipart uploads


def _wait_until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_S)


def _nothing_left(provider: Provider, task: Task) -> None:
    """By the provider's own account: every node of the task terminated, and ``flow gc``
    finds nothing of it to reclaim."""
    _wait_until(lambda: all(i.state == "terminated"
                            for i in provider.list_instances(task.task_id)),
                60, f"every node of {task.task_id} terminated")
    report = lifecycle.collect(provider, [task.task_id], dry_run=True)
    assert task.task_id not in report.reasons and task.task_id not in report.live_tasks, report


@pytest.mark.slow
def test_a_two_node_task_runs_end_to_end_and_leaves_nothing(
        provider_under_test: ProviderUnderTest) -> None:
    task = provider_under_test.app("contract").function(num_instances=2, priority="high")(
        calls.where_am_i).spawn()
    provider = task.provider
    try:
        listed = provider.list_instances(task.task_id)
        results = task.results(timeout=TASK_TIMEOUT_S)
    finally:
        if not task.status.is_terminal:
            task.cancel()
    assert task.status is TaskStatus.SUCCEEDED
    assert [{k: r[k] for k in ("rank", "world", "node")} for r in results] == [
        {"rank": r, "world": 2, "node": r} for r in range(2)]
    assert len(listed) == 2 and [i.instance_id for i in listed] == sorted(
        i.instance_id for i in listed)
    assert all(i.task_id == task.task_id for i in listed)
    # the launcher's signed membership record names the gang; the nodes took their ranks from
    # it, or, where the launch queued them before they had addresses (a scheduler's), from
    # the provider's instance list once they ran
    signed = SignedStore(provider.store, tasksecrets.load_task_secret(task.task_id))
    raw = signed.get_record(wire.membership_key(task.task_id, 0))
    assert raw is not None
    members = sorted(MembershipRecord.from_json(raw).members, key=lambda m: m.instance_id)
    assert [m.instance_id for m in members] == [i.instance_id for i in listed]
    agent_lines = task.logs(source="agent")
    if all(i.address for i in listed):
        assert [m.address for m in members] == [i.address for i in listed]
        assert {r["leader"] for r in results} == {members[0].address}
        assert sum("membership of generation 0 from its record" in line
                   for line in agent_lines) == 2
        assert not any("asking the provider" in line for line in agent_lines)
    else:
        assert all(i.state == "pending" and not i.address for i in listed), listed
        assert not any(m.address for m in members)
        assert len({r["leader"] for r in results}) == 1 and results[0]["leader"]
        assert sum("asking the provider" in line for line in agent_lines) == 2
    provider.terminate(task.task_id)  # idempotent after the task's own teardown
    _nothing_left(provider, task)


@pytest.mark.slow
def test_a_launch_that_gets_part_of_its_gang_starts_none_of_it(
        provider_under_test: ProviderUnderTest) -> None:
    """All or none: when only the first node of a 2-node gang starts, the launch fails with a
    typed error and the node that did start is stopped."""
    if provider_under_test.partial_launch is None:  # unproven is a failure, never a skip
        pytest.fail(f"all-or-none launch is unchecked for {provider_under_test.name!r}: give "
                    "the provider_under_test fixture a ProviderUnderTest(partial_launch=...) "
                    "that arranges a launch getting part of its gang", pytrace=False)
    label = f"contract-partial-{secrets.token_hex(3)}"
    function = provider_under_test.app(label).function(num_instances=2)(calls.where_am_i)
    with provider_under_test.partial_launch(), pytest.raises(FlowError):
        function.spawn()
    [record] = [r for r in list_client_records() if r.get("app") == label]
    task = Task.from_id(record["task_id"])
    assert task.status is TaskStatus.FAILED
    _nothing_left(task.provider, task)


@pytest.mark.slow
def test_gc_leaves_a_running_task_and_reclaims_it_once_ended_after_a_dry_run(
        provider_under_test: ProviderUnderTest) -> None:
    """``flow gc`` (``lifecycle.collect``) leaves a running task alone and reclaims it once
    its signed outcome says it ended (a dry run first only says so). The running node's SSH
    endpoint is there, or the provider refuses with a typed error naming itself."""
    task = provider_under_test.app("contract-gc").function(priority="high")(
        calls.sleeps).spawn()
    provider = task.provider
    known = [task.task_id]  # its client record is here: not an orphan
    try:
        _wait_until(lambda: any(n.phase == "running" for n in task.nodes()), TASK_TIMEOUT_S,
                    "the node runs the function")
        [node] = provider.list_instances(task.task_id)
        try:
            ssh = provider.ssh_endpoint(task.task_id, node.instance_id)
        except ProviderError as exc:
            assert provider.name in str(exc), exc
        else:
            assert ssh.host and ssh.port > 0 and ssh.host_key.startswith("ssh-")
        running = lifecycle.collect(provider, known)
        assert running.reasons == {} and running.live_tasks == [task.task_id]
        assert [i.state for i in provider.list_instances(task.task_id)] == ["running"]
        store = SignedStore(provider.store, tasksecrets.load_task_secret(task.task_id))
        assert lifecycle.record_outcome(store, task.task_id, Outcome(
            "FAILED", "written by the test", time.time()))  # ended, not torn down

        dry = lifecycle.collect(provider, known, dry_run=True)
        assert dry.dry_run and dry.reasons == {task.task_id: "task ended FAILED"}
        assert dry.live_tasks == []
        assert [i.state for i in provider.list_instances(task.task_id)] == ["running"]

        done = lifecycle.collect(provider, known)
        assert done.reasons == {task.task_id: "task ended FAILED"}
        assert done.stopped_processes or done.terminated_instances
        _nothing_left(provider, task)
    finally:
        provider.terminate(task.task_id)


@pytest.mark.slow
def test_a_lost_node_is_replaced_where_the_provider_adds_nodes(
        provider_under_test: ProviderUnderTest) -> None:
    """With ``max_restarts``, a node lost mid-task is replaced (``add_instances``) and the
    task succeeds on the survivor and the replacement; the lost node is stopped
    (``terminate_instances``) and nothing is left."""
    provider = provider_under_test.provider()
    if type(provider).add_instances is Provider.add_instances:  # it adds no nodes: it says so
        request = LaunchRequest("contract-no-add", build_task_spec(app="contract", name="f"),
                                BootConfig("contract-no-add", provider.name, {}))
        with pytest.raises(ProviderError, match=f"the {provider.name} provider cannot add"):
            provider.add_instances(request, 1)
        return
    task = provider_under_test.app("contract-replace").function(
        num_instances=2, max_restarts=1, priority="high")(calls.loses_its_second_node).spawn()
    try:
        results = task.results(timeout=TASK_TIMEOUT_S)
    finally:
        if not task.status.is_terminal:
            task.cancel()
    assert [(r["restart"], r["node"]) for r in results] == [(1, 0), (1, 1)]
    listed = provider.list_instances(task.task_id)
    assert len(listed) == 3  # the survivor, the lost node and its replacement
    assert len({n.instance_id for n in task.nodes()}) == 2
    _nothing_left(provider, task)


@pytest.mark.slow
def test_a_file_volume_is_shared_by_every_node_where_the_provider_has_them(
        provider_under_test: ProviderUnderTest) -> None:
    """A named file volume reaches every node of a task (its node mounts), where the provider
    honours file volumes; then it is deleted."""
    provider = provider_under_test.provider()
    name = f"contract-{secrets.token_hex(3)}"
    volumes = {"/shared": VolumeSpec(name=name, size_gb=100, interface="file")}
    if provider.capabilities.support("file_volumes") is Support.REFUSED:  # refused up front
        with pytest.raises(ValidationError, match=f"the {provider.name} provider does not "
                                                  "support file volumes"):
            provider_under_test.app("contract-volume").function(volumes=volumes)(
                calls.shares_a_volume)
        return
    try:
        task = provider_under_test.app("contract-volume").function(
            num_instances=2, priority="high", volumes=volumes)(
            calls.shares_a_volume).spawn("/shared")
        try:
            results = task.results(timeout=TASK_TIMEOUT_S)
        finally:
            if not task.status.is_terminal:
                task.cancel()
        assert results == [["node-0", "node-1"]] * 2
        _nothing_left(provider, task)
        assert provider.volumes.delete(name) is True
    finally:
        provider.volumes.delete(name, force=True)  # a failed run leaves no volume behind


def test_the_object_store_round_trips_and_lists_in_order(
        provider_under_test: ProviderUnderTest) -> None:
    store = provider_under_test.provider().store
    prefix = f"contract/{secrets.token_hex(4)}/"
    store.put(prefix + "a", b"one")
    assert store.get(prefix + "a") == b"one" and store.exists(prefix + "a")
    assert store.get(prefix + "missing") is None and not store.exists(prefix + "missing")
    assert store.put_if_absent(prefix + "b", b"two") is True
    assert store.put_if_absent(prefix + "b", b"three") is False
    assert store.get(prefix + "b") == b"two"
    large = secrets.token_bytes(LARGE_OBJECT)
    store.put(prefix + "c/large", large)
    assert store.get(prefix + "c/large") == large
    store.put(prefix + "a", b"")  # overwritten, empty
    assert store.get(prefix + "a") == b""
    assert store.list(prefix) == [prefix + "a", prefix + "b", prefix + "c/large"]
    assert store.delete_prefix(prefix) == 3
    assert store.list(prefix) == []


def test_the_log_store_pages_with_a_cursor_and_keeps_every_line(
        provider_under_test: ProviderUnderTest) -> None:
    logs = provider_under_test.provider().logs
    task_id = f"contract-{secrets.token_hex(4)}"
    now = time.time()
    writer = logs.writer(task_id, "node0.rank0")
    writer.write([LogRecord(now, "one"), LogRecord(now + 0.001, "two")])
    writer.close()
    assert "node0.rank0" in logs.streams(task_id)
    first, cursor = logs.read(task_id, "node0.rank0")
    assert [r.text for r in first] == ["one", "two"]
    many = [LogRecord(now + 0.002 + i / 1e6, f"line {i} " + "x" * 200) for i in range(2000)]
    writer = logs.writer(task_id, "node0.rank0")
    writer.write(many)
    writer.close()
    seen: list[str] = []
    while True:  # nothing read twice, nothing lost, however the provider pages
        page, cursor = logs.read(task_id, "node0.rank0", cursor)
        if not page:
            break
        seen.extend(r.text for r in page)
    assert seen == [r.text for r in many]


def test_named_volumes_are_made_once_listed_and_deleted_or_refused(
        provider_under_test: ProviderUnderTest) -> None:
    volumes = provider_under_test.provider().volumes
    spec = VolumeSpec(name=f"contract-{secrets.token_hex(3)}", size_gb=100, interface="file")
    if isinstance(volumes, NoVolumes):  # the provider declares none: a typed refusal
        with pytest.raises(ValidationError, match=provider_under_test.name):
            volumes.ensure(spec)
        return
    made = volumes.ensure(spec)
    try:
        assert (made.name, made.interface, made.provider) == (spec.name, "file",
                                                              provider_under_test.name)
        assert volumes.ensure(spec).location == made.location  # found, not made again
        assert (spec.name, "file") in [(v.name, v.interface) for v in volumes.list()]
    finally:
        assert volumes.delete(spec.name) is True
    assert spec.name not in [v.name for v in volumes.list()]
    assert volumes.delete(spec.name) is False
