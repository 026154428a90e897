"""The environment every worker process starts with.

In ``distributed_mode="auto"`` a worker gets the variables torchrun's elastic agent gives a
worker of the same layout (torch/distributed/elastic/agent/server/local_elastic_agent.py),
with equal values except where the two launchers cannot agree; ``TORCHRUN_DIFFERENCES`` lists
those, and tests/node/agent/test_torchrun_env.py compares against a real ``torchrun``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from flow_sdk.node.rendezvous.membership import Membership
from flow_sdk.node.rendezvous.threads import node_cores, thread_env
from flow_sdk.wire import envvars

FLOW_VARS = (envvars.TASK_ID, envvars.NODE_RANK, envvars.NUM_NODES, envvars.MAIN_IP,
             envvars.RESTART_COUNT)
TORCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
              "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
              "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NODE_RANK")
ROLE_NAME = "default"  # torchrun's role for the workers it starts

# Variable -> why our value differs from torchrun's for the same layout.
TORCHRUN_DIFFERENCES: dict[str, str] = {
    "MASTER_ADDR": "the leader node's address, which the provider picks",
    "MASTER_PORT": "a port the provider picks per task",
    "TORCHELASTIC_RUN_ID": "the task id (torchrun: --rdzv-id, 'none' by default)",
    "TORCHELASTIC_USE_AGENT_STORE": "'False': no agent hosts a torch store, rank 0 does "
                                    "(torchrun's static rendezvous: 'True')",
    "TORCHELASTIC_ERROR_FILE": "a file in the node's results folder (torchrun: its temp dir)",
    "OMP_NUM_THREADS": "the node's cores split between its workers (torchrun: 1)",
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "not set: it configures torchrun's own agent",
    "NODE_RANK": "set here as well (torchrun reads it, as --node-rank, but does not pass it on)",
}


def torch_env(*, membership: Membership, local_rank: int, slots_per_node: int,
              master_port: int, run_id: str, restart_count: int, max_restarts: int
              ) -> dict[str, str]:
    """The variables torchrun sets for the worker ``local_rank`` of this node."""
    rank = membership.node_rank * slots_per_node + local_rank
    world = membership.num_nodes * slots_per_node
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(slots_per_node),
        "GROUP_RANK": str(membership.node_rank),
        "GROUP_WORLD_SIZE": str(membership.num_nodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": ROLE_NAME,
        "NODE_RANK": str(membership.node_rank),
        "MASTER_ADDR": membership.leader_address,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(False),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                                          "1"),
    }


def worker_env(*, task_id: str, membership: Membership, local_rank: int, slots_per_node: int,
               master_port: int, distributed: bool, restart_count: int = 0,
               max_restarts: int = 0, user_env: Mapping[str, str] | None = None
               ) -> dict[str, str]:
    """FLOW_* always; torchrun's variables in ``auto`` mode; user values win."""
    env = {
        envvars.TASK_ID: task_id,
        envvars.NODE_RANK: str(membership.node_rank),
        envvars.NUM_NODES: str(membership.num_nodes),
        envvars.MAIN_IP: membership.leader_address,
        envvars.RESTART_COUNT: str(restart_count),
    }
    if distributed:
        env.update(torch_env(membership=membership, local_rank=local_rank,
                             slots_per_node=slots_per_node, master_port=master_port,
                             run_id=task_id, restart_count=restart_count,
                             max_restarts=max_restarts))
    # Like torchrun: several workers on one node must not each start a thread per core.
    env.update(thread_env(node_cores(), slots_per_node, user_env or {}))
    env.update(user_env or {})
    return env
