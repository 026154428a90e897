"""What one chaos scenario is, drawn from its seed alone: provider, job shape, faults.

``draw(seed)`` is a pure function of the seed (``random.Random(seed)``), so a scenario is
replayed by its seed. ``draw(seed, kind=..., provider=...)`` pins the fault kind and provider
(the smoke's fixed seeds use it to cover every kind on every provider). The ``slurm`` lane
runs only pinned (``--provider slurm``), on a Slurm cluster the bench starts.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from _chaos_proxy import EC2_ERRORS, S3_ERRORS

PROVIDERS = ("local", "aws-sim")  # what an unpinned scenario draws from
LANES = (*PROVIDERS, "slurm")  # every provider a scenario may be pinned to
PHASES = ("launch", "boot", "rendezvous", "barrier", "training", "upload", "teardown")
EARLY = PHASES[:4]
NODE_PHASES = PHASES[1:]  # a node process exists from boot on
RUN_PHASES = PHASES[4:]  # workers exist from training on

# kind -> (providers it applies to, phases it may strike at)
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sigkill-agent": (LANES, NODE_PHASES),
    "sigkill-worker": (LANES, RUN_PHASES),
    "sigkill-leader": (LANES, NODE_PHASES),
    "sigkill-keeper": (("local",), NODE_PHASES),
    "sigkill-sshd": (("local",), NODE_PHASES),
    "sigstop-agent": (LANES, NODE_PHASES),
    "sigstop-worker": (LANES, RUN_PHASES),
    "sigstop-leader": (LANES, NODE_PHASES),
    "sigstop-keeper": (("local",), NODE_PHASES),
    "sigstop-sshd": (("local",), NODE_PHASES),
    "caller-sigint": (LANES, PHASES),
    "caller-sigkill": (LANES, PHASES),
    "ec2-error": (("aws-sim",), PHASES),
    "s3-error": (("aws-sim",), PHASES),
    "disk-full": (PROVIDERS, NODE_PHASES),
    "port-taken": (PROVIDERS, ("launch",)),
    "slow-node": (LANES, ("boot", "rendezvous", "barrier", "training")),
    "cancel": (LANES, PHASES),
    "pool-kill": (("local",), ("training", "upload")),
    "pool-idle-stop": (("local",), ("launch",)),
    "sigkill-slurmd": (("slurm",), NODE_PHASES),  # a node lost: its slurmd and the job's
    "scancel": (("slurm",), PHASES),  # the job cancelled from outside the task
    "node-down": (("slurm",), NODE_PHASES),  # an administrator sets a node of the job down
    # every process of the job frozen and the caller killed: only Slurm's --time ends it
    "time-limit": (("slurm",), ("training",)),
    "none": (LANES, ("launch",)),  # the fault-free run
}
POOL_KINDS = ("pool-kill", "pool-idle-stop")
PINNED_KINDS = ("none", "time-limit")  # drawn only when pinned (--kind): no fault; minutes
ALONE_KINDS = ("port-taken", *PINNED_KINDS, *POOL_KINDS)  # drawn as the only fault

# EC2 calls by phase (what the caller, the nodes or the teardown call then)
EC2_ACTIONS: dict[str, tuple[str, ...]] = {
    "launch": ("RunInstances", "CreateSecurityGroup", "CreateKeyPair",
               "AuthorizeSecurityGroupIngress", "DescribeInstances"),
    "boot": ("DescribeInstances", "DescribeInstanceAttribute", "RunInstances"),
    "rendezvous": ("DescribeInstances",), "barrier": ("DescribeInstances",),
    "training": ("DescribeInstances",), "upload": ("DescribeInstances",),
    "teardown": ("TerminateInstances", "DeleteSecurityGroup", "DeleteKeyPair",
                 "DescribeInstances", "DescribeSecurityGroups"),
}
S3_METHODS: dict[str, tuple[str | None, ...]] = {
    "launch": ("PUT", "HEAD", None), "boot": ("GET", "HEAD", None),
    "rendezvous": ("GET", "PUT", None), "barrier": ("GET", "PUT", None),
    "training": ("GET", "PUT", None), "upload": ("PUT", None), "teardown": ("PUT", "GET", None),
}


@dataclass(frozen=True)
class Fault:
    kind: str
    phase: str
    node: int  # which node (by rank) a node fault strikes; clipped to the shape
    delay_s: float  # extra wait after the phase is reached
    hold_s: float = 0.0  # slow-node: how long the node stays frozen
    rule: dict[str, Any] = field(default_factory=dict)  # ec2-error / s3-error: the proxy rule


@dataclass(frozen=True)
class Scenario:
    seed: int
    provider: str
    nodes: int
    workers: int
    max_restarts: int
    min_instances: int | None
    steps: int  # the job's work: ``steps`` steps of ``step_s`` each
    step_s: float
    faults: tuple[Fault, ...]

    @property
    def kinds(self) -> list[str]:
        return [f.kind for f in self.faults]

    @property
    def pooled(self) -> bool:
        return any(f.kind in POOL_KINDS for f in self.faults)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        data = json.loads(text)
        data["faults"] = tuple(Fault(**f) for f in data["faults"])
        return cls(**data)

    def describe(self) -> str:
        shape = f"{self.nodes}x{self.workers}, restarts {self.max_restarts}"
        if self.min_instances is not None:
            shape += f", min {self.min_instances}"
        faults = "; ".join(f"{f.kind}@{f.phase} node {f.node}" for f in self.faults)
        return f"seed {self.seed} {self.provider} [{shape}] {faults}"


def _rule(rng: random.Random, kind: str, phase: str) -> dict[str, Any]:
    if kind == "ec2-error":
        code, status = rng.choice(EC2_ERRORS)
        return {"service": "ec2", "code": code, "status": status,
                "action": rng.choice(EC2_ACTIONS[phase]), "skip": rng.randint(0, 1),
                "times": rng.randint(1, 3)}
    code, status = rng.choice(S3_ERRORS)
    return {"service": "s3", "code": code, "status": status,
            "action": rng.choice(S3_METHODS[phase]), "skip": rng.randint(0, 6),
            "times": rng.randint(1, 3)}


def _fault(rng: random.Random, kind: str, nodes: int) -> Fault:
    phase = rng.choice(KINDS[kind][1])
    rule = _rule(rng, kind, phase) if kind in ("ec2-error", "s3-error") else {}
    hold = round(rng.uniform(1.0, 4.0), 2) if kind == "slow-node" else 0.0
    return Fault(kind=kind, phase=phase, node=rng.randrange(nodes),
                 delay_s=round(rng.uniform(0.0, 0.6), 2), hold_s=hold, rule=rule)


def draw(seed: int, kind: str | None = None, provider: str | None = None) -> Scenario:
    """The scenario of ``seed`` (``kind`` / ``provider`` pin the first fault and provider)."""
    rng = random.Random(seed)
    provider = provider or rng.choice(PROVIDERS)
    kinds = [k for k, (providers, _) in sorted(KINDS.items())
             if provider in providers and k not in PINNED_KINDS]
    first = kind or rng.choice(kinds)
    if first in PINNED_KINDS and provider in KINDS[first][0]:
        kinds.append(first)
    if first not in kinds:
        raise ValueError(f"fault kind {first!r} does not apply to {provider}")
    nodes = rng.randint(1, 4)
    workers = rng.randint(1, 2)
    chosen = [first]
    if first not in ALONE_KINDS and rng.random() < 0.35:
        chosen.append(rng.choice([k for k in kinds if k not in ALONE_KINDS]))
    min_instances = rng.randint(1, nodes - 1) if nodes > 1 and rng.random() < 0.3 else None
    if any(k in POOL_KINDS for k in chosen):
        min_instances = None  # a pool runs a task on its fixed nodes
    return Scenario(seed=seed, provider=provider, nodes=nodes, workers=workers,
                    max_restarts=rng.randint(0, 2), min_instances=min_instances,
                    steps=rng.randint(3, 8), step_s=0.25,
                    faults=tuple(_fault(rng, k, nodes) for k in chosen))
