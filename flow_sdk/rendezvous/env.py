"""The environment every worker process starts with."""

from __future__ import annotations

from collections.abc import Mapping

from flow_sdk.rendezvous.membership import Membership
from flow_sdk.rendezvous.threads import node_cores, thread_env

FLOW_VARS = ("FLOW_TASK_ID", "FLOW_NODE_RANK", "FLOW_NUM_NODES", "FLOW_MAIN_IP")
TORCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
              "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
              "TORCHELASTIC_RUN_ID")


def worker_env(*, task_id: str, membership: Membership, local_rank: int, slots_per_node: int,
               master_port: int, distributed: bool, restart_count: int = 0,
               user_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """FLOW_* always; the torch.distributed variables in ``auto`` mode; user values win."""
    env = {
        "FLOW_TASK_ID": task_id,
        "FLOW_NODE_RANK": str(membership.node_rank),
        "FLOW_NUM_NODES": str(membership.num_nodes),
        "FLOW_MAIN_IP": membership.leader_address,
        "FLOW_RESTART_COUNT": str(restart_count),
    }
    if distributed:
        rank = membership.node_rank * slots_per_node + local_rank
        world = membership.num_nodes * slots_per_node
        env.update({
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(slots_per_node),
            "NODE_RANK": str(membership.node_rank),
            "GROUP_RANK": str(membership.node_rank),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world),
            "MASTER_ADDR": membership.leader_address,
            "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RUN_ID": task_id,
        })
    # Like torchrun: several workers on one node must not each start a thread per core.
    env.update(thread_env(node_cores(), slots_per_node, user_env or {}))
    env.update(user_env or {})
    return env
