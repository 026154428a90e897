"""The resources moto's access control checks, for the calls the simulated account's clients
make.

moto authorizes S3, IAM, STS and SQS requests against their resource, and every other
request against ``*`` only, so a policy that names one SSM parameter or one log group would
deny everything. ``install()`` (server process only) gives the services flow's nodes call a
list of the ARNs each request touches, built from the request as AWS builds them, and every
one of them must be allowed: SSM parameters, CloudWatch Logs groups and streams, EC2
instances, volumes and what a RunInstances names (image, security groups, subnet, key pair,
placement group, spot request, network interfaces), and EFS file systems. Any other call of
these services is checked against ``*``. S3's HeadBucket is authorized as ``s3:ListBucket``,
as IAM does. Two repairs of moto's checks for these services: a GET, HEAD or DELETE is
verified over the empty payload it was signed over (moto hashes EFS's headers instead), and
SSM's and CloudWatch Logs' refusals are written in their JSON protocol, with AWS's codes
(``AccessDeniedException``, ``UnrecognizedClientException``, ``InvalidSignatureException``).
moto evaluates no policy conditions (``StringEquals`` on tags, ``s3:prefix``,
``ec2:InstanceType`` ... all hold), and a launch's ``iam:PassRole`` is not checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_EC2_TYPES = {"i": "instance", "vol": "volume", "sg": "security-group", "subnet": "subnet",
              "vpc": "vpc", "eni": "network-interface", "sir": "spot-instances-request",
              "igw": "internet-gateway", "rtb": "route-table", "key": "key-pair",
              "pg": "placement-group"}
_EC2_NO_ACCOUNT = {"ami": "image", "snap": "snapshot"}  # ARNs of these carry no account
_INSTANCE_ACTIONS = ("TerminateInstances", "StopInstances", "StartInstances",
                     "RebootInstances")
_STREAM_ACTIONS = ("CreateLogStream", "DeleteLogStream", "PutLogEvents", "GetLogEvents")
_SSM_ONE = ("GetParameter", "PutParameter", "DeleteParameter", "GetParameterHistory",
            "LabelParameterVersion", "UnlabelParameterVersion")
_SSM_MANY = ("GetParameters", "DeleteParameters")


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def ssm_resources(request: Any) -> list[str]:
    """The parameters an SSM request names (``*`` for others, as DescribeParameters)."""
    action = request._get_action()
    base = f"arn:aws:ssm:{request.region}:{request.current_account}:parameter"
    if action in _SSM_ONE:
        names = _as_list(request._get_param("Name"))
    elif action in _SSM_MANY:
        names = _as_list(request._get_param("Names"))
    elif action == "GetParametersByPath":
        names = _as_list(request._get_param("Path"))
    else:
        return ["*"]
    return [base + (n if n.startswith("/") else f"/{n}") for n in names] or ["*"]


def logs_resources(request: Any) -> list[str]:
    """The log group, or stream, a CloudWatch Logs request names (``*`` for others)."""
    action = request._get_action()
    if action in ("TagResource", "UntagResource", "ListTagsForResource"):
        return _as_list(request._get_param("resourceArn")) or ["*"]
    group = request._get_param("logGroupName")
    if not group:
        return ["*"]
    arn = f"arn:aws:logs:{request.region}:{request.current_account}:log-group:{group}"
    stream = request._get_param("logStreamName")
    if action in _STREAM_ACTIONS and stream:
        return [f"{arn}:log-stream:{stream}"]
    return [arn]


def _ec2_arn(region: str, account: str, resource_id: str) -> str:
    prefix = resource_id.split("-", 1)[0]
    if prefix in _EC2_NO_ACCOUNT:
        return f"arn:aws:ec2:{region}::{_EC2_NO_ACCOUNT[prefix]}/{resource_id}"
    kind = _EC2_TYPES.get(prefix, prefix)
    return f"arn:aws:ec2:{region}:{account}:{kind}/{resource_id}"


def _launch_resources(request: Any, region: str, account: str) -> list[str]:
    ec2 = f"arn:aws:ec2:{region}:{account}"
    found = [f"{ec2}:instance/*", _ec2_arn(region, account, str(request._get_param("ImageId")))]
    found += [_ec2_arn(region, account, g) for g in _as_list(request._get_param(
        "SecurityGroupIds"))]
    found += [f"{ec2}:security-group/{name}" for name in _as_list(request._get_param(
        "SecurityGroups"))]
    subnet = request._get_param("SubnetId")
    found.append(_ec2_arn(region, account, str(subnet)) if subnet else f"{ec2}:subnet/*")
    key = request._get_param("KeyName")
    if key:
        found.append(f"{ec2}:key-pair/{key}")
    group = (request._get_param("Placement") or {}).get("GroupName")
    if group:
        found.append(f"{ec2}:placement-group/{group}")
    if (request._get_param("InstanceMarketOptions") or {}).get("MarketType") == "spot":
        found.append(f"{ec2}:spot-instances-request/*")
    if request._get_param("NetworkInterfaces"):
        found.append(f"{ec2}:network-interface/*")
    return found


def ec2_resources(request: Any) -> list[str]:
    """The instances, volumes and launch resources an EC2 request names (``*`` for
    others, as the Describe calls)."""
    action = request._get_action()
    region, account = request.region, request.current_account
    if action in _INSTANCE_ACTIONS:
        ids = _as_list(request._get_param("InstanceIds"))
    elif action in ("CreateTags", "DeleteTags"):
        ids = _as_list(request._get_param("Resources"))
    elif action in ("DeleteVolume", "AttachVolume", "DetachVolume"):
        ids = _as_list(request._get_param("VolumeId")) + _as_list(
            request._get_param("InstanceId"))
    elif action == "RunInstances":
        return _launch_resources(request, region, account)
    else:
        return ["*"]
    return [_ec2_arn(region, account, i) for i in ids] or ["*"]


def efs_resources(request: Any) -> list[str]:
    """The file system an EFS request names (all of the account's for a listing)."""
    base = f"arn:aws:elasticfilesystem:{request.region}:{request.current_account}:file-system"
    file_system = request._get_param("FileSystemId")
    if request._get_action() == "DescribeFileSystems":
        return [f"{base}/{file_system or '*'}"]
    return [f"{base}/{file_system}"] if file_system else ["*"]


# What AWS's JSON-protocol services (SSM, CloudWatch Logs) call moto's refusals.
_JSON_ERRORS = {"AccessDenied": "AccessDeniedException",
                "InvalidClientTokenId": "UnrecognizedClientException",
                "SignatureDoesNotMatch": "InvalidSignatureException"}


def _authorizer(resources: Callable[[Any], list[str]], json_protocol: bool
                ) -> Callable[..., None]:
    """moto's authorization of one request, done for each resource the request touches; a
    JSON-protocol service's refusal is written as JSON (moto writes XML, which SDKs cannot
    read there)."""
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.core.exceptions import JsonRESTError
    from moto.core.exceptions import _RESTError as RESTError

    def authorize(self: Any, resource: str = "*") -> None:
        # a GET, HEAD or DELETE was signed over an empty payload; moto would hash its parsed
        # form data instead (the headers, for EFS's REST calls)
        data = self.data
        if self.method in ("GET", "HEAD", "DELETE") and not self.raw_body:
            self.data = {}
        try:
            for arn in resources(self):
                ActionAuthenticatorMixin._authenticate_and_authorize_normal_action(self, arn)
        except RESTError as refused:
            if not json_protocol or isinstance(refused, JsonRESTError):
                raise
            error = JsonRESTError(_JSON_ERRORS.get(refused.error_type, refused.error_type),
                                  refused.message)
            error.code = refused.code
            raise error from refused
        finally:
            self.data = data

    return authorize


def _s3_iam_names(original: Callable[..., None]) -> Callable[..., None]:
    def set_action(self: Any, resource_type: str, method: str, querystring: Any) -> None:
        original(self, resource_type, method, querystring)
        if self.data.get("Action") == "HeadBucket":
            self.data["Action"] = "ListBucket"  # IAM authorizes HeadBucket as ListBucket

    return set_action


def install() -> None:
    """Give moto's SSM, CloudWatch Logs, EC2 and EFS responders the resources above, and S3
    IAM's action name for HeadBucket (this process only)."""
    from moto.ec2.responses import EC2Response
    from moto.efs.responses import EFSResponse
    from moto.logs.responses import LogsResponse
    from moto.s3.responses import S3Response
    from moto.ssm.responses import SimpleSystemManagerResponse

    for responder, resources, json_protocol in (
            (SimpleSystemManagerResponse, ssm_resources, True),
            (LogsResponse, logs_resources, True), (EC2Response, ec2_resources, False),
            (EFSResponse, efs_resources, False)):
        setattr(responder, "_authenticate_and_authorize_normal_action",  # noqa: B010
                _authorizer(resources, json_protocol))
    S3Response._set_action = _s3_iam_names(S3Response._set_action)  # type: ignore[method-assign]
