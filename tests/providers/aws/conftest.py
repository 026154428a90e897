"""Fixtures for the aws provider tests: a real moto server over HTTP on 127.0.0.1 (one per
session, reset per test), fake credentials, no network beyond loopback, and fault injection in
moto's EC2 backend. What moto 5.2.1 lacks is filled in test-side only (see aws_moto_world)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import botocore.loaders
import botocore.session
import pytest
from aws_moto_world import (
    S3_RESPONDERS,
    AwsWorld,
    Ec2Faults,
    Recorder,
    S3Wire,
    Wire,
    faulty_run_instances,
    fresh_world,
    loopback_only,
    moto_gaps,
    s3_recording,
    wire_recording,
)
from flow_testing import moto_server
from moto.ec2.models.instances import InstanceBackend
from moto.ec2.responses import EC2Response
from moto.s3.responses import S3Response



@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process may open connections to 127.0.0.0/8 only."""
    monkeypatch.setattr(socket.socket, "connect", loopback_only)


@pytest.fixture(scope="session", autouse=True)
def _one_botocore_loader() -> Iterator[None]:
    """Every boto3 session in this process shares one botocore data loader, so each service
    model (EC2's is large) is parsed once per test run rather than once per provider. Speed
    only: the clients are built exactly as before."""
    original = botocore.session.create_loader
    loaders: dict[str | None, botocore.loaders.Loader] = {}

    def shared(search_path_string: str | None = None) -> botocore.loaders.Loader:
        if search_path_string not in loaders:
            loaders[search_path_string] = original(search_path_string)
        return loaders[search_path_string]

    botocore.session.create_loader = shared
    yield
    botocore.session.create_loader = original


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture(scope="session", autouse=True)
def _moto_gaps() -> Iterator[None]:
    with moto_gaps():
        yield


@pytest.fixture(autouse=True)
def aws(moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsWorld]:
    """A fresh moto world with fake credentials in this process's environment."""
    world = fresh_world(moto_url, tmp_path, monkeypatch)
    yield world
    world.stop_simulated()  # a failed simulated test stops its nodes too


@pytest.fixture()
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture()
def ec2_faults(monkeypatch: pytest.MonkeyPatch) -> Ec2Faults:
    faults = Ec2Faults()
    monkeypatch.setattr(InstanceBackend, "run_instances", faulty_run_instances(faults))
    return faults


@pytest.fixture()
def ec2_wire(monkeypatch: pytest.MonkeyPatch) -> Wire:
    """RunInstances requests as they reached moto (from this process or a simulated node)."""
    wire = Wire()
    monkeypatch.setattr(EC2Response, "run_instances", wire_recording(wire))
    return wire


@pytest.fixture()
def s3_wire(monkeypatch: pytest.MonkeyPatch) -> S3Wire:
    """S3 requests as they reached moto (from this process or a simulated node)."""
    wire = S3Wire()
    for name in S3_RESPONDERS:
        monkeypatch.setattr(S3Response, name, s3_recording(wire, getattr(S3Response, name)))
    return wire
