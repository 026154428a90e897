"""The store's bucket (issue #15): every S3 request on the default bucket names the account
that must own it (ExpectedBucketOwner), so a bucket of that name made by another account is
refused; task objects expire through a lifecycle rule; ``remove_finished_tasks`` (``flow gc
--older-than``) removes finished tasks' objects now, never a running task's.

moto ignores ExpectedBucketOwner; aws_moto_world fills that in as S3 answers it (403
AccessDenied when another account owns the bucket), for requests from any process.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import boto3
import pytest
from aws_moto_world import (
    ACCOUNT,
    BUCKET,
    TEST_SECRET,
    AwsWorld,
    Recorder,
    S3Wire,
    boot_of,
    launch_ids,
    spec,
)
from flow_testing import wait_until

from flow_sdk import FlowApp, TaskStatus, lifecycle, wire
from flow_sdk.home import tasksecrets
from flow_sdk.wire import signing
from flow_sdk.errors import ProviderError
from flow_sdk.wire import Outcome, TaskRecord
from flow_sdk.providers.aws import AwsProvider
from flow_sdk.providers.aws._lifecycle import rule_ids
from flow_sdk.providers.objects_gc import UNCHECKED, ObjectsReport, remove_finished_tasks
from flow_sdk.sim import AwsSimProvider

DEFAULT_BUCKET = f"flow-sdk-{ACCOUNT}-us-east-1"
OTHER_ACCOUNT = "111111111111"


class S3Calls:
    """Every S3 API call a boto3 session's clients make, with the parameters they were given
    (botocore's ``provide-client-params`` event, once per request, pages included)."""

    def __init__(self, session: boto3.session.Session) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        session.events.register("provide-client-params.s3", self._seen)

    def _seen(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append((model.name, dict(params)))

    def to(self, bucket: str) -> list[tuple[str, dict[str, Any]]]:
        return [(name, params) for name, params in self.calls if params.get("Bucket") == bucket]


def hooked_provider(world: AwsWorld, *, sim: bool = False, **overrides: Any
                    ) -> tuple[AwsProvider, S3Calls]:
    """The aws provider (``sim``: the simulated cloud's) with its S3 calls recorded."""
    session = boto3.session.Session()
    calls = S3Calls(session)
    if sim:
        return AwsSimProvider.from_config(world.sim_config(**overrides), session=session), calls
    return AwsProvider.from_config(world.config(**overrides), session=session), calls


def without_owner(calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    # CreateBucket takes no ExpectedBucketOwner (the bucket it creates is the caller's own)
    return [name for name, params in calls
            if name != "CreateBucket" and params.get("ExpectedBucketOwner") != ACCOUNT]


def other_accounts_s3(world: AwsWorld) -> Any:
    """An S3 client of another AWS account (moto: credentials of a role assumed there)."""
    creds = world.client("sts").assume_role(
        RoleArn=f"arn:aws:iam::{OTHER_ACCOUNT}:role/squatter",
        RoleSessionName="squatter")["Credentials"]
    return boto3.client("s3", region_name="us-east-1", endpoint_url=world.url,
                        aws_access_key_id=creds["AccessKeyId"],
                        aws_secret_access_key=creds["SecretAccessKey"],
                        aws_session_token=creds["SessionToken"])


# -- ExpectedBucketOwner ------------------------------------------------------------------------


def _answer() -> int:
    return 42


@pytest.mark.slow
def test_every_s3_request_on_the_default_bucket_names_its_owner(
        aws: AwsWorld, s3_wire: S3Wire, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole launch-to-result on the simulated cloud with the default bucket: every S3 call
    of the client (seen on its boto3 session) and every S3 request that reached the server
    (the nodes' too) carries ExpectedBucketOwner."""
    provider, calls = hooked_provider(aws, sim=True, bucket=None)
    app = FlowApp("owner", provider="aws-sim", provider_config=aws.sim_config(bucket=None))
    monkeypatch.setattr(app, "provider", lambda name=None: provider)
    task = app.function(num_instances=2, priority="high", quiet=True)(_answer).spawn()
    try:
        assert task.result(timeout=150) == 42
    finally:
        if not task.status.is_terminal:
            task.cancel()
    assert task.status is TaskStatus.SUCCEEDED

    client = calls.to(DEFAULT_BUCKET)
    names = {name for name, _ in client}
    assert {"HeadBucket", "CreateBucket", "PutPublicAccessBlock",
            "GetBucketLifecycleConfiguration", "PutBucketLifecycleConfiguration", "PutObject",
            "GetObject", "ListObjectsV2"} <= names
    assert without_owner(client) == []
    assert {params.get("Bucket") for _, params in calls.calls} == {DEFAULT_BUCKET}

    # what reached the server, from the client and from both nodes (results, outcome, ...)
    served = s3_wire.to(DEFAULT_BUCKET)
    creates = [r for r in served if r[1] == f"PUT {aws.url}/{DEFAULT_BUCKET}"]
    assert len(creates) == 1
    assert [r for r in served if r not in creates and r[2] != ACCOUNT] == []
    assert len(served) > len(client)  # the nodes' own requests are among them
    results = [r for r in served if "/results/" in r[1] and r[1].startswith("PUT")]
    assert len(results) == 2 and all(r[2] == ACCOUNT for r in results)


def test_the_nodes_boot_with_the_owner_and_fetch_the_wheel_with_it(aws: AwsWorld) -> None:
    provider = aws.provider(bucket=None)
    [node] = launch_ids(provider, "own-1", spec(num_instances=1, priority="high"))
    raw = aws.client("ec2").describe_instance_attribute(InstanceId=node, Attribute="userData")
    script = base64.b64decode(raw["UserData"]["Value"]).decode()
    config = dict(boot_of(script).provider_config)
    assert (config["bucket"], config["bucket_owner"]) == (DEFAULT_BUCKET, ACCOUNT)
    [fetch] = [line for line in script.splitlines()
               if "--expected-bucket-owner" in line and not line.startswith("#")]
    assert f"--expected-bucket-owner {ACCOUNT} " in fetch and "s3api get-object" in script
    node_side = AwsProvider.from_config(config)
    assert node_side.bucket_owner() == ACCOUNT  # no STS call needed on the node
    provider.terminate("own-1")


def test_a_default_bucket_owned_by_another_account_is_refused(aws: AwsWorld) -> None:
    squatter = other_accounts_s3(aws)
    squatter.create_bucket(Bucket=DEFAULT_BUCKET)  # before the caller ever used flow
    provider, calls = hooked_provider(aws, bucket=None)
    with pytest.raises(ProviderError, match=f"not owned by account {ACCOUNT}") as refused:
        provider.store.put(wire.task_key("t-1"), b"{}")
    assert "bucket of your own" in str(refused.value)
    assert [name for name, _ in calls.calls] == ["HeadBucket"]  # refused at the first request
    assert squatter.list_objects_v2(Bucket=DEFAULT_BUCKET).get("KeyCount") == 0
    # a node pointed at it (its config names the owner) is refused by S3 on every request
    node = AwsProvider.from_config(aws.config(
        bucket=DEFAULT_BUCKET, bucket_owner=ACCOUNT,
        launch={"task_id": "t-1", "region": "us-east-1", "attempt": 1}))
    with pytest.raises(ProviderError, match="AccessDenied"):
        node.store.put(wire.result_key("t-1", 0), b"forged")
    assert squatter.list_objects_v2(Bucket=DEFAULT_BUCKET).get("KeyCount") == 0


def test_a_named_bucket_is_checked_only_when_its_owner_is_named(aws: AwsWorld) -> None:
    provider, calls = hooked_provider(aws)  # the test bucket, no owner named
    provider.store.put("tasks/t/x", b"1")
    assert all("ExpectedBucketOwner" not in params for _, params in calls.calls)
    owned, owned_calls = hooked_provider(aws, bucket_owner=ACCOUNT)
    assert owned.store.get("tasks/t/x") == b"1"
    assert without_owner(owned_calls.to(BUCKET)) == []
    wrong = AwsProvider.from_config(aws.config(bucket_owner=OTHER_ACCOUNT))
    with pytest.raises(ProviderError, match=f"not owned by account {OTHER_ACCOUNT}"):
        wrong.store.get("tasks/t/x")
    with pytest.raises(ProviderError, match="bucket_owner"):
        AwsProvider.from_config(aws.config(bucket_owner="12345"))
    with pytest.raises(ProviderError, match="bucket_owner"):
        AwsProvider.from_config(aws.config(bucket=None, bucket_owner=OTHER_ACCOUNT)).bucket_name()


# -- task objects expire ------------------------------------------------------------------------


def flow_rules(world: AwsWorld, bucket: str) -> list[dict[str, Any]]:
    rules = world.client("s3").get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    return [r for r in rules if r["ID"].startswith("flow-sdk-expire-")]


def test_a_lifecycle_rule_expires_task_objects_after_first_use(aws: AwsWorld) -> None:
    provider = aws.provider(bucket=None)
    provider.store.put(wire.task_key("t-1"), b"{}")
    [rule] = flow_rules(aws, DEFAULT_BUCKET)
    assert rule["ID"] == rule_ids("flow/")["tasks/"]
    assert rule["Filter"] == {"Prefix": "flow/tasks/"} and rule["Status"] == "Enabled"
    assert rule["Expiration"] == {"Days": 30}  # the documented default


def test_the_expiry_is_configurable_and_keeps_other_rules(aws: AwsWorld,
                                                         recorder: Recorder) -> None:
    s3 = aws.client("s3")
    mine = {"ID": "users-own", "Filter": {"Prefix": "logs/"}, "Status": "Enabled",
            "Expiration": {"Days": 400}}
    s3.put_bucket_lifecycle_configuration(Bucket=BUCKET,
                                          LifecycleConfiguration={"Rules": [mine]})
    aws.provider(object_expiry_days=7).store.put("tasks/t/x", b"1")
    other_prefix = aws.provider(prefix="team-b/", object_expiry_days=90)
    other_prefix.store.put("tasks/t/x", b"1")
    rules = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]}
    assert rules["users-own"]["Expiration"] == {"Days": 400}
    assert rules[rule_ids("flow/")["tasks/"]]["Expiration"] == {"Days": 7}
    assert rules[rule_ids("team-b/")["tasks/"]]["Filter"] == {"Prefix": "team-b/tasks/"}
    again = aws.provider(recorder, object_expiry_days=7)  # up to date: read, not written
    again.store.put("tasks/t/y", b"1")
    assert recorder.count("s3.GetBucketLifecycleConfiguration") == 1
    assert recorder.count("s3.PutBucketLifecycleConfiguration") == 0
    aws.provider(object_expiry_days=None).store.put("tasks/t/z", b"1")
    ids = {r["ID"] for r in s3.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]}
    assert ids == {"users-own", rule_ids("team-b/")["tasks/"]}


@pytest.mark.parametrize("days", [0, -1, 4000, "30", True, 1.5])
def test_a_bad_expiry_is_refused_naming_the_key(aws: AwsWorld, days: Any) -> None:
    with pytest.raises(ProviderError, match="object_expiry_days"):
        AwsProvider.from_config(aws.config(object_expiry_days=days))


def test_a_task_that_would_outlive_its_records_is_refused_by_check(aws: AwsWorld) -> None:
    provider = aws.provider(object_expiry_days=2)
    [problem] = provider.check(spec(num_instances=1, priority="high", max_run_time_hours=72))
    assert problem.field == "max_run_time_hours" and "object_expiry_days" in problem.message
    assert provider.check(spec(num_instances=1, priority="high", max_run_time_hours=48)) == []


# -- flow gc --older-than: finished tasks' objects, now ---------------------------------------

DAY = 86400.0


def _task(provider: AwsProvider, task_id: str, digest: str, *, finished_days_ago: float | None,
          now: float, secret: bytes | None = None) -> None:
    """A task launched from this machine (its secret saved here), sealed with that secret
    (``secret``: another one, as a store writer without it would)."""
    store = provider.store
    own = bytes.fromhex(signing.new_secret())
    tasksecrets.save_task_secret(task_id, own.hex())
    sealed = signing.SignedStore(store, own if secret is None else secret)
    store.put(wire.payload_key(digest), b"payload " + digest.encode())
    sealed.put_record(wire.task_key(task_id), TaskRecord(
        task_id, spec(num_instances=1).model_dump(mode="json"), digest, now - 40 * DAY,
        29400, 29500))
    store.put(wire.result_key(task_id, 0), b"result")
    if finished_days_ago is not None:
        outcome = Outcome("SUCCEEDED", "done", now - finished_days_ago * DAY)
        sealed.put_record(wire.outcome_key(task_id), outcome)


def _remove(provider: AwsProvider, older_than_s: float, *, now: float,
            dry_run: bool = False) -> ObjectsReport:
    """``remove_finished_tasks`` with the judgement ``flow gc --older-than`` passes it."""
    return remove_finished_tasks(
        provider.store, older_than_s, lambda t: lifecycle.ended_here(provider.store, t),
        dry_run=dry_run, now=now)


def test_gc_older_than_removes_only_finished_tasks_objects_past_the_cutoff(
        aws: AwsWorld) -> None:
    provider = aws.provider()
    store, now = provider.store, time.time()
    _task(provider, "old-done", "1" * 64, finished_days_ago=10, now=now)
    _task(provider, "old-shared", "2" * 64, finished_days_ago=10, now=now)
    _task(provider, "recent-done", "3" * 64, finished_days_ago=1, now=now)
    _task(provider, "running", "2" * 64, finished_days_ago=None, now=now)  # 40 days old
    before = store.list("")

    dry = _remove(provider, 7 * DAY, dry_run=True, now=now)
    assert dry.removed_tasks == ["old-done", "old-shared"] and store.list("") == before
    assert dry.removed_payloads == ["1" * 64]

    report = _remove(provider, 7 * DAY, now=now)
    assert report.removed_tasks == ["old-done", "old-shared"]
    assert report.removed_objects == 6  # record, result and outcome of each
    assert report.removed_payloads == ["1" * 64]  # the running task still names "2" * 64
    assert set(report.kept) == {"recent-done", "running"}
    assert "running" in report.kept["running"]
    left = store.list("")
    assert not any(k.startswith(("tasks/old-done/", "tasks/old-shared/")) for k in left)
    assert wire.payload_key("1" * 64) not in left
    for key in (wire.task_key("running"), wire.result_key("running", 0),
                wire.payload_key("2" * 64), wire.payload_key("3" * 64),
                wire.outcome_key("recent-done")):
        assert key in left, key
    # the bucket's own objects, listed directly: exactly what the store says is left
    listed = aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="flow/")["Contents"]
    assert sorted(o["Key"][len("flow/"):] for o in listed) == left


def test_gc_older_than_keeps_a_task_whose_outcome_is_forged_or_not_checkable_here(
        aws: AwsWorld) -> None:
    provider, now = aws.provider(), time.time()
    forger = bytes.fromhex(signing.new_secret())
    _task(provider, "victim", "4" * 64, finished_days_ago=30, now=now, secret=forger)
    _task(provider, "signed", "5" * 64, finished_days_ago=30, now=now)
    _task(provider, "elsewhere", "6" * 64, finished_days_ago=30, now=now)
    tasksecrets.remove_task_secret("elsewhere")  # launched from another machine
    report = _remove(provider, DAY, now=now)
    assert report.removed_tasks == ["signed"]
    assert report.kept == {"victim": UNCHECKED, "elsewhere": UNCHECKED}
    for task_id in ("victim", "elsewhere"):
        assert provider.store.get(wire.result_key(task_id, 0)) == b"result"


def test_flow_gc_reclaims_the_tasks_nodes_then_older_than_its_objects(aws: AwsWorld) -> None:
    """As ``flow gc --older-than`` runs them: the nodes of the task whose sealed outcome says
    it ended go first, then its objects; a removed record alone reclaims nothing."""
    provider, now = aws.provider(), time.time()
    launch_ids(provider, "ended-1", spec(num_instances=1, priority="high"))
    tasksecrets.save_task_secret("ended-1", TEST_SECRET)
    sealed = signing.SignedStore(provider.store, bytes.fromhex(TEST_SECRET))
    lifecycle.record_outcome(sealed, "ended-1", Outcome("FAILED", "boom", now - 3 * DAY))
    report = lifecycle.collect(provider, known={"ended-1"})
    assert report.reasons == {"ended-1": "task ended FAILED"}
    wait_until(lambda: aws.non_terminated() == [], 10, "the ended task's node terminated")
    assert aws.client("iam").list_roles()["Roles"] == []
    assert lifecycle.remove_finished_objects(provider, DAY).removed_tasks == ["ended-1"]
    assert lifecycle.collect(provider, known={"ended-1"}).reasons == {}
