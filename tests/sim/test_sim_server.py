"""The simulated account's server: one per flow data directory, reused while it runs,
stopped by its pid, and stopping itself when idle; aws-sim settings are checked before
anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flow_testing import wait_until

from flow_sdk.errors import ProviderError
from flow_sdk.providers import get_provider
from flow_sdk.system.procs import is_alive
from flow_sdk.sim import AwsSimProvider, sim_home
from flow_sdk.sim._server import ServerState, ensure_server, read_state
from flow_sdk.spec import build_task_spec


def _kill(state: ServerState | None) -> None:
    if state is not None and state.alive():
        os.kill(state.pid, 15)
        wait_until(lambda: not state.alive(), 15, f"server {state.pid} to stop")


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh flow data directory, with no AWS settings in this process's environment; any
    server left running by the test is stopped by its pid."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("FLOW_HOME", str(tmp_path / "flow"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    yield sim_home()
    _kill(read_state(sim_home()))


def test_bad_settings_are_refused_with_the_known_keys_before_anything_starts(home: Path) -> None:
    with pytest.raises(ProviderError) as refused:
        get_provider("aws-sim", {"simulate": {"root": "/tmp"}})
    assert "['simulate']" in str(refused.value)
    assert "known keys: account_home, ami_id, ami_ssm_parameter, boot_delay_s, bucket," in str(
        refused.value)
    assert "idle_stop_s, image_python," in str(refused.value)
    assert ", minute_s, object_expiry_days, prefix, python, region, regions, root," in str(
        refused.value)
    for bad, named in (({"idle_stop_s": 0}, "idle_stop_s"), ({"idle_stop_s": True}, "idle_stop_s"),
                       ({"minute_s": -1}, "provider_config.minute_s"),
                       ({"boot_delay_s": "60"}, "provider_config.boot_delay_s"),
                       ({"region": "moon-1"}, "provider_config.region")):
        with pytest.raises(ProviderError, match=named):
            get_provider("aws-sim", bad)
    assert read_state(home) is None and not home.exists()


def test_one_server_per_home_reused_and_its_keys_stay_in_the_provider(
        home: Path) -> None:
    first = get_provider("aws-sim")
    assert isinstance(first, AwsSimProvider)
    state = read_state(home)
    assert state is not None and state.alive()
    assert first.cfg.endpoint_url == state.url
    again = get_provider("aws-sim", first.config())
    assert read_state(home) == state  # reused, not restarted
    assert again.cfg.ami_id == first.cfg.ami_id  # one image per Python, registered once
    assert not [k for k in os.environ if k.startswith("AWS_ACCESS") or k == "AWS_ENDPOINT_URL"]
    assert Path(first.sim.settings.root) == home / "cloud"
    assert first.gc(dry_run=True).holds == []  # type: ignore[attr-defined]
    ec2 = first.clients.get("ec2", "us-east-1")
    ec2.create_key_pair(KeyName="left-behind")
    ec2.create_placement_group(GroupName="left-behind-pg", Strategy="cluster")
    report = first.gc(dry_run=True)
    assert report.holds == ["us-east-1 key pair left-behind",  # type: ignore[attr-defined]
                            "us-east-1 placement group left-behind-pg"]
    assert "the simulated account holds 2 resource(s):" in str(report)
    os.kill(state.pid, 15)
    wait_until(lambda: not state.alive(), 15, "the server to stop on SIGTERM")
    assert read_state(home) is None  # it removes its own record
    third = get_provider("aws-sim")
    fresh = read_state(home)
    assert fresh is not None and fresh.pid != state.pid and third.cfg.endpoint_url == fresh.url


def test_the_account_holds_no_public_image_only_its_own(home: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the tests' one image (``MOTO_AMIS_PATH``), as a user runs it: the account
    loads none of moto's public images, and its nodes' image is the one it registered."""
    monkeypatch.delenv("MOTO_AMIS_PATH", raising=False)
    provider = get_provider("aws-sim")
    assert isinstance(provider, AwsSimProvider)
    ec2 = provider.clients.get("ec2", "us-east-1")
    assert ec2.describe_images(Owners=["amazon"])["Images"] == []
    own = ec2.describe_images(Owners=["self"])["Images"]
    assert [image["ImageId"] for image in own] == [provider.cfg.ami_id]


def test_moto_services_are_listed_once_and_the_same() -> None:
    from moto import backends

    from flow_sdk.sim._gaps import list_services_once

    listed = tuple(backends.list_of_moto_modules())
    list_services_once()
    list_services_once()  # a second call keeps the first list
    assert backends.list_of_moto_modules() == listed and "ec2" in listed
    backends.list_of_moto_modules()
    assert backends.list_of_moto_modules.cache_info().misses == 1  # listed once, then kept


def test_the_server_stops_itself_when_idle(home: Path) -> None:
    state = ensure_server(home, idle_stop_s=1.0)
    started = time.monotonic()
    try:
        wait_until(lambda: not state.alive(), 20, "the idle server to stop itself")
    finally:
        _kill(state)
    assert time.monotonic() - started >= 0.9
    assert read_state(home) is None


def test_python_m_flow_sdk_sim_stop_stops_the_server(home: Path) -> None:
    state = ensure_server(home, idle_stop_s=600)
    try:
        status = subprocess.run([sys.executable, "-m", "flow_sdk.sim", "status"],
                                capture_output=True, text=True, timeout=60, check=True)
        assert f"{state.url} (pid {state.pid}" in status.stdout
        stop = subprocess.run([sys.executable, "-m", "flow_sdk.sim", "stop"],
                              capture_output=True, text=True, timeout=60, check=True)
        assert f"(pid {state.pid})" in stop.stdout
        assert not is_alive(state.pid, state.ticks) and read_state(home) is None
    finally:
        _kill(state)


def test_a_launch_is_refused_when_the_image_has_no_aws_cli(home: Path, tmp_path: Path) -> None:
    provider = get_provider("aws-sim")
    assert isinstance(provider, AwsSimProvider)
    spec = build_task_spec(app="sim", name="sim", provider="aws-sim", num_instances=2)
    assert provider.check(spec) == []
    bare = tmp_path / "bare-image" / "bin"
    bare.mkdir(parents=True)
    (bare / "python3").symlink_to(sys.executable)  # the image's Python, without the AWS CLI
    without_cli = AwsSimProvider.from_config({"python": str(bare / "python3")})
    problems = without_cli.check(spec)
    assert [(p.field, p.message) for p in problems] == [(
        "provider", f"the simulated nodes run the AWS CLI from {bare}, and it is not installed "
        "there; the simulated cloud needs moto[server], awscli: pip install 'moto[server]' "
        "awscli")]
