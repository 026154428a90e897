"""Every ``FLOW_*`` environment variable of the SDK, declared here and nowhere else: its name and
one line on who sets it and what it holds.

Code names a variable through its constant here (``envvars.NODE_RANK``), never by a literal
(a test scans the package for one), so the list below is all a provider, a node or a user's
code can be given. It sits in ``wire`` because both sides read it: the caller (``FLOW_HOME``),
the providers that start nodes, the node's agent and its workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

PREFIX = "FLOW_"  # the SDK's own: a task's ``environment`` may set only USER_SETTABLE of them
_DOCS: dict[str, str] = {}


def _declare(name: str, doc: str) -> str:
    if not name.startswith(PREFIX) or name in _DOCS or not doc:
        raise ValueError(f"{name}: every variable is declared once, with a line of doc")
    _DOCS[name] = doc
    return name


# -- the caller's machine ------------------------------------------------------------------
HOME = _declare("FLOW_HOME", "the flow data directory (default ~/.flow): task records, task "
                "secrets, wheels, pools, the local provider's nodes and volumes")

# -- what a provider gives a node's agent when it starts it --------------------------------
BOOT = _declare("FLOW_BOOT", "the encoded boot configuration (task, provider, role), its "
                "secret left out (EC2 user-data)")
BOOT_FILE = _declare("FLOW_BOOT_FILE", "or a 0600 file holding the whole boot configuration, "
                     "secret included (local nodes: the secret stays out of environment dumps)")
SECRET_FILE = _declare("FLOW_SECRET_FILE", "a 0600 file holding the task secret that FLOW_BOOT "
                       "leaves out (fetched by the bootstrap)")
INSTANCE_ID = _declare("FLOW_INSTANCE_ID", "the node's instance id; every process of a local "
                       "node carries it (the keeper finds them by it)")
NODE_ADDRESS = _declare("FLOW_NODE_ADDRESS", "the private address the other nodes reach this "
                        "node at")
NODE_WORKDIR = _declare("FLOW_NODE_WORKDIR", "the node's working directory (the agent's "
                        "current directory when unset)")
NODE_CORES = _declare("FLOW_NODE_CORES", "cores of this node when the provider splits a machine "
                      "(local nodes); else the cores the agent may run on")
NODE_DEADLINE = _declare("FLOW_NODE_DEADLINE", "epoch seconds at which a local node's keeper "
                         "stops the node: the runtime cap plus a grace")
NODE_POWEROFF = _declare("FLOW_NODE_POWEROFF", "'shutdown' on a cloud node: a pool's idle stop "
                         "powers the host off through an OS timer")
BOOT_PHASES_FILE = _declare("FLOW_BOOT_PHASES_FILE", "where the bootstrap wrote the times of its "
                            "phases, for the task's timeline")
VOLUME_MODE = _declare("FLOW_VOLUME_MODE", "how a node gives workers their volumes: auto "
                       "(default), namespace or mapped")

# -- the simulated cloud's instances -------------------------------------------------------
SIM_INSTANCE = _declare("FLOW_SIM_INSTANCE", "'<task id>/<instance id>' on every process of a "
                        "simulated instance")
SIM_EFS_ROOT = _declare("FLOW_SIM_EFS_ROOT", "the directory a simulated instance's NFS mounts "
                        "of EFS file systems map to")
SIM_MINUTE_S = _declare("FLOW_SIM_MINUTE_S", "seconds a simulated instance's `shutdown +N` "
                        "counts as one minute")

# -- what every worker is given (documented for users' code) --------------------------------
TASK_ID = _declare("FLOW_TASK_ID", "the task's id")
NODE_RANK = _declare("FLOW_NODE_RANK", "this node's rank, 0 .. FLOW_NUM_NODES - 1")
NUM_NODES = _declare("FLOW_NUM_NODES", "the number of nodes in the gang")
MAIN_IP = _declare("FLOW_MAIN_IP", "the address of node 0, the leader")
RESTART_COUNT = _declare("FLOW_RESTART_COUNT", "how many times the task's workers were "
                         "restarted (0 on the first generation)")
MOUNTS = _declare("FLOW_MOUNTS", "JSON: each volume's or mount's path -> the path a worker uses "
                  "for it, read-only flag and source")
COLLECTIVE_TIMEOUT_S = _declare("FLOW_COLLECTIVE_TIMEOUT_S", "torch.distributed's default "
                                "collective timeout in the workers, in seconds")
MAX_RESULT_BYTES = _declare("FLOW_MAX_RESULT_BYTES", "the largest result a worker may return "
                            "(default 1 GiB); a task's environment may set it")
HEAD_JOB_KEY = _declare("FLOW_HEAD_JOB_KEY", "hex key of the link between a head job and its "
                        "trainers' workers")
PROGRESS_PATH = _declare("FLOW_PROGRESS_PATH", "where a worker reports its steps to its agent")

# -- from the agent to each worker it starts -------------------------------------------------
AGENT_PID = _declare("FLOW_AGENT_PID", "the agent's pid: the worker dies with it")
PAYLOAD_PATH = _declare("FLOW_PAYLOAD_PATH", "the call's payload, as the node stored it")
PAYLOAD_DIGEST = _declare("FLOW_PAYLOAD_DIGEST", "the payload's digest, checked before it is "
                          "unpickled")
CALL_CODE_PATH = _declare("FLOW_CALL_CODE_PATH", "the call's code, when stored apart from its "
                          "arguments")
CALL_CODE_DIGEST = _declare("FLOW_CALL_CODE_DIGEST", "that code's digest")
RESULT_PATH = _declare("FLOW_RESULT_PATH", "where the worker writes its result")
ERROR_PATH = _declare("FLOW_ERROR_PATH", "where the worker writes its error")
STACKS_PATH = _declare("FLOW_STACKS_PATH", "where the worker dumps its stacks when asked")
STAGE_PATH = _declare("FLOW_STAGE_PATH", "where the worker writes the stage it reached")

# The variables a task's ``environment`` may set; the others are the SDK's to set.
USER_SETTABLE = frozenset({MAX_RESULT_BYTES})
DOCS: Mapping[str, str] = MappingProxyType(_DOCS)  # every variable above -> its line of doc
