"""What crosses the wire between the client and the node agents: the store's key layout
(``keys``), the records and their enums (``records``), the typed boot configuration
(``boot``), the signatures over all of it (``signing``), every ``FLOW_*`` environment
variable (``envvars``) and who enforces the runtime cap when (``runtimecap``).

Standard library and ``flow_sdk.errors`` only (an import-linter contract keeps it so), so
both sides of the wire can import it and it can never pull either side in.
"""

import flow_sdk.wire.envvars as envvars
import flow_sdk.wire.runtimecap as runtimecap
from flow_sdk.wire.boot import (
    BootConfig,
    node_boot,
    take_node_boot,
)
from flow_sdk.wire.keys import (
    EVENT_MARK,
    agent_stream,
    agent_up_key,
    agents_up_prefix,
    cancel_key,
    code_key,
    decider_key,
    error_key,
    launch_key,
    launch_lease_key,
    membership_key,
    node_key,
    nodes_prefix,
    outcome_key,
    key_number,
    payload_key,
    rank_stream,
    restart_key,
    restarts_prefix,
    result_key,
    results_prefix,
    task_key,
    task_prefix,
)
from flow_sdk.wire.records import (
    LEASE_MAX_TTL_S,
    LEASE_STATES,
    NODE_PHASES,
    STREAM_KINDS,
    TERMINAL_STATUSES,
    AgentUp,
    GangMember,
    LaunchedNode,
    LaunchLease,
    LaunchRecord,
    MembershipRecord,
    NodePhase,
    NodeRecord,
    Outcome,
    StreamKind,
    TaskRecord,
    TaskStatus,
    to_json,
)

__all__ = [
    "BootConfig", "envvars", "runtimecap",
    "node_boot", "take_node_boot",
    "EVENT_MARK", "agent_stream", "agent_up_key", "agents_up_prefix", "cancel_key", "code_key",
    "decider_key", "error_key", "launch_key", "launch_lease_key", "membership_key", "node_key",
    "key_number", "nodes_prefix", "outcome_key", "payload_key", "rank_stream", "restart_key",
    "restarts_prefix", "result_key", "results_prefix", "task_key", "task_prefix",
    "LEASE_MAX_TTL_S", "LEASE_STATES", "NODE_PHASES", "STREAM_KINDS", "TERMINAL_STATUSES",
    "AgentUp", "GangMember", "LaunchedNode", "LaunchLease", "LaunchRecord", "MembershipRecord",
    "NodePhase", "NodeRecord", "Outcome", "StreamKind", "TaskRecord", "TaskStatus", "to_json",
]
