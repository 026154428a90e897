"""Each worker's share of its node's cores, as the thread-count variables libraries read.

Several workers on one node (and, on the local provider, several nodes on one machine) must not
each start a thread per core: 2 workers x 2 threads on 2 cores run slower than 2 x 1. The
provider may say how many cores a node has in ``FLOW_NODE_CORES`` (the local provider gives
each node its share of the machine); otherwise the node has the cores this process may run on
(a cloud instance's vCPUs). Each worker slot gets ``cores // slots`` threads (at least one),
through the variables that OpenMP (torch's intra-op pool, XGBoost, Arrow's CPU pool), MKL,
OpenBLAS and numexpr read at start. A variable the user sets in ``environment`` wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from flow_sdk.wire import envvars

# OMP_NUM_THREADS also sizes torch's intra-op pool, XGBoost's default nthread and Arrow's CPU
# pool (pyarrow.cpu_count()).
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS")


def node_cores(environ: Mapping[str, str] | None = None) -> int:
    """Cores of this node: ``FLOW_NODE_CORES`` when the provider set it, else the cores this
    process may run on."""
    env = os.environ if environ is None else environ
    given = env.get(envvars.NODE_CORES, "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return len(os.sched_getaffinity(0))


def thread_env(cores: int, slots: int, user_env: Mapping[str, str]) -> dict[str, str]:
    """The thread-count variables for one of ``slots`` workers sharing ``cores`` cores; a
    variable present in ``user_env`` is left out (the user's value is used)."""
    share = str(max(1, cores // max(1, slots)))
    return {name: share for name in THREAD_VARS if name not in user_env}
