"""Cost caps on AWS (issue #5): the price cap, the priority's markets, and the runtime cap.

* a cap below every offer is refused at decoration, listing the cheapest offers, and nothing
  is created anywhere;
* a cap between the spot and the on-demand price with priority "med" launches spot with
  MaxPrice = the cap (as sent, as it reached moto, and as moto recorded it);
* low = spot only, high = on-demand only, med = spot then on-demand within the cap;
* max_run_time_hours: an OS shutdown timer is the first thing the user-data runs (run here
  with fake system commands), and shutting down terminates the instance.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from aws_moto_world import NODE_CODE, AwsWorld, Ec2Faults, Recorder, Wire, spec

from flow_sdk import FlowApp, ValidationError
from catalog_testing import cheapest_offers
from flow_sdk.catalog import OfferNotFoundError, find_offers
from flow_sdk.errors import CapacityError, ProviderError
from flow_sdk.wire import BootConfig
from flow_sdk.providers.aws import _userdata
from flow_sdk.providers.aws._launch import AttemptPlan, run_instances_request
from flow_sdk.providers.base import LaunchRequest
from flow_sdk.spec import TaskSpec


def request_for(world: AwsWorld, task_id: str, task_spec: TaskSpec) -> LaunchRequest:
    boot = BootConfig(task_id, "aws", world.config(), secret="0" * 64)
    return LaunchRequest(task_id, task_spec, boot)


def sent_markets(recorder: Recorder) -> list[str]:
    return [r.get("InstanceMarketOptions", {}).get("MarketType", "on-demand")
            for r in recorder.run_instances]


# c7i.xlarge in us-east-1 (the cheapest CPU type): spot $0.0731/h, on-demand $0.1785/h.
SPOT, ON_DEMAND, BETWEEN = 0.0731, 0.1785, 0.10


def test_catalog_prices_this_module_relies_on() -> None:
    cpu = find_offers(None, regions=["us-east-1"])
    assert (cpu[0].instance_type, cpu[0].market, cpu[0].usd_per_hour) == ("c7i.xlarge", "spot",
                                                                          SPOT)
    assert [o.usd_per_hour for o in cpu if o.instance_type == "c7i.xlarge"] == [SPOT, ON_DEMAND]


# -- a cap below every offer -----------------------------------------------------------------


def test_cap_below_the_cheapest_offer_is_refused_at_decoration_and_nothing_is_created(
        aws: AwsWorld, recorder: Recorder) -> None:
    app = FlowApp("caps", provider="aws", provider_config=aws.config())
    with pytest.raises(ValidationError) as caught:
        @app.function(num_instances=2, max_price_per_hour=0.05)  # CPU nodes
        def train() -> None:
            return None

    assert caught.value.fields == ["max_price_per_hour"]
    message = caught.value.problems[0].message
    cheapest = cheapest_offers(None, regions=["us-east-1"])
    assert len(cheapest) == 3
    for offer in cheapest:  # the three cheapest offers, each with its price
        assert str(offer) in message
    assert "raise max_price_per_hour to at least" in message

    # the provider refuses it on its own too, before any AWS call (launch and plan alike)
    provider = aws.provider(recorder)
    capped = spec(max_price_per_hour=0.05)
    with pytest.raises(ProviderError, match="no AWS offer") as launch_error:
        provider.launch(request_for(aws, "caps-1", capped))
    assert isinstance(launch_error.value.__cause__, OfferNotFoundError)
    assert launch_error.value.__cause__.cheapest == tuple(cheapest)
    with pytest.raises(ProviderError, match="cheapest"):
        provider.plan(capped)
    assert recorder.calls == []
    assert aws.created_anything() == []  # no instance, group, key, object, log group or role


# -- spot MaxPrice = the cap ---------------------------------------------------------------


def test_cap_between_spot_and_on_demand_with_med_asks_spot_at_the_cap(
        aws: AwsWorld, recorder: Recorder, ec2_wire: Wire) -> None:
    provider = aws.provider(recorder)
    capped = spec(num_instances=2, priority="med", max_price_per_hour=BETWEEN)
    plan = provider.plan(capped)
    assert (plan.instance_type, plan.market, plan.usd_per_hour) == ("c7i.xlarge", "spot", SPOT)
    started = provider.launch(request_for(aws, "caps-2", capped))

    [sent] = recorder.run_instances  # the request the provider built
    assert sent["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate",
        "MaxPrice": "0.1000"}}
    [wire] = ec2_wire.run_instances  # what reached moto over HTTP
    assert wire["InstanceMarketOptions.MarketType"] == "spot"
    assert wire["InstanceMarketOptions.SpotOptions.MaxPrice"] == "0.1000"
    assert {i.get("InstanceLifecycle") for i in aws.instances()} == {"spot"}  # moto's record
    # what cost tracking reads: the offer's spot price, not the cap
    assert {(i.market, i.usd_per_hour, i.instance_type) for i in started} == {
        ("spot", SPOT, "c7i.xlarge")}
    provider.terminate("caps-2")


# -- priority -> markets ---------------------------------------------------------------------


@pytest.mark.parametrize(("priority", "outcome"), [
    ("low", "fails"), ("med", "on-demand"), ("high", "on-demand")])
def test_priority_picks_the_markets_when_spot_has_no_capacity(
        aws: AwsWorld, recorder: Recorder, ec2_faults: Ec2Faults, priority: str,
        outcome: str) -> None:
    ec2_faults.capacity(market="spot")  # no spot capacity anywhere
    provider = aws.provider(recorder)
    task_spec = spec(num_instances=2, priority=priority, max_price_per_hour=1.0)
    if outcome == "fails":
        with pytest.raises(CapacityError, match="InsufficientInstanceCapacity"):
            provider.launch(request_for(aws, f"prio-{priority}", task_spec))
        assert aws.non_terminated() == []
    else:
        started = provider.launch(request_for(aws, f"prio-{priority}", task_spec))
        assert {i.market for i in started} == {"on-demand"}
        provider.terminate(f"prio-{priority}")
    markets = sent_markets(recorder)
    if priority == "low":  # spot only: every try spot, never on-demand
        assert markets and set(markets) == {"spot"}
    elif priority == "high":  # on-demand only: not one spot request
        assert markets == ["on-demand"]
    else:  # spot first, then on-demand (still within the cap)
        assert markets[-1] == "on-demand" and set(markets[:-1]) == {"spot"}
        assert len(markets) > 1


def test_med_does_not_fall_back_to_on_demand_above_the_cap(
        aws: AwsWorld, recorder: Recorder, ec2_faults: Ec2Faults) -> None:
    ec2_faults.capacity(market="spot")
    provider = aws.provider(recorder)
    with pytest.raises(CapacityError) as caught:
        provider.launch(request_for(aws, "caps-3", spec(priority="med",
                                                        max_price_per_hour=BETWEEN)))
    assert set(sent_markets(recorder)) == {"spot"}  # on-demand ($0.1785) is over the cap
    assert all(r["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == "0.1000"
               for r in recorder.run_instances)
    assert "Nothing was left running" in str(caught.value)
    assert aws.non_terminated() == []


# -- max_run_time_hours: the OS timer, first ---------------------------------------------------


def _render(max_run_time_hours: float | None) -> str:
    return _userdata.render(_userdata.BootstrapInputs(
        boot=BootConfig("t-1", "aws", {}), code=NODE_CODE,
        secret_parameter="/flow-sdk/0123456789abcdef/t-1", image=None, gpus=False,
        interconnect="ethernet", mount_paths=(), max_run_time_hours=max_run_time_hours))


def _commands(script: str) -> list[str]:
    """The script's lines that do something (no comments, blanks or line continuations)."""
    return [line.strip() for line in script.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _run_with_fake_system(tmp_path: Path, script: str, *, shutdown_fails: bool = False
                          ) -> list[str]:
    """Run the user-data as root would, with ``shutdown`` and ``curl`` replaced by fakes that
    log their arguments (curl fails, as with no metadata service); returns the log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    fail_arm = 'case "$2" in +*) exit 1;; esac\n' if shutdown_fails else ""
    fakes = {"shutdown": f'echo "shutdown $*" >> {log}\n{fail_arm}exit 0\n',
             "curl": f'echo "curl $*" >> {log}\nexit 22\n'}
    for name, body in fakes.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)
    (tmp_path / "user-data.sh").write_text(script)
    subprocess.run(["/bin/bash", str(tmp_path / "user-data.sh")], env={"PATH": str(bin_dir)},
                   capture_output=True, text=True, timeout=30, check=False)
    return log.read_text().splitlines()


def test_runtime_cap_is_an_os_timer_armed_first_and_the_node_terminates(
        tmp_path: Path) -> None:
    script = _render(1.0)
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                           check=False)
    assert check.returncode == 0, check.stderr
    commands = _commands(script)
    assert commands[0] == "FLOW_SHUTDOWN_MINUTES=70"  # 60 minutes + runtimecap.POWER_OFF's 10
    assert commands[1] == 'if [ "$FLOW_SHUTDOWN_MINUTES" -gt 0 ]; then'
    assert commands[2].startswith('shutdown -h "+${FLOW_SHUTDOWN_MINUTES}"')
    for later in ("set -euo pipefail", "trap finish EXIT", "curl", "pip install",
                  "docker", "_bootlog"):  # everything else comes after it
        assert min(n for n, c in enumerate(commands) if later in c) > 2, later
    # run it: the timer is the very first thing it does; then it fails to reach IMDS (no
    # metadata service here), and the exit trap powers the node off at once
    calls = _run_with_fake_system(tmp_path, script)
    assert calls[0] == "shutdown -h +70 flow: max_run_time_hours reached"
    assert calls[1].startswith("curl ") and "latest/api/token" in calls[1]
    assert calls[-1] == "shutdown -h now"

    # ... and shutting down terminates the instance, so nothing outlives the cap
    task_spec = spec(max_run_time_hours=1.0, priority="high")
    offer = find_offers(None, regions=["us-east-1"], markets=["on-demand"])[0]
    request = run_instances_request(AttemptPlan(
        task_id="t-1", spec=task_spec, offer=offer, zone="us-east-1a", subnet_id="subnet-1",
        security_group="sg-1", ami_id="ami-1", root_device="/dev/sda1", key_name=None,
        instance_profile="p", user_data=script, attempt=1, store_tag="s3://b/", efa=False,
        placement_group=None))
    assert request["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert request["UserData"] == script and "KeyName" not in request


def test_a_node_that_cannot_arm_the_timer_powers_off_before_anything_else(
        tmp_path: Path) -> None:
    calls = _run_with_fake_system(tmp_path, _render(2.5), shutdown_fails=True)
    assert calls == ["shutdown -h +160 flow: max_run_time_hours reached", "shutdown -h now"]


def test_without_a_runtime_cap_no_timer_is_armed(tmp_path: Path) -> None:
    script = _render(None)
    assert _commands(script)[0] == "FLOW_SHUTDOWN_MINUTES=0"
    calls = _run_with_fake_system(tmp_path, script)
    assert not any("+" in c for c in calls if c.startswith("shutdown"))
    assert calls[-1] == "shutdown -h now"  # the node still powers off when the agent ends
