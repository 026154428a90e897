"""One description of how a node starts (``NodeLaunch``), built once from a launch and
rendered by each provider: what it carries, what an agent is started with, and the backstop
each start-up layer takes from the runtime cap."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from flow_sdk.providers import sdkwheel
from flow_sdk.providers.base import LaunchRequest
from flow_sdk.providers.launch import ShippedWheel, node_launch
from flow_sdk.spec import build_task_spec
from flow_sdk.wire import BootConfig, envvars, runtimecap

BOOT = BootConfig("t-1", "local", {"root": "/x"}, secret="ab" * 32)
WHEEL = ShippedWheel("code/" + "0" * 64 + ".whl", "0" * 64, "flow_gang_sdk-1-py3-none-any.whl",
                     "3.99")


def _request(**options: object) -> LaunchRequest:
    return LaunchRequest("t-1", build_task_spec(app="a", name="f", **options), BOOT)


def test_a_launch_carries_what_a_node_needs_before_it_reads_the_task_record() -> None:
    launch = node_launch(_request(max_run_time_hours=2.0, boot_timeout_s=90), (WHEEL,))
    assert launch.module == "flow_sdk.node.agent" and launch.wheels == (WHEEL,)
    assert launch.python == "3.99"  # the wheels' (the caller's) Python
    assert (launch.boot_timeout_s, launch.max_run_time_hours) == (90, 2.0)
    assert node_launch(_request()).python == sdkwheel.python_version()  # no wheels: this one
    joining = node_launch(_request(max_run_time_hours=2.0), (WHEEL,), max_run_time_hours=0.5)
    assert joining.max_run_time_hours == 0.5  # a node that joins later gets what is left


def test_what_a_bootstrap_prepares_before_the_agent_comes_from_the_spec() -> None:
    launch = node_launch(_request(image="nvcr.io/nvidia/pytorch:24.01-py3", gpu="a10g:1",
                                  internode_interconnect="efa",
                                  volumes={"/ckpt": {"name": "c", "size_gb": 10}},
                                  mounts={"/data": "s3://bucket/prefix"}))
    assert (launch.image, launch.gpus, launch.interconnect) == (
        "nvcr.io/nvidia/pytorch:24.01-py3", True, "efa")
    assert launch.mount_paths == ("/ckpt", "/data")
    bare = node_launch(_request())
    assert (bare.image, bare.gpus, bare.interconnect, bare.mount_paths) == (None, False, None, ())


def test_the_secret_goes_to_the_boot_file_only() -> None:
    launch = node_launch(_request())
    assert BOOT.secret in launch.boot_text()
    assert launch.boot_without_secret().secret == "" and launch.boot.secret == BOOT.secret
    env = launch.agent_env("i-1", "10.0.0.7", Path("/n/boot.json"))
    assert env == {envvars.BOOT_FILE: "/n/boot.json", envvars.INSTANCE_ID: "i-1",
                   envvars.NODE_ADDRESS: "10.0.0.7"}


def test_each_layer_takes_its_backstop_from_the_cap_a_pool_node_has_none() -> None:
    launch = node_launch(_request(max_run_time_hours=1.0))
    assert launch.backstop(runtimecap.KEEPER, 1000.0) == 1000.0 + 3600 + 60
    assert launch.backstop(runtimecap.POWER_OFF, 1000.0) == 1000.0 + 3600 + 600
    assert node_launch(_request()).backstop(runtimecap.KEEPER, 1000.0) is None  # no cap
    pool = LaunchRequest("p-1", build_task_spec(app="a", name="f", max_run_time_hours=1.0),
                         replace(BOOT, role="pool"))
    assert node_launch(pool).module == "flow_sdk.node.pool"
    assert node_launch(pool).backstop(runtimecap.KEEPER, 1000.0) is None
