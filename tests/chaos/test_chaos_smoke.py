"""The chaos soak's smoke (``bench/chaos.py``): 23 fixed seeds covering every fault kind and
every provider, one test per seed so the runners spread them.

Each seed runs the whole scenario as the soak does: the job through a caller process, the fault
struck from outside at its phase, then the judgement: a terminal state within the scenario's
bound, nothing left (processes in /proc, the simulated account's instances, security groups,
key pairs, placement groups, IAM roles, mounts, loop devices), logs readable up to the fault,
and a successful task's results equal to the fault-free computation's. The seeds were chosen
for short jobs and small shapes (1-2 nodes, 1 worker). A failure names the command that replays
the scenario. As in the soak, a runner's aws-sim seeds share one simulated account
(``sim_bench``), each judged on its own; its slurm seeds run on the runner's Slurm cluster
(the ``slurm`` fixture), brought back to every node idle after each. The time-limit case
takes minutes (Slurm's ``--time`` counts whole minutes): it runs in the bench only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _chaos_draw import KINDS, LANES, PINNED_KINDS, draw  # noqa: E402
from _chaos_run import Bench, run_scenario  # noqa: E402
from chaos import replay_command  # noqa: E402

pytestmark = pytest.mark.slow

# (seed, fault kind, provider): draw(seed, kind, provider) is the scenario
SEEDS = [
    (1445, "caller-sigint", "local"),  # 2x1, restarts 2, at training
    (1741, "caller-sigkill", "aws-sim"),  # 2x1, at training, then `flow gc`
    (1445, "cancel", "local"),  # 2x1, restarts 2, at training
    (1100, "disk-full", "aws-sim"),  # 1x1, at training
    (2273, "ec2-error", "aws-sim"),  # 1x1, at launch
    (1010, "pool-idle-stop", "local"),  # 2x1, a launch as the pool's idle stop fires
    (1010, "pool-kill", "local"),  # 2x1, a pool's worker killed at training
    (1010, "port-taken", "local"),  # 2x1, the store's port taken at launch
    (1168, "s3-error", "aws-sim"),  # 1x1, at result upload
    (1100, "sigkill-agent", "aws-sim"),  # 1x1, at training
    (1031, "sigkill-keeper", "local"),  # 1x1, restarts 1, at boot
    (1031, "sigkill-leader", "aws-sim"),  # 1x1, restarts 1, at boot
    (1031, "sigkill-sshd", "local"),  # 1x1, restarts 1, at boot
    (1031, "sigkill-worker", "local"),  # 1x1, restarts 1, at training
    (2515, "sigstop-agent", "local"),  # 2x1, restarts 1, node 1 at training
    (1031, "sigstop-keeper", "local"),  # 1x1, restarts 1, at boot
    (2018, "sigstop-leader", "local"),  # 2x1, restarts 1, at training
    (1031, "sigstop-sshd", "local"),  # 1x1, restarts 1, at boot
    (1031, "sigstop-worker", "local"),  # 1x1, restarts 1, at training (the runtime cap ends it)
    (1056, "slow-node", "local"),  # 1x1, restarts 1, at the barrier
    (1082, "sigkill-slurmd", "slurm"),  # 2x1, min 1, node 0's slurmd and job at training
    (1095, "scancel", "slurm"),  # 2x1, restarts 2, min 1, at training
    (1082, "node-down", "slurm"),  # 2x1, min 1, node 0 set down at training
]


def test_the_seeds_cover_every_fault_kind_on_every_provider() -> None:
    assert {kind for _, kind, _ in SEEDS} == set(KINDS) - set(PINNED_KINDS)
    assert {provider for _, _, provider in SEEDS} == set(LANES)
    for seed, kind, provider in SEEDS:
        scenario = draw(seed, kind, provider)
        assert scenario.kinds == [kind] and scenario.provider == provider
        assert scenario.nodes <= 2 and scenario.workers == 1


@pytest.fixture(scope="module")
def sim_bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """One simulated account (moto server and fault proxy) for this runner's aws-sim seeds, as
    the soak shares one across its scenarios: each scenario is still judged on its own (its
    own data directory; the whole account must be clean after it, and what a leaking one left
    is purged before the next). The image's SDK environments are the test session's, shared
    with its other simulated clouds (the SDK is installed once, not at every seed's boot)."""
    base = tmp_path_factory.getbasetemp()
    session = base.parent if base.name.startswith("popen-gw") else base
    root = tmp_path_factory.mktemp("chaos-sim")
    bench = Bench(root, sim=True, envs=session / "sim-envs")
    try:
        with pytest.MonkeyPatch.context() as env:  # the account's server is the module's, not
            env.setenv("FLOW_HOME", str(root / "flow-home"))  # the first seed's: stopped by
            bench.__enter__()  # PID when the module is done
        yield bench
    finally:
        bench.__exit__(None, None, None)


@pytest.mark.parametrize(("seed", "kind", "provider"), SEEDS,
                         ids=[f"{kind}-{provider}-{seed}" for seed, kind, provider in SEEDS])
def test_chaos_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    request: pytest.FixtureRequest, seed: int, kind: str,
                    provider: str) -> None:
    monkeypatch.setenv("FLOW_HOME", str(tmp_path / "flow-home"))  # run_scenario sets its own
    scenario = draw(seed, kind, provider)
    if provider == "aws-sim":
        bench: Bench = request.getfixturevalue("sim_bench")
        result = run_scenario(bench, scenario, name=f"{kind}-{seed}")
    elif provider == "slurm":
        cluster = request.getfixturevalue("slurm")
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # the bench sets it too
        with Bench(tmp_path / "chaos", sim=False, cluster=cluster) as bench:
            result = run_scenario(bench, scenario)
    else:
        with Bench(tmp_path / "chaos", sim=False) as bench:
            result = run_scenario(bench, scenario)
    replay = replay_command(scenario, (kind, provider))
    detail = "\n".join(result.leaks + result.lost + result.notes)
    assert result.struck >= 1, f"the fault never struck:\n{detail}\nreplay: {replay}"
    assert result.ok, (f"{scenario.describe()} -> {result.status} in {result.terminal_s}s "
                       f"(bound {result.bound_s}s):\n{detail}\nreplay: {replay}")
