"""``aws-sim``: the ``aws`` provider against a simulated account on this machine.

No credentials and no provider_config are needed: the provider brings the account up itself,
a moto server on 127.0.0.1 shared by every command of one flow data directory (``_server``),
which refuses whoever lacks the account's keys (``_access``: a 0600 file beside the server's
record, read by the provider's own boto3 session only; the caller's environment is left as
it is); ``endpoint_url`` names an AWS API that already runs instead, reached with dummy keys.
On a node, the provider uses the node's own credentials: its role's, from its instance
metadata service.
Instances boot through the real bootstrap as simulated instances: the aws provider is handed
this package's node runtime (``_nodes.SimulatedNodes``), under ``$FLOW_HOME/aws-sim/cloud``
by default, from an AMI registered in the simulated account whose image Python is the
caller's.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import boto3

from flow_sdk.providers import sdkwheel
from flow_sdk._config import flow_home
from flow_sdk.aws_clients import make_client
from flow_sdk.errors import FieldProblem, ProviderError, ServiceNotRunningError
from flow_sdk.system import procs
from flow_sdk.providers.aws import AwsConfig, AwsProvider
from flow_sdk.providers.base import SshEndpoint
from flow_sdk.providers.gcreport import GcReport
from flow_sdk.sim._access import KEYS_FILE, AccountKeys, read_keys
from flow_sdk.sim._inventory import SimGcReport, holdings
from flow_sdk.sim._nodes import SimulatedNodes
from flow_sdk.sim._server import (
    CLOUD_DIR,
    INSTALL_HINT,
    ensure_server,
    running_server,
    stop_server,
)
from flow_sdk.sim._settings import NODE_KEY, NodeSettings, SimSettings
from flow_sdk.spec import TaskSpec

HOME_DIR = "aws-sim"  # under $FLOW_HOME: the server's record, keys, lock and log, the cloud
# The keys of an AWS API named by endpoint_url, which checks none (a test's moto server).
DUMMY_KEY = "testing"


def sim_home() -> Path:
    """Where the simulated account of this flow data directory lives."""
    return flow_home() / HOME_DIR


def account_session(region: str, keys: AccountKeys | None) -> boto3.session.Session:
    """A session with the account's keys (dummy ones for an API that checks none)."""
    if keys is None:
        return boto3.session.Session(aws_access_key_id=DUMMY_KEY,
                                     aws_secret_access_key=DUMMY_KEY, region_name=region)
    return boto3.session.Session(aws_access_key_id=keys.access_key_id,
                                 aws_secret_access_key=keys.secret_access_key,
                                 region_name=region)


def image_python(python: str) -> str:
    """The ``major.minor`` of the simulated image's interpreter."""
    if python == sys.executable:
        return sdkwheel.python_version()
    try:
        answer = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ProviderError(f"provider_config.python {python!r} does not run ({exc}); name a "
                            "python3 interpreter") from exc
    return answer.stdout.strip()


def image_id(session: boto3.session.Session, url: str, region: str, python: str) -> str:
    """The simulated account's image for ``python`` (registered on first use)."""
    name = f"flow-sim-python-{python}"
    ec2 = make_client("ec2", region, endpoint_url=url, session=session)
    found = ec2.describe_images(Owners=["self"],
                                Filters=[{"Name": "name", "Values": [name]}])["Images"]
    if found:
        return str(found[0]["ImageId"])
    return str(ec2.register_image(
        Name=name, Description=f"simulated image: Python {python}",
        Architecture="x86_64", RootDeviceName="/dev/sda1",
        VirtualizationType="hvm")["ImageId"])


def aws_config(settings: SimSettings, nodes: NodeSettings, session: boto3.session.Session,
               url: str) -> AwsConfig:
    """The aws provider_config of the simulated account at ``url``: SSH from loopback, and
    an image that runs the nodes' Python; any aws key the settings give wins."""
    given = dict(settings.aws)
    python = given.get("image_python") or image_python(nodes.python)
    config = {"region": settings.region, "ssh_cidr": "127.0.0.1/32", "image_python": python,
              **given, "endpoint_url": url}
    if "ami_id" not in given and "ami_ssm_parameter" not in given:
        config["ami_id"] = image_id(session, url, settings.region, python)
    return AwsConfig.from_mapping(config)


class AwsSimProvider(AwsProvider):
    """The ``aws`` provider on a simulated account (module docstring), its nodes played by
    ``SimulatedNodes``.

    ``config()`` is the aws-sim settings, so a task record, ``flow gc`` and ``Task.from_id``
    rebuild it against the same account; the nodes boot with the aws config of their launch
    (it carries ``launch``) plus the node settings under ``sim``, and rebuild from that."""

    name: ClassVar[str] = "aws-sim"

    def __init__(self, config: AwsConfig, settings: SimSettings | None, nodes: NodeSettings, *,
                 session: boto3.session.Session) -> None:
        self.sim = SimulatedNodes(nodes, config.endpoint_url)
        super().__init__(config, session=session, runtime=self.sim)
        self.settings = settings

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *,
                    session: boto3.session.Session | None = None) -> AwsSimProvider:
        if "launch" in config:  # a node's config, written by its launch: its own credentials
            given = dict(config)
            nodes = NodeSettings.from_mapping(given.pop(NODE_KEY, None),
                                              f"provider_config.{NODE_KEY}")
            aws = AwsConfig.from_mapping(given)
            return cls(aws, None, nodes, session=session)
        settings = SimSettings.from_mapping(config)
        url = settings.aws.get("endpoint_url")
        if not url:  # this flow directory's own account: started when it does not run
            url = ensure_server(sim_home(), settings.idle_stop_s).url
        return cls._with_account(settings, url, session=session)

    @classmethod
    def attach(cls, config: Mapping[str, Any]) -> AwsSimProvider:
        """The provider for reading what runs: this flow directory's own account is used only
        while its server runs (a stopped account kept nothing: moto holds its state in
        memory), never started."""
        if "launch" in config:
            return cls.from_config(config)
        settings = SimSettings.from_mapping(config)
        url = settings.aws.get("endpoint_url")
        if not url:
            state = running_server(sim_home())
            if state is None:
                raise ServiceNotRunningError(
                    "the simulated aws account of this flow directory is not running (it "
                    "stopped after its idle time, or `python -m flow_sdk.sim stop` stopped "
                    "it); its tasks and their records went with it, and nothing was started")
            url = state.url
        return cls._with_account(settings, url)

    @classmethod
    def _with_account(cls, settings: SimSettings, url: str, *,
                      session: boto3.session.Session | None = None) -> AwsSimProvider:
        nodes = settings.node_settings(str(sim_home() / CLOUD_DIR))
        if not settings.aws.get("endpoint_url"):
            home: Path | None = sim_home()  # this flow directory's own account
        else:  # a given API: a simulated account's (its home named), or one with no keys
            home = Path(settings.account_home) if settings.account_home else None
        keys = None
        if home is not None:  # an account's own server: its keys
            keys_file = home / KEYS_FILE
            keys = read_keys(keys_file)
            nodes = dataclasses.replace(nodes, keys_file=str(keys_file))
        session = session or account_session(settings.region, keys)
        return cls(aws_config(settings, nodes, session, url), settings, nodes, session=session)

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        """The aws checks; Linux and root (each node's boot runs as root in a mount namespace
        of its own); the AWS CLI the nodes' bootstrap runs from the image's bin directory."""
        problems = super().check(spec)
        if not sys.platform.startswith("linux") or os.geteuid() != 0:
            problems.append(FieldProblem("provider", "the simulated aws cloud runs each node's "
                                         "boot script as root in a mount namespace of its own: "
                                         "run it as root on Linux (a CI container, for "
                                         "instance)"))
        bin_dir = str(Path(self.sim.settings.python).parent)
        if shutil.which("aws", path=bin_dir) is None:
            problems.append(FieldProblem("provider", (
                f"the simulated nodes run the AWS CLI from {bin_dir}, and it is not installed "
                f"there; {INSTALL_HINT}")))
        return problems

    def rendezvous_ports(self) -> tuple[int, int]:
        """Simulated nodes share this machine's port space: free ports per task."""
        return procs.free_port(), procs.free_port()

    def metadata_endpoint(self) -> str | None:
        return None  # simulated nodes have no metadata service unless imds_endpoint names one

    def ssh_endpoint(self, task_id: str, instance_id: str) -> SshEndpoint:
        raise ProviderError(f"node {instance_id} of task {task_id} is a simulated instance: "
                            f"the {self.name} provider runs no sshd; read its output with "
                            "`flow logs`, or use provider='local' to reach nodes over SSH")

    def config(self) -> dict[str, Any]:
        if self.settings is not None:
            return self.settings.to_dict()
        return {**super().config(), **self.sim.node_config()}

    def gc(self, *, dry_run: bool = False, ended: Mapping[str, str] | None = None
           ) -> GcReport:
        """The aws gc, and what the simulated account still holds after it."""
        report = super().gc(dry_run=dry_run, ended=ended)
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
    SimulatedNodes(NodeSettings(str(home / CLOUD_DIR)), None).stop_all()
    return stop_server(home)
