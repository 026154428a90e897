"""The credentials a simulated instance's metadata service hands its node: those of its
instance profile's role, as EC2 hands them out.

The instance process holds the simulated account's keys (it plays EC2): it reads the
instance's profile association from EC2, the profile's role from IAM, and assumes that role through STS
with the instance id as session name. moto's access control knows the temporary keys STS
made, so every call the node makes with them is decided by the role's policy (for a task's
nodes, the one ``flow_sdk.providers.aws._iam`` writes). They are kept until
``RENEW_BEFORE_S`` before they expire.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws._clients import Clients

DURATION_S = 3600  # STS's default session, and what a role allows unless raised
RENEW_BEFORE_S = 900.0
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


class RoleCredentials:
    """The role credentials of one instance (thread-safe; a callable for ``ImdsEmulator``)."""

    def __init__(self, instance_id: str, region: str, endpoint_url: str) -> None:
        self.instance_id = instance_id
        self.region = region
        self.endpoint_url = endpoint_url
        self._lock = threading.Lock()
        self._role: tuple[str, str] | None = None  # (role name, role ARN)
        self._document: dict[str, str] | None = None
        self._expires: datetime.datetime | None = None
        self._clients = Clients(endpoint_url)  # EC2, IAM and STS on one session, made once

    def _client(self, service: str) -> Any:
        return self._clients.get(service, self.region)

    def _profile_role(self) -> tuple[str, str] | None:
        """The instance profile's role (name, ARN), or None when it runs without one."""
        associations = self._client("ec2").describe_iam_instance_profile_associations(
            Filters=[{"Name": "instance-id", "Values": [self.instance_id]}]
        )["IamInstanceProfileAssociations"]
        arns = [str(a["IamInstanceProfile"]["Arn"]) for a in associations
                if a.get("InstanceId") == self.instance_id]
        if not arns:
            return None
        name = arns[0].rsplit("/", 1)[-1]
        roles = self._client("iam").get_instance_profile(
            InstanceProfileName=name)["InstanceProfile"]["Roles"]
        if not roles:
            return None
        return str(roles[0]["RoleName"]), str(roles[0]["Arn"])

    def _assume(self, role_arn: str) -> tuple[dict[str, str], datetime.datetime]:
        answer = self._client("sts").assume_role(
            RoleArn=role_arn, RoleSessionName=self.instance_id,
            DurationSeconds=DURATION_S)["Credentials"]
        expires = answer["Expiration"].astimezone(datetime.timezone.utc)
        now = datetime.datetime.now(datetime.timezone.utc)
        return {"Code": "Success", "LastUpdated": now.strftime(_TIME_FORMAT),
                "Type": "AWS-HMAC", "AccessKeyId": answer["AccessKeyId"],
                "SecretAccessKey": answer["SecretAccessKey"], "Token": answer["SessionToken"],
                "Expiration": expires.strftime(_TIME_FORMAT)}, expires

    def __call__(self) -> tuple[str, dict[str, str]] | None:
        """(role name, credentials document), or None when the instance has no profile;
        raises ProviderError when EC2, IAM or STS refuses."""
        with self._lock:
            now = datetime.datetime.now(datetime.timezone.utc)
            fresh = (self._expires is not None
                     and (self._expires - now).total_seconds() > RENEW_BEFORE_S)
            if fresh and self._role is not None and self._document is not None:
                return self._role[0], self._document
            try:
                self._role = self._role or self._profile_role()
                if self._role is None:
                    return None
                self._document, self._expires = self._assume(self._role[1])
            except (ClientError, BotoCoreError) as exc:
                raise ProviderError(f"could not make the credentials of instance "
                                    f"{self.instance_id}'s role: {exc}") from exc
            return self._role[0], self._document
