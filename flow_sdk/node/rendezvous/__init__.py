"""Node-side coordination: membership, ranks, the start barrier, heartbeats, failure broadcast."""

from flow_sdk.node.rendezvous.env import worker_env
from flow_sdk.node.rendezvous.membership import Membership, assign_ranks, discover, from_record

__all__ = ["Membership", "assign_ranks", "discover", "from_record", "worker_env"]
