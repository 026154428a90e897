"""Who may use the simulated account: its keys, and moto's IAM access control turned on.

The account's server (``_serve``) calls ``enforce()`` and ``create_account()`` before it
listens: moto then checks every request's SigV4 signature against the account's IAM users and
assumed roles, and evaluates the caller's identity policies (``_arns`` supplies the resource
ARNs of the calls nodes make). The account has one IAM user, whose policy allows everything;
its access key (random) is written to ``<home>/keys.json`` (0600), read by every client of the
account: the ``aws-sim`` provider's boto3 session and the simulated instances, which play EC2
(power-off, EBS attachment) and hand their nodes credentials of the instance profile's role
(``_rolecreds``). moto's own admin endpoints (``/moto-api/*``: a dump of every resource,
SecureString values included, a reset, and a switch that turns the checks off) and its
stand-in metadata service are refused. Nothing here runs in a caller's process.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flow_sdk.errors import ProviderError

KEYS_FILE = "keys.json"  # under the account's home, 0600
ADMIN_USER = "flow-sim-account"
ADMIN_PATH = "/flow-sim/"
ADMIN_POLICY_NAME = "administrator"
ADMIN_POLICY = {"Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
# moto's applications that answer no client of the account: its admin API and its own
# stand-in for the instance metadata service (each simulated instance has its own, _imds)
REFUSED_BACKENDS = ("moto_api", "instance_metadata")
EC2_SERVICE = "ec2.amazonaws.com"  # the principal instance roles trust


@dataclass(frozen=True)
class AccountKeys:
    """The access key of the account's IAM user."""

    access_key_id: str
    secret_access_key: str

    def environment(self) -> dict[str, str]:
        """The keys as the AWS SDKs and CLI read them from the environment."""
        return {"AWS_ACCESS_KEY_ID": self.access_key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret_access_key}


def write_keys(path: Path, keys: AccountKeys) -> None:
    """Write ``keys`` to ``path``, readable by its owner only, replacing any older file whole
    (the file is 0600 from its creation on)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    temp.unlink(missing_ok=True)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"access_key_id": keys.access_key_id,
                   "secret_access_key": keys.secret_access_key}, handle)
    os.replace(temp, path)


def read_keys(path: Path) -> AccountKeys:
    """The keys in ``path``; a missing or unreadable file raises a ProviderError."""
    try:
        data = json.loads(path.read_text())
        return AccountKeys(str(data["access_key_id"]), str(data["secret_access_key"]))
    except FileNotFoundError:
        raise ProviderError(f"the simulated aws account's key file {path} does not exist: its "
                            "server is not running; run the command again (it starts one)"
                            ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProviderError(f"the simulated aws account's key file {path} cannot be read "
                            f"({exc}); stop the account (python -m flow_sdk.sim stop) and run "
                            "the command again") from exc


def remove_keys(path: Path, keys: AccountKeys) -> None:
    """Remove ``path`` when it still holds ``keys`` (a newer server's file stays)."""
    try:
        held = read_keys(path)
    except ProviderError:
        return
    if held == keys:
        path.unlink(missing_ok=True)


def enforce() -> None:
    """Turn moto's IAM access control on in this process (signatures checked, policies
    evaluated for every request), with the account's patches (``_arns``) and random secrets
    for the credentials of assumed roles."""
    from moto import settings
    from moto.iam.access_control import IAMPolicyStatement
    from moto.sts.models import STSBackend

    from flow_sdk.sim import _arns

    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # type: ignore[assignment]
    _arns.install()
    IAMPolicyStatement._check_principal = _principal_check(  # type: ignore[method-assign]
        IAMPolicyStatement._check_principal)
    STSBackend.assume_role = _random_secrets(STSBackend.assume_role)  # type: ignore[method-assign]


def create_account() -> AccountKeys:
    """The account's IAM user, its policy (everything) and its access key, made in this
    process's moto backends (so before the server answers anyone)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends

    iam = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
    iam.create_user(region_name="us-east-1", user_name=ADMIN_USER, path=ADMIN_PATH)
    iam.put_user_policy(ADMIN_USER, ADMIN_POLICY_NAME, json.dumps(ADMIN_POLICY))
    key = iam.create_access_key(ADMIN_USER)
    key.secret_access_key = secrets.token_urlsafe(30)  # 40 characters, from the OS
    return AccountKeys(key.access_key_id, key.secret_access_key)


def account_user_arn() -> str:
    from moto.core import DEFAULT_ACCOUNT_ID

    return f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:user/{ADMIN_USER}"


def _principal_check(original: Callable[[Any, str], bool]) -> Callable[[Any, str], bool]:
    """moto's trust-policy principal check, which handles only ``{"AWS": ...}`` principals,
    taught the one service principal flow's roles use: the account's own user plays EC2,
    which assumes an instance profile's role for the instance's metadata service."""

    def check(self: Any, principal: str) -> bool:
        expected = self._statement.get("Principal")
        if isinstance(expected, dict) and "AWS" not in expected:
            services = expected.get("Service", [])
            services = [services] if isinstance(services, str) else list(services)
            return EC2_SERVICE in services and principal == account_user_arn()
        return original(self, principal)

    return check


def _random_secrets(original: Callable[..., Any]) -> Callable[..., Any]:
    """moto's AssumeRole, with the secret key and session token drawn from the OS."""

    def assume_role(self: Any, *args: Any, **kwargs: Any) -> Any:
        role = original(self, *args, **kwargs)
        role.secret_access_key = secrets.token_urlsafe(30)
        role.access_key.secret_access_key = role.secret_access_key
        role.session_token = secrets.token_urlsafe(96)
        return role

    return assume_role


def _refuse(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = (b"refused: the simulated aws account serves the AWS APIs only, to callers "
            b"signed with its keys\n")
    start_response("403 Forbidden", [("Content-Type", "text/plain"),
                                     ("Content-Length", str(len(body)))])
    return [body]


def guarded_dispatcher() -> Any:
    """moto's request dispatcher, refusing unsigned requests, moto's admin API and its
    stand-in metadata service (whatever path or host a request names: the application it
    would reach decides)."""
    from moto.moto_server.threaded_moto_server import (
        DomainDispatcherApplication,
        create_backend_app,
    )

    class Guarded(DomainDispatcherApplication):
        def get_application(self, environ: dict[str, Any]) -> Any:
            if not environ.get("HTTP_AUTHORIZATION"):
                return _refuse  # unsigned: no client of the account (moto would fail on it)
            app = super().get_application(environ)
            if any(app is self.app_instances.get(name) for name in REFUSED_BACKENDS):
                return _refuse
            return app

    return Guarded(create_backend_app)
