"""The launch lease: while a client launches a task, a thread renews the task's
``LaunchLease`` in the object store; the launch ends it as ``launched`` or ``rolled-back``.
A client killed mid-launch (SIGKILL, a crash, a lost machine) stops renewing it, and
``flow gc`` reclaims what that launch left once the lease is stale.

The lease is sealed with the task's secret (a signed record, as the task's other records), so
``flow_sdk.lifecycle`` — which holds the secret on the machine that launched the task — can
tell it from one a store writer forged; a lease that is not sealed so decides nothing. The
final state is also kept on this machine (``tasksecrets.save_launch_end``), where no store
writer can put back an older "launching" lease over it."""

from __future__ import annotations

import os
import socket
import threading
import time

from botocore.exceptions import BotoCoreError

from flow_sdk import wire
from flow_sdk.home import tasksecrets
from flow_sdk.errors import ProviderError
from flow_sdk.wire import LaunchLease, signing
from flow_sdk.providers.base import ObjectStore

TTL_S = 120.0  # a launching lease not renewed for this long belongs to a dead client
RENEW_S = 15.0


class LeaseKeeper:
    """Writes the task's lease now (``launching``), sealed with the task's secret (``secret``,
    hex: the boot configuration's), and renews it every ``RENEW_S`` until ``end`` writes its
    final state."""

    def __init__(self, store: ObjectStore, task_id: str, secret: str) -> None:
        self._store = signing.SignedStore(store, signing.secret_from_hex(secret))
        self._task_id = task_id
        self._key = wire.launch_lease_key(task_id)
        self._holder = f"{socket.gethostname()}:{os.getpid()}"
        self._ttl_s = TTL_S
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ended = False
        self._write("launching")
        self._thread = threading.Thread(target=self._renew, name="flow-launch-lease",
                                        daemon=True)
        self._thread.start()

    def _write(self, state: str) -> None:
        lease = LaunchLease(state, time.time(), self._ttl_s, self._holder)
        self._store.put_record(self._key, lease)

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            with self._lock:
                if self._ended:
                    return
                try:
                    self._write("launching")
                except (ProviderError, BotoCoreError):
                    continue  # the store did not answer: the next renewal tries again

    def end(self, state: str) -> None:
        """Stop renewing and write the final state (``launched`` or ``rolled-back``)."""
        self._stop.set()
        with self._lock:
            self._ended = True
            tasksecrets.save_launch_end(self._task_id, state)
            self._write(state)
        self._thread.join(timeout=5.0)
