"""Where the client and the node agents find each other's records in a provider's store.

The key layout and the log stream names, in one place, so the client side and the node side
cannot drift apart.
"""

from __future__ import annotations

import re

_RANK_STREAM = re.compile(r"node-(0|[1-9][0-9]{0,8})\.rank-(0|[1-9][0-9]{0,8})")


def payload_key(digest: str, pool_id: str = "") -> str:
    """A content-addressed payload (a call's code or its arguments); a pool's tasks keep
    theirs in the pool's folder."""
    return f"tasks/{pool_id}/payloads/{digest}" if pool_id else f"payloads/{digest}"


def code_key(sha256: str) -> str:
    """The caller's SDK wheel (``flow_sdk.providers.sdkwheel``), content-addressed by its SHA-256."""
    return f"code/{sha256}.whl"


def task_key(task_id: str) -> str:
    return f"tasks/{task_id}/task.json"


def outcome_key(task_id: str, slot: int = 0) -> str:
    """The task's outcome in ``slot``: the first valid record over the slots, in order, is
    the outcome. A forged record in one moves the writers on to the next, never blocks them:
    the slots have no end, and readers stop at the first empty one."""
    return f"tasks/{task_id}/outcome.json" if slot == 0 else \
        f"tasks/{task_id}/outcome.{slot}.json"


def restart_key(task_id: str, generation: int) -> str:
    """Written by the node that decided a failed generation restarts (``max_restarts``)."""
    return f"tasks/{task_id}/restarts/{generation:06d}"


def restarts_prefix(task_id: str) -> str:
    return f"tasks/{task_id}/restarts/"


def decider_key(task_id: str, generation: int, slot: int = 0) -> str:
    """Claimed (put_if_absent, a signed record) by the one node that decides how a failed
    generation ends: the first slot that holds no forged claim (the slots have no end)."""
    return f"tasks/{task_id}/decider/{generation:06d}/{slot:02d}"


def agent_up_key(task_id: str, instance_id: str) -> str:
    """Written (put_if_absent) by a node's agent when it starts: the availability clock runs
    from the earliest of them."""
    return f"tasks/{task_id}/up/{instance_id}"


def agents_up_prefix(task_id: str) -> str:
    return f"tasks/{task_id}/up/"


def launch_key(task_id: str) -> str:
    return f"tasks/{task_id}/launch.json"


def launch_lease_key(task_id: str) -> str:
    """Kept by the launching client while it starts the task's nodes (``LaunchLease``)."""
    return f"tasks/{task_id}/launch-lease.json"


def membership_key(task_id: str, generation: int) -> str:
    """The gang of one generation, written once: by the launcher for generation 0, by the
    node that starts replacements for the next one."""
    return f"tasks/{task_id}/membership/{generation:06d}.json"


def cancel_key(task_id: str) -> str:
    return f"tasks/{task_id}/cancel"


def result_key(task_id: str, rank: int) -> str:
    return f"tasks/{task_id}/results/{rank:06d}"


def results_prefix(task_id: str) -> str:
    return f"tasks/{task_id}/results/"


def error_key(task_id: str, rank: int) -> str:
    return f"tasks/{task_id}/errors/{rank:06d}"


def node_key(task_id: str, node: int) -> str:
    return f"tasks/{task_id}/nodes/{node:06d}.json"


def nodes_prefix(task_id: str) -> str:
    return f"tasks/{task_id}/nodes/"


def task_prefix(task_id: str) -> str:
    return f"tasks/{task_id}/"


def key_number(text: str) -> int | None:
    """The number a key's last part spells in ASCII decimal digits (at most 18), else None.
    ``str.isdigit`` alone is no guard: it accepts "²" and other digits ``int`` refuses."""
    if not (0 < len(text) <= 18 and text.isascii() and text.isdigit()):
        return None
    return int(text)


def rank_stream(node: int, rank: int) -> str:
    """The log stream of one worker."""
    return f"node-{node}.rank-{rank}"


def rank_stream_place(stream: str) -> tuple[int, int] | None:
    """(node, rank) of a worker's log stream name; None for any name ``rank_stream`` does
    not write."""
    match = _RANK_STREAM.fullmatch(stream)
    return None if match is None else (int(match[1]), int(match[2]))


def agent_stream(instance_id: str) -> str:
    """The log stream of one node's agent, named by instance so it exists before the rendezvous."""
    return f"agent.{instance_id}"


# Marks an agent line that reports a task event (a lost node, a restart, a replacement, the
# generation): the caller shows it among the workers' output, labelled [flow].
EVENT_MARK = "[flow] "
