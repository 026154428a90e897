"""The bootstrap's code install, Python check and boot-log shipping, run for real as bash.

Each test cuts one function out of the rendered user-data and runs it with bash against local
files, with fakes only for what cannot run here (the AWS CLI)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

from aws_moto_world import NODE_CODE

from flow_sdk.providers import sdkwheel
from flow_sdk.providers.aws import _userdata
from flow_sdk.wire import BootConfig
from flow_sdk.system.procs import pids_with_env, stop_pids


def _script(**code: str) -> str:
    return _userdata.render(_userdata.BootstrapInputs(
        boot=BootConfig("t-1", "aws", {}), code=dataclasses.replace(NODE_CODE, **code),
        secret_parameter="/flow-sdk/0123456789abcdef/t-1",
        image=None, gpus=False, interconnect="ethernet", mount_paths=(),
        max_run_time_hours=None))


def _function(script: str, name: str) -> str:
    """The definition of shell function ``name`` in ``script``."""
    match = re.search(rf"^{name}\(\) {{.*?^}}$", script, re.MULTILINE | re.DOTALL)
    assert match is not None, name
    return match.group(0)


def _assignments(script: str) -> str:
    return script[script.index("FLOW_BOOT_JSON="):script.index("FLOW_WORKDIR=")]


def _bash(script: str, body: str, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", "-c", f"set -euo pipefail\n{body}"], text=True,
                          capture_output=True, check=False, timeout=60, env=env)


def test_the_digest_check_refuses_a_tampered_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "flow_gang_sdk-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"the caller's code")
    script = _script(sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())
    check = _assignments(script) + _function(script, "flow_verify_code")
    good = _bash(script, f"{check}\nflow_verify_code {wheel}\necho installed")
    assert good.returncode == 0 and good.stdout == "installed\n", good.stderr

    wheel.write_bytes(b"the caller's code, altered")  # same name, other bytes
    bad = _bash(script, f"{check}\nflow_verify_code {wheel}\necho installed")
    assert bad.returncode == 1 and "installed" not in bad.stdout
    actual = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert f"it has {actual}" in bad.stderr and "nothing was installed" in bad.stderr


def test_the_bootstrap_fetches_checks_then_installs_the_named_wheel() -> None:
    script = _script()
    fetch = script.index("aws s3api get-object")
    verify = script.index('flow_verify_code "$wheel"')
    install = script.index('--python "${env_dir}/bin/python" install --quiet "$wheel"')
    assert fetch < verify < install
    assert "FLOW_CODE_URL=s3://flow-test-bucket/flow/code/" + "ab" * 32 + ".whl" in script
    assert "FLOW_CODE_SHA256=" + "ab" * 32 in script
    installs = [line for line in script.splitlines()
                if re.search(r"\bpip\b.*\binstall\b", line) and not line.lstrip().startswith("#")]
    assert len(installs) == 2  # the wheel, on the image or in the task's container; nothing by name
    assert all('"$wheel"' in line or "$FLOW_CODE_FILE" in line for line in installs)


def test_a_node_python_of_another_minor_is_refused() -> None:
    mine = sdkwheel.python_version()
    other = _script(python="3.99")
    check = _assignments(other) + _function(other, "flow_same_python")
    refused = _bash(other, f"{check}\nflow_same_python {sys.executable}\necho ran")
    assert refused.returncode == 1 and "ran" not in refused.stdout
    assert f"runs Python {mine}, but the caller runs Python 3.99" in refused.stderr
    same = _script(python=mine)
    ok = _bash(same, _assignments(same) + _function(same, "flow_same_python")
               + f"\nflow_same_python {sys.executable}\necho ran")
    assert ok.returncode == 0 and ok.stdout == "ran\n", ok.stderr


def _shipping(tmp_path: Path) -> tuple[str, Path, Path]:
    """The boot-log functions with the state directory under ``tmp_path`` and a fake ``aws``
    that records its arguments and the events it was given."""
    script = _script()
    state = tmp_path / "state"
    state.mkdir()
    calls = tmp_path / "aws-calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "aws"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {calls}\n'
                    'for a in "$@"; do case "$a" in file://*) cat "${a#file://}" >> '
                    f'{calls}.events; echo >> {calls}.events;; esac; done\n')
    fake.chmod(0o755)
    body = (_assignments(script) + f"FLOW_STATE={state}\nFLOW_BOOT_LOG={state}/boot.log\n"
            + "FLOW_INSTANCE_ID=i-0abc\n" + _function(script, "flow_boot_events") + "\n"
            + _function(script, "flow_ship_boot_log") + "\n")
    return body, state, bin_dir


def test_boot_output_is_shipped_to_the_boot_stream_once_and_in_order(tmp_path: Path) -> None:
    body, state, bin_dir = _shipping(tmp_path)
    (state / "boot.log").write_text("1700000000000001 pip: no matching distribution\n"
                                    "1700000000500000 \n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    first = _bash("", body + "flow_ship_boot_log", env)
    assert first.returncode == 0, first.stderr
    with (state / "boot.log").open("a") as log:
        log.write("1700000001000000 flow bootstrap: finished with exit code 1; powering off\n")
    again = _bash("", body + "flow_ship_boot_log", env)
    assert again.returncode == 0, again.stderr

    calls = (tmp_path / "aws-calls").read_text().splitlines()
    puts = [c for c in calls if " put-log-events " in c]
    assert len(puts) == 2
    assert all("--log-group-name /flow/t-1 --log-stream-name boot.i-0abc" in c for c in puts)
    assert all("--region us-east-1" in c for c in calls)
    batches = [json.loads(b) for b in
               (tmp_path / "aws-calls.events").read_text().split("\n") if b.strip()]
    assert batches == [
        [{"timestamp": 1700000000000, "message": "pip: no matching distribution"},
         {"timestamp": 1700000000500, "message": " "}],  # CloudWatch refuses empty lines
        [{"timestamp": 1700000001000,
          "message": "flow bootstrap: finished with exit code 1; powering off"}]]


def test_a_node_that_never_learned_its_id_ships_nothing(tmp_path: Path) -> None:
    body, state, bin_dir = _shipping(tmp_path)
    (state / "boot.log").write_text("1700000000000001 curl: (7) no metadata service\n")
    done = _bash("", body.replace("FLOW_INSTANCE_ID=i-0abc\n", "")
                 + "flow_ship_boot_log; echo done", {"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout == "done\n"
    assert not (tmp_path / "aws-calls").exists()


def _boot(tmp_path: Path, wheel: bytes, **code: str) -> tuple[list[str], list[dict[str, object]]]:
    """Run the whole rendered user-data as a node would, its state directories moved under
    ``tmp_path`` and fakes for IMDS (curl), the AWS CLI (the store holds ``wheel``; log events
    are recorded) and shutdown. Returns the calls the fakes saw and the boot events shipped."""
    script = _script(**code)
    state, opt = tmp_path / "state", tmp_path / "opt"
    script = script.replace("/var/lib/flow", str(state)).replace("/opt/flow", str(opt))
    stored = tmp_path / "stored.whl"
    stored.write_bytes(wheel)
    calls, events = tmp_path / "calls", tmp_path / "events"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {
        "curl": 'case "$*" in *api/token*) echo tok;; *instance-id*) echo i-0abc;;\n'
                '  *local-ipv4*) echo 127.0.0.1;; *placement/region*) echo us-east-1;;\n'
                '  *) exit 22;; esac\n',
        "aws": f'echo "aws $*" >> {calls}\n'
               f'if [ "$1 $2" = "s3api get-object" ]; then cp {stored} "${{@: -1}}"; fi\n'
               'for a in "$@"; do case "$a" in file://*) cat "${a#file://}" >> '
               f'{events}; echo >> {events};; esac; done\n',
        "shutdown": f'echo "shutdown $*" >> {calls}\n',
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "user-data.sh").write_text(script)
    path = f"{bin_dir}:{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/bin"
    with (tmp_path / "console").open("wb") as console:
        node = subprocess.Popen(["/bin/bash", str(tmp_path / "user-data.sh")],
                                env={"PATH": path, "FLOW_TEST_NODE": str(tmp_path)}, stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            node.wait(timeout=120)
        finally:  # the boot timeout's watchdog and the log tee outlive the script here
            stop_pids(pids_with_env("FLOW_TEST_NODE", [str(tmp_path)]))
    shipped = [event for line in events.read_text().splitlines() if line.strip()
               for event in json.loads(line)] if events.exists() else []
    return calls.read_text().splitlines(), shipped


def test_a_node_given_a_tampered_wheel_ships_why_and_powers_off(tmp_path: Path) -> None:
    calls, shipped = _boot(tmp_path, b"not the caller's code", sha256="cd" * 32)
    assert calls[-1] == "shutdown -h now"
    assert not (tmp_path / "opt" / "venv").exists()  # nothing was installed
    assert any("put-log-events" in c and "boot.i-0abc" in c for c in calls)
    messages = [str(e["message"]) for e in shipped]
    refusal = next(m for m in messages if "does not have SHA-256" in m)
    assert "cd" * 32 in refusal and "nothing was installed" in refusal
    assert any("finished with exit code 1; powering off" in m for m in messages)
    stamps = [int(str(e["timestamp"])) for e in shipped]
    assert stamps == sorted(stamps) and stamps[0] > 1_600_000_000_000


def test_a_node_of_another_python_ships_why_and_powers_off(tmp_path: Path) -> None:
    wheel = b"the caller's code"
    calls, shipped = _boot(tmp_path, wheel, sha256=hashlib.sha256(wheel).hexdigest(),
                           python="3.99")
    assert calls[-1] == "shutdown -h now"
    assert not (tmp_path / "opt" / "venv").exists()
    assert any(f"runs Python {sdkwheel.python_version()}, but the caller runs Python 3.99"
               in str(e["message"]) for e in shipped)
