"""The simulated account refuses whoever lacks its keys, live, against its own server: no
keys, dummy keys, a forged signature and moto's admin endpoints are refused; a task's node
role, with the credentials its instance's metadata service hands out, reaches its own
secret, objects and log group and not another task's, nor its nodes; the key file is 0600;
an instance's metadata service answers only that instance's processes. Each refusal is
paired with the same principal's allowed call."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from flow_testing import wait_until

from flow_sdk.system.procs import pids_with_env
from flow_sdk.providers import get_provider
from flow_sdk.providers.aws._iam import TaskAccess, create_task_role, role_name
from flow_sdk.providers.aws._tasksecret import put_task_secret
from flow_sdk.sim import AwsSimProvider, sim_home
from flow_sdk.sim._access import KEYS_FILE, read_keys
from flow_sdk.sim._imds import ImdsEmulator
from flow_sdk.sim._rolecreds import RoleCredentials
from flow_sdk.sim._server import ServerState, read_state
from flow_sdk.wire import envvars

REGION = "us-east-1"

pytestmark = pytest.mark.slow  # the account's own server, metadata services


def _kill(state: ServerState | None) -> None:
    if state is not None and state.alive():
        os.kill(state.pid, 15)
        wait_until(lambda: not state.alive(), 15, f"server {state.pid} to stop")


@pytest.fixture()
def account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsSimProvider]:
    """The aws-sim provider on a fresh simulated account (its own server), with no AWS
    settings in this process's environment; the server is stopped by its pid."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("FLOW_HOME", str(tmp_path / "flow"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    provider = get_provider("aws-sim")
    assert isinstance(provider, AwsSimProvider)
    yield provider
    _kill(read_state(sim_home()))


def _client(provider: AwsSimProvider, service: str, key: str, secret: str,
            token: str | None = None) -> Any:
    return boto3.client(service, region_name=REGION, endpoint_url=provider.cfg.endpoint_url,
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        aws_session_token=token)


def _code(call: Any) -> str:
    try:
        call()
    except ClientError as exc:
        return str(exc.response["Error"]["Code"])
    return "allowed"


def _http(url: str, method: str = "GET", body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return int(reply.status), bytes(reply.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def _signed_headers(url: str, method: str, body: bytes, key: str, secret: str,
                    headers: dict[str, str]) -> dict[str, str]:
    request = AWSRequest(method=method, url=url, data=body, headers=headers)
    SigV4Auth(Credentials(key, secret), "ssm", REGION).add_auth(request)
    return dict(request.headers.items())


def _ssm_get_body(name: str) -> bytes:
    return json.dumps({"Name": name, "WithDecryption": True}).encode()


SSM_GET = {"Content-Type": "application/x-amz-json-1.1",
           "X-Amz-Target": "AmazonSSM.GetParameter"}


def test_the_ssm_read_without_keys_is_refused_and_with_the_account_keys_allowed(
        account: AwsSimProvider) -> None:
    home = sim_home()
    keys_file = home / KEYS_FILE
    mode = keys_file.stat()
    assert stat.S_IMODE(mode.st_mode) == 0o600 and mode.st_uid == os.getuid()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    keys = read_keys(keys_file)
    assert keys.access_key_id not in ("testing", "") and len(keys.secret_access_key) >= 40
    assert not [k for k in os.environ if k.startswith("AWS_ACCESS")]  # the provider's only
    ssm = account.clients.get("ssm", REGION)
    ssm.put_parameter(Name="/flow-sdk/x/t-1", Value="the-secret", Type="SecureString")
    url = f"{account.cfg.endpoint_url}/"
    body = _ssm_get_body("/flow-sdk/x/t-1")

    # the account's keys: allowed (through the provider's session, and signed by hand)
    assert ssm.get_parameter(Name="/flow-sdk/x/t-1",
                             WithDecryption=True)["Parameter"]["Value"] == "the-secret"
    status, answer = _http(url, "POST", body, _signed_headers(
        url, "POST", body, keys.access_key_id, keys.secret_access_key, SSM_GET))
    assert status == 200 and b"the-secret" in answer
    # no keys, dummy keys, the account's key id with a guessed secret: refused
    status, answer = _http(url, "POST", body, SSM_GET)
    assert status == 403 and b"the-secret" not in answer
    dummy = _client(account, "ssm", "testing", "testing")
    assert _code(lambda: dummy.get_parameter(Name="/flow-sdk/x/t-1", WithDecryption=True)) == (
        "UnrecognizedClientException")
    forged = _client(account, "ssm", keys.access_key_id, "x" * 40)
    assert _code(lambda: forged.get_parameter(Name="/flow-sdk/x/t-1", WithDecryption=True)) == (
        "InvalidSignatureException")


def test_moto_admin_endpoints_are_refused_even_to_the_account(account: AwsSimProvider) -> None:
    keys = read_keys(sim_home() / KEYS_FILE)
    ssm = account.clients.get("ssm", REGION)
    ssm.put_parameter(Name="/flow-sdk/x/t-2", Value="dump-me", Type="SecureString")
    base = account.cfg.endpoint_url
    for path, method, body in (("/moto-api/data.json", "GET", b""),
                               ("/moto-api/reset-auth", "POST", b"inf"),
                               ("/moto-api/reset", "POST", b""),
                               ("/latest/meta-data/iam/security-credentials/", "GET", b"")):
        url = f"{base}{path}"
        status, answer = _http(url, method, body or None)
        assert status == 403 and b"dump-me" not in answer, (path, status)
        signed = _signed_headers(url, method, body, keys.access_key_id,
                                 keys.secret_access_key, {})
        status, answer = _http(url, method, body or None, signed)
        assert status == 403 and b"dump-me" not in answer, (path, "signed", status)
    # the checks are still on, and nothing was reset: dummy keys refused, the account's allowed
    dummy = _client(account, "ssm", "testing", "testing")
    assert _code(lambda: dummy.get_parameter(Name="/flow-sdk/x/t-2")) == (
        "UnrecognizedClientException")
    assert ssm.get_parameter(Name="/flow-sdk/x/t-2",
                             WithDecryption=True)["Parameter"]["Value"] == "dump-me"


def _task_access(provider: AwsSimProvider, task_id: str) -> TaskAccess:
    return TaskAccess(task_id=task_id, bucket=provider.bucket_name(),
                      prefix=provider.cfg.prefix, store_tag=provider.store_tag, region=REGION,
                      log_group=provider.cfg.log_group_prefix + task_id,
                      code_key="code/" + "c" * 64 + ".whl", payload_digest="d" * 64,
                      bucket_owner=provider.bucket_owner())


def _launch_with_role(provider: AwsSimProvider, task_id: str) -> str:
    """One instance running with the task's role, as a launch starts one."""
    create_task_role(provider.clients.get("iam", REGION), _task_access(provider, task_id))
    ec2 = provider.clients.get("ec2", REGION)
    assert provider.cfg.ami_id is not None
    answer = ec2.run_instances(ImageId=provider.cfg.ami_id, MinCount=2, MaxCount=2,
                               InstanceType="t3.micro", IamInstanceProfile={
                                   "Name": role_name(provider.store_tag, task_id)})
    return str(answer["Instances"][1]["InstanceId"])  # the second: each has the profile


NODE_SCRIPT = textwrap.dedent("""
    import json, sys
    import boto3
    from botocore.exceptions import ClientError, NoCredentialsError

    def code(call):
        try:
            call()
        except ClientError as exc:
            return exc.response["Error"]["Code"]
        except NoCredentialsError:
            return "NoCredentials"
        return "allowed"

    url, region, bucket, other_instance, *names = sys.argv[1:]
    own, other = dict(zip(("secret", "key", "group"), names[:3])), dict(zip(
        ("secret", "key", "group"), names[3:]))
    ssm = boto3.client("ssm", region_name=region, endpoint_url=url)
    s3 = boto3.client("s3", region_name=region, endpoint_url=url)
    logs = boto3.client("logs", region_name=region, endpoint_url=url)
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=url)
    efs = boto3.client("efs", region_name=region, endpoint_url=url)
    decided = {"find file volumes": code(efs.describe_file_systems),
               "list instances": code(ec2.describe_instances),
               "terminate another task's node": code(lambda: ec2.terminate_instances(
                   InstanceIds=[other_instance]))}
    for whose, task in (("own", own), ("other", other)):
        decided[f"{whose} secret"] = code(lambda: ssm.get_parameter(
            Name=task["secret"], WithDecryption=True))
        decided[f"{whose} object"] = code(lambda: s3.put_object(
            Bucket=bucket, Key=task["key"], Body=b"x"))
        decided[f"{whose} log group"] = code(lambda: logs.create_log_group(
            logGroupName=task["group"]))
    print(json.dumps(decided))
""")


def _as_node(imds: str, tag: str | None, argv: list[str], tmp: Path) -> dict[str, str]:
    """Run NODE_SCRIPT as a process of the instance ``tag`` (None: of none), with no AWS
    credentials but its metadata service."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp),
           "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds, "AWS_METADATA_SERVICE_TIMEOUT": "5",
           "AWS_CONFIG_FILE": str(tmp / "no-aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials")}
    if tag is not None:
        env[envvars.SIM_INSTANCE] = tag
    done = subprocess.run([sys.executable, "-c", NODE_SCRIPT, *argv], env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    return dict(json.loads(done.stdout))


def test_a_node_role_reaches_its_own_secret_objects_and_logs_not_another_tasks(
        account: AwsSimProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ssm = account.clients.get("ssm", REGION)
    own = put_task_secret(ssm, account.store_tag, "task-a", "secret-of-a")
    other = put_task_secret(ssm, account.store_tag, "task-b", "secret-of-b")
    account.store.put("tasks/task-a/seed", b"a")  # the bucket, made by the account
    other_instance = _launch_with_role(account, "task-b")  # first: its profile is listed first
    instance = _launch_with_role(account, "task-a")
    keys = read_keys(sim_home() / KEYS_FILE)
    for name, value in keys.environment().items():  # the instance process holds them
        monkeypatch.setenv(name, value)
    tag = f"task-a/{instance}"
    imds = ImdsEmulator({"instance-id": instance}, peers=lambda: pids_with_env(
        envvars.SIM_INSTANCE, [tag]), credentials=RoleCredentials(instance, REGION,
                                                         str(account.cfg.endpoint_url)))
    endpoint = imds.start()
    prefix, groups = account.cfg.prefix, account.cfg.log_group_prefix
    argv = [str(account.cfg.endpoint_url), REGION, account.bucket_name(), other_instance,
            own, f"{prefix}tasks/task-a/result", f"{groups}task-a",
            other, f"{prefix}tasks/task-b/result", f"{groups}task-b"]
    try:
        decided = _as_node(endpoint, tag, argv, tmp_path)
        assert decided == {"find file volumes": "allowed", "list instances": "allowed",
                           "terminate another task's node": "AccessDenied",
                           "own secret": "allowed", "other secret": "AccessDeniedException",
                           "own object": "allowed", "other object": "AccessDenied",
                           "own log group": "allowed",
                           "other log group": "AccessDeniedException"}, decided
        assert imds.refused == 0
        # another process of this machine, without the instance's tag: no credentials at all
        assert set(_as_node(endpoint, None, argv, tmp_path).values()) == {"NoCredentials"}
        assert imds.refused > 0
        ec2 = account.clients.get("ec2", REGION)  # the account may
        ec2.terminate_instances(InstanceIds=[other_instance])
    finally:
        imds.stop()


# A token, then the instance id, as the bootstrap asks (curl, which any user may run).
IMDS_SCRIPT = textwrap.dedent("""
    out=$(curl -s -w ' %{http_code}' -X PUT \\
      -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' "$1/latest/api/token")
    status=${out##* } body=${out% *}
    if [ "$status" = 200 ]; then
      out=$(curl -s -w ' %{http_code}' -H "X-aws-ec2-metadata-token: $body" \\
        "$1/latest/meta-data/instance-id")
      status=${out##* } body=${out% *}
    fi
    if [ "$status" = 200 ]; then echo "$status $body"; else echo "$status"; fi
""")


def _drop_to_nobody() -> None:
    os.setgid(65534)
    os.setuid(65534)


def test_the_metadata_service_answers_its_instances_processes_only() -> None:
    tag = "task-m/i-0123456789abcdef0"
    imds = ImdsEmulator({"instance-id": "i-0123456789abcdef0"},
                        peers=lambda: pids_with_env(envvars.SIM_INSTANCE, [tag]))
    endpoint = imds.start()

    def ask(env: dict[str, str], as_nobody: bool = False) -> str:
        done = subprocess.run(["bash", "-c", IMDS_SCRIPT, "imds", endpoint],
                              env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                              text=True, timeout=60, check=True, cwd="/",
                              preexec_fn=_drop_to_nobody if as_nobody else None)
        return done.stdout.strip()

    try:
        assert ask({envvars.SIM_INSTANCE: tag}) == "200 i-0123456789abcdef0"  # the instance's own
        assert ask({}) == "403"  # a process of this user, not the instance's
        assert ask({envvars.SIM_INSTANCE: "task-m/i-other"}) == "403"  # another instance's
        assert ask({envvars.SIM_INSTANCE: tag}, as_nobody=True) == "403"  # another user, tag copied
        assert imds.refused == 3
        assert ask({envvars.SIM_INSTANCE: tag}) == "200 i-0123456789abcdef0"
    finally:
        imds.stop()


def test_a_role_removed_from_its_profile_twice_is_no_such_entity(account: AwsSimProvider) -> None:
    """Two teardowns of one task at once both remove its role from its instance profile: the
    second gets IAM's ``NoSuchEntity``, which teardown tolerates (moto answered 500)."""
    iam = account.clients.get("iam", REGION)
    iam.create_role(RoleName="twice", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "ec2.amazonaws.com"}}]}))
    iam.create_instance_profile(InstanceProfileName="twice")
    iam.add_role_to_instance_profile(InstanceProfileName="twice", RoleName="twice")

    def remove() -> None:
        iam.remove_role_from_instance_profile(InstanceProfileName="twice", RoleName="twice")

    assert _code(remove) == "allowed"
    assert _code(remove) == "NoSuchEntity"
