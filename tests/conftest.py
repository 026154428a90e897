"""Shared fixtures: every test gets its own FLOW_HOME, and no process it started outlives it.
And the suite's order: the long files first, whole, to the runners (``durations.json``); and
its tiers: the live tests ``extended.txt`` lists run only with ``--extended``."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flow_testing import files_longest_first, listed_node_ids, merged_durations
from flow_testing import TIER_LISTED, processes_with_env, unknown_node_ids
from flow_testing import wait_until  # noqa: F401  (re-exported)
from slurm_cluster import SlurmCluster, runner_subnet


def pytest_configure(config: pytest.Config) -> None:
    """A runner started in the background by a shell without job control inherits SIGINT
    ignored, and so would every process a test starts: the Ctrl-C tests would then test
    nothing. Give SIGINT its usual meaning for this run and its children."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# moto builds its list of about 70 public images again for every EC2 backend it creates or
# resets, a third of the CPU of the in-process aws tests: the tests and the moto servers they
# start (they inherit it) use the one image of this file. moto reads the variable when its EC2
# models are imported, so it is set before any test imports moto.
os.environ.setdefault("MOTO_AMIS_PATH", str(Path(__file__).with_name("data") / "moto_amis.json"))

DURATIONS = Path(__file__).with_name("durations.json")
EXTENDED = Path(__file__).with_name("extended.txt")
# A distribution of its own, with its own tests: providers/test_plugin_distribution.py installs
# it into a virtualenv of its own and runs them there.
collect_ignore = ["plugin_provider"]
SLOW_UNTIMED_S = 5.0  # a test marked ``slow`` that the durations file does not list yet
FAST_UNTIMED_S = 0.25  # any other test it does not list (it lists those of a second or more)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--extended", action="store_true",
                     help=f"run the extended tier too: the live tests {EXTENDED.name} lists, "
                          f"which the README's test command leaves out")
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each test's seconds (setup, call and teardown) of this run "
                          f"to {DURATIONS.name}, for the order of the next runs")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` and ``-k`` choose among the marked tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers, then the order.

    The tests ``extended.txt`` lists are marked ``extended``; without ``--extended`` they are
    deselected, and the summary's last lines say how many and how to run them (with xdist the
    runners report the count: its controller collects nothing). A line that names no test of a
    collected file stops the run: a renamed test must not leave the list unnoticed.

    ``--dist loadfile`` hands each runner one whole file at a time, in the order of the
    collection, whenever the runner runs dry: so the files go longest first, by the seconds
    ``durations.json`` lists for their tests (a test it does not list counts as a few seconds
    if marked ``slow``, a quarter of one if not). Long files start early, short ones fill the
    end, and each file's module-scoped fixtures are set up once. A stale file costs only
    time."""
    _choose_tier(config, items)
    listed: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    seconds = {item.nodeid: listed.get(item.nodeid, SLOW_UNTIMED_S if
                                       item.get_closest_marker("slow") else FAST_UNTIMED_S)
               for item in items}
    by_id = {item.nodeid: item for item in items}
    items[:] = [by_id[nodeid] for nodeid in files_longest_first(list(by_id), seconds)]


_LEFT_OUT = pytest.StashKey[int]()  # how many listed tests this run left out
_WORKER_LEFT_OUT = "extended_left_out"  # the same, in a runner's report to the controller


def _choose_tier(config: pytest.Config, items: list[pytest.Item]) -> None:
    extended = listed_node_ids(EXTENDED.read_text())
    unknown = unknown_node_ids(extended, [item.nodeid for item in items],
                               _narrowed_files(config))
    if unknown:
        raise pytest.UsageError(f"{EXTENDED.name} names tests that do not exist: "
                                f"{', '.join(unknown)}; correct or remove those lines")
    chosen = set(extended)
    listed = [item for item in items if item.nodeid in chosen]
    for item in listed:
        item.add_marker(pytest.mark.extended)
    config.stash[TIER_LISTED] = {item.nodeid: item.get_closest_marker("slow") is not None
                                 for item in listed}
    if listed and not config.getoption("extended"):
        config.hook.pytest_deselected(items=listed)
        items[:] = [item for item in items if item.nodeid not in chosen]
        config.stash[_LEFT_OUT] = len(listed)
        if hasattr(config, "workeroutput"):  # an xdist runner: the controller collects nothing
            config.workeroutput[_WORKER_LEFT_OUT] = len(listed)


def _narrowed_files(config: pytest.Config) -> set[str]:
    """The files (as test ids name them) that this run's arguments narrow to some of their
    tests (``FILE::TEST``): their other tests were not collected, not renamed."""
    narrowed = set()
    for arg in config.args:
        if "::" in arg:
            path = Path(arg.split("::", 1)[0]).resolve()
            if path.is_relative_to(config.rootpath):
                narrowed.add(path.relative_to(config.rootpath).as_posix())
    return narrowed


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: what a runner left out (each collects the whole run)."""
    left_out = getattr(node, "workeroutput", {}).get(_WORKER_LEFT_OUT, 0)
    node.config.stash[_LEFT_OUT] = max(node.config.stash.get(_LEFT_OUT, 0), left_out)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    left_out = config.stash.get(_LEFT_OUT, 0)
    if left_out:
        terminalreporter.write_line(f"{left_out} tests of the extended tier ({EXTENDED.name}) "
                                    f"were left out; python3 -m pytest -q --extended runs them")


_timed: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _timed[report.nodeid] = _timed.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``--store-durations``: the seconds of the tests this run ran, in place of what the
    file said of them; it lists tests of at least a second. Written once, by the controller
    (which sees every runner's reports)."""
    if not session.config.getoption("store_durations") or hasattr(session.config,
                                                                  "workerinput"):
        return
    listed = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    DURATIONS.write_text(json.dumps(merged_durations(listed, _timed), indent=0) + "\n")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One real Slurm cluster per test runner (``slurm_cluster.py``), started when a test
    first asks for it: 3 nodes, each on its own loopback address and with two stand-in
    GPUs (GRES ``gpu:h100:2``); stopped by PID at the end. A test that needs it fails, never
    skips, where Slurm is not installed."""
    cluster = SlurmCluster.start(tmp_path_factory.mktemp("slurm"), nodes=3,
                                 subnet=runner_subnet(), extra_conf=["EnforcePartLimits=ALL"],
                                 gpus=2)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def flow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "flow-home"
    monkeypatch.setenv("FLOW_HOME", str(home))
    yield home
    # Anything still running with this FLOW_HOME was started by this test: stop it by PID,
    # then fail the test, so a leak is never silent.
    leftover = processes_with_env("FLOW_HOME", str(home))
    deadline = time.monotonic() + 5
    while leftover and time.monotonic() < deadline:
        time.sleep(0.1)
        leftover = processes_with_env("FLOW_HOME", str(home))
    named = {pid: _command_line(pid) for pid in leftover}
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"processes left running by this test: {named}"


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "(gone)"
