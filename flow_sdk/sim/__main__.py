"""``python -m flow_sdk.sim stop``: stop the simulated account of this flow data directory
(``$FLOW_HOME``): its simulated instances, then its moto server, by pid.
``python -m flow_sdk.sim status``: say whether it runs, where and since when."""

from __future__ import annotations

import sys
import time

from flow_sdk.sim._provider import sim_home, stop_account
from flow_sdk.sim._server import read_state

USAGE = "usage: python -m flow_sdk.sim stop|status"


def main(argv: list[str]) -> int:
    if argv == ["stop"]:
        pid = stop_account()
        print("no simulated aws account was running" if pid is None
              else f"stopped the simulated aws account's server (pid {pid})")
        return 0
    if argv == ["status"]:
        state = read_state(sim_home())
        if state is None or not state.alive():
            print("no simulated aws account is running")
            return 0
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.started))
        print(f"simulated aws account: {state.url} (pid {state.pid}, started {started}, "
              f"stops after {state.idle_stop_s:g} s idle)")
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
