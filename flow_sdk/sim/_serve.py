"""The simulated account's moto server process: ``python -m flow_sdk.sim._serve HOME IDLE_S``.

It serves moto (with ``_gaps``) on 127.0.0.1 on a port the kernel picks, with IAM access
control on (``_access``): before it listens it creates the account's IAM user and writes its
keys to ``HOME/keys.json`` (0600); it refuses moto's admin endpoints. It records itself in
``HOME/server.json`` once it listens, and exits, removing that record and its keys, on
SIGTERM or after ``IDLE_S`` seconds in which it answered no request and no simulated
instance under ``HOME/cloud`` was running.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

from flow_sdk.system import procs
from flow_sdk.sim import _access, _gaps
from flow_sdk.sim._server import CLOUD_DIR, ServerState, clear_state, locked, write_state
from flow_sdk.wire import envvars


class Activity:
    """When the server last answered a request (WSGI middleware)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.last = time.monotonic()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        self.last = time.monotonic()
        return self.app(environ, start_response)


def live_instances(cloud: Path) -> list[int]:
    """Pids of the processes of the simulated instances under ``cloud`` that still run (each
    carries its instance's tag, the instance's own process too)."""
    tags = []
    for path in sorted(cloud.glob("instances/*/i-*.json")):
        try:
            tags.append(json.loads(path.read_text())["tag"])
        except (OSError, ValueError):
            continue  # being written: the next look sees it
    return procs.pids_with_env(envvars.SIM_INSTANCE, tags)


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def _idle_exit(home: Path, activity: Activity, idle_s: float) -> None:
    """Return once the server has been idle for ``idle_s`` (its record removed under the lock,
    so no starter is handed a server that is going away)."""
    step = max(0.05, min(1.0, idle_s / 4))
    while True:
        time.sleep(step)
        if time.monotonic() - activity.last < idle_s:
            continue
        if live_instances(home / CLOUD_DIR):
            activity.last = time.monotonic()
            continue
        with locked(home, wait=False) as held:
            if held and time.monotonic() - activity.last >= idle_s:
                clear_state(home, os.getpid())
                return


def main(argv: list[str]) -> int:
    home, idle_s = Path(argv[0]), float(argv[1])
    # The account has no public images: nodes boot from the image it registers itself
    # (``_provider.image_id``), and moto would build its list of Amazon's images again for
    # every EC2 backend it creates or resets.
    os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    from moto.moto_server.threaded_moto_server import MotoRequestHandler, make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    _gaps.install()
    _access.enforce()
    keys = _access.create_account()
    _access.write_keys(home / _access.KEYS_FILE, keys)  # before anyone can connect
    signal.signal(signal.SIGTERM, _stop)
    activity = Activity(_access.guarded_dispatcher())
    server = make_server("127.0.0.1", 0, activity, True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    pid = os.getpid()
    write_state(home, ServerState(pid=pid, ticks=procs.start_ticks(pid),
                                  port=int(server.server_address[1]), started=time.time(),
                                  idle_stop_s=idle_s))
    print(f"simulated aws account serving on 127.0.0.1:{server.server_address[1]} "
          f"(pid {pid}, stops after {idle_s:g} s idle)", flush=True)
    try:
        _idle_exit(home, activity, idle_s)
        print("idle: stopping", flush=True)
    finally:
        clear_state(home, pid)
        _access.remove_keys(home / _access.KEYS_FILE, keys)
        server.shutdown()
    return 0


if __name__ == "__main__":
    procs.exit_now(main(sys.argv[1:]))
