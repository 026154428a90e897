"""``aws-sim``: the ``aws`` provider against a simulated account on this machine.

No credentials and no provider_config are needed: the provider brings the account up itself,
a moto server on 127.0.0.1 shared by every command of one flow data directory (``_server``),
reached with dummy credentials that only its own boto3 session carries (the caller's
environment is left as it is). Instances boot through the real bootstrap as simulated
instances (the aws provider's ``simulate`` runtime) under ``$FLOW_HOME/aws-sim/cloud``, from
an AMI registered in the simulated account whose image Python is the caller's.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import boto3

from flow_sdk import sdkwheel
from flow_sdk._config import flow_home
from flow_sdk.aws_clients import REGION_RE, make_client
from flow_sdk.errors import FieldProblem, ProviderError
from flow_sdk.providers.aws import AwsConfig, AwsProvider
from flow_sdk.providers.aws._simulate import SimulateConfig, SimulatedNodes, parse_simulate
from flow_sdk.providers.base import GcReport
from flow_sdk.sim._inventory import SimGcReport, holdings
from flow_sdk.sim._server import CLOUD_DIR, INSTALL_HINT, ensure_server, stop_server
from flow_sdk.spec import TaskSpec

HOME_DIR = "aws-sim"  # under $FLOW_HOME: the server's record, lock and log, and the cloud
DEFAULT_REGION = "us-east-1"
DEFAULT_IDLE_STOP_S = 600.0
# The simulated account's credentials: moto takes any; only this provider's session has them.
DUMMY_KEY = "testing"
KNOWN_KEYS = ("boot_delay_s", "idle_stop_s", "minute_s", "region", "wheelhouse")


def sim_home() -> Path:
    """Where the simulated account of this flow data directory lives."""
    return flow_home() / HOME_DIR


@dataclass(frozen=True)
class SimSettings:
    """The ``aws-sim`` provider_config (every key optional)."""

    region: str = DEFAULT_REGION
    # The server stops itself after this long with no request and no running instance.
    idle_stop_s: float = DEFAULT_IDLE_STOP_S
    minute_s: float = 60.0  # one minute of a node's power-off timer, in seconds
    boot_delay_s: tuple[float, ...] = ()  # the i-th instance of a launch boots this late
    wheelhouse: str | None = None  # wheels the nodes may install besides the SDK's

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> SimSettings:
        unknown = sorted(set(config) - set(KNOWN_KEYS))
        if unknown:
            raise ProviderError(f"provider_config has unknown key(s) {unknown} for the aws-sim "
                                f"provider; known keys: {', '.join(KNOWN_KEYS)}")
        region = config.get("region") or DEFAULT_REGION
        if not isinstance(region, str) or not REGION_RE.match(region):
            raise ProviderError(f"provider_config.region {region!r} is not an AWS region name "
                                "such as 'us-east-1'")
        idle = config.get("idle_stop_s", DEFAULT_IDLE_STOP_S)
        if isinstance(idle, bool) or not isinstance(idle, (int, float)) or idle <= 0:
            raise ProviderError(f"provider_config.idle_stop_s {idle!r} must be a positive "
                                "number of seconds after which the idle simulated account's "
                                f"server stops (default {DEFAULT_IDLE_STOP_S:g})")
        runtime = {k: config[k] for k in ("minute_s", "boot_delay_s", "wheelhouse")
                   if config.get(k) is not None}
        try:
            checked = parse_simulate({"root": "/", **runtime})
        except ProviderError as exc:  # its messages name the aws provider's nesting
            raise ProviderError(str(exc).replace("provider_config.simulate.",
                                                 "provider_config.")) from None
        return cls(region=region, idle_stop_s=float(idle), minute_s=checked.minute_s,
                   boot_delay_s=checked.boot_delay_s, wheelhouse=checked.wheelhouse)

    def to_dict(self) -> dict[str, Any]:
        return {"region": self.region, "idle_stop_s": self.idle_stop_s,
                "minute_s": self.minute_s, "boot_delay_s": list(self.boot_delay_s),
                "wheelhouse": self.wheelhouse}


def dummy_session(region: str) -> boto3.session.Session:
    return boto3.session.Session(aws_access_key_id=DUMMY_KEY, aws_secret_access_key=DUMMY_KEY,
                                 region_name=region)


def image_id(session: boto3.session.Session, url: str, region: str) -> str:
    """The simulated account's image for the caller's Python (registered on first use)."""
    python = sdkwheel.python_version()
    name = f"flow-sim-python-{python}"
    ec2 = make_client("ec2", region, endpoint_url=url, session=session)
    found = ec2.describe_images(Owners=["self"],
                                Filters=[{"Name": "name", "Values": [name]}])["Images"]
    if found:
        return str(found[0]["ImageId"])
    return str(ec2.register_image(
        Name=name, Description=f"simulated image: this machine's Python {python}",
        Architecture="x86_64", RootDeviceName="/dev/sda1",
        VirtualizationType="hvm")["ImageId"])


class AwsSimProvider(AwsProvider):
    """The ``aws`` provider on a simulated account that it starts itself (module docstring).

    ``config()`` is the aws-sim settings, so a task record, ``flow gc`` and ``Task.from_id``
    rebuild it against this flow data directory's account; the nodes boot with the aws
    config of their launch (it carries ``launch``) and rebuild from that."""

    name: ClassVar[str] = "aws-sim"

    def __init__(self, config: AwsConfig, settings: SimSettings | None, *,
                 session: boto3.session.Session) -> None:
        super().__init__(config, session=session)
        self.settings = settings

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *,
                    session: boto3.session.Session | None = None) -> AwsSimProvider:
        if "launch" in config:  # a node's config, written by its launch
            aws = AwsConfig.from_mapping(config)
            return cls(aws, None, session=session or dummy_session(aws.region))
        settings = SimSettings.from_mapping(config)
        home = sim_home()
        server = ensure_server(home, settings.idle_stop_s)
        session = session or dummy_session(settings.region)
        aws = AwsConfig.from_mapping({
            "region": settings.region, "endpoint_url": server.url,
            "ssh_cidr": "127.0.0.1/32", "ami_id": image_id(session, server.url, settings.region),
            "image_python": sdkwheel.python_version(),
            "simulate": {"root": str(home / CLOUD_DIR), "minute_s": settings.minute_s,
                         "boot_delay_s": list(settings.boot_delay_s),
                         "wheelhouse": settings.wheelhouse}})
        return cls(aws, settings, session=session)

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        """The aws checks, and the AWS CLI the nodes' bootstrap runs from the image's (this
        interpreter's) bin directory."""
        problems = super().check(spec)
        simulate = self.cfg.simulate
        bin_dir = str(Path(simulate.python).parent) if simulate is not None else ""
        if simulate is not None and shutil.which("aws", path=bin_dir) is None:
            problems.append(FieldProblem("provider", (
                f"the simulated nodes run the AWS CLI from {bin_dir}, and it is not installed "
                f"there; {INSTALL_HINT}")))
        return problems

    def config(self) -> dict[str, Any]:
        return self.settings.to_dict() if self.settings is not None else super().config()

    def gc(self, *, dry_run: bool = False) -> GcReport:
        """The aws gc, and what the simulated account still holds after it."""
        report = super().gc(dry_run=dry_run)
        return SimGcReport(**{**vars(report), "provider": self.name},
                           holds=holdings(self.clients, self.cfg.region))

    def stop_server(self) -> int | None:
        """``stop_account()``: every simulated instance, then the server."""
        return stop_account()


def stop_account(home: Path | None = None) -> int | None:
    """Stop every simulated instance of the account (by pid), then its server (by its pid);
    returns the server's pid, or None when none was running. The account's state goes with
    the server: the next command starts an empty one."""
    home = home or sim_home()
    SimulatedNodes(SimulateConfig(str(home / CLOUD_DIR)), None).stop_all()
    return stop_server(home)
