"""The node agent: bootstrap -> rendezvous -> env -> workers -> watch -> results.

Started by a provider on every node with ``FLOW_BOOT`` (task and provider), ``FLOW_INSTANCE_ID``
and ``FLOW_NODE_ADDRESS`` set. It reaches the provider only through the provider interface.

A task runs in generations (``generation``). Generation 0 starts when every node passed the
start barrier. When a worker fails or a node is lost (``watch``), exactly one node decides
(``recovery``): it writes the task's outcome, or, while ``max_restarts`` allows, replaces the
lost nodes and opens the next generation, in which every node rendezvouses again and restarts
its workers. Every generation ends on a node as one ``NodePhase``: DONE, FAILED or RESTARTING,
the phase its node record then shows.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import time
import traceback
from pathlib import Path
from types import FrameType

from flow_sdk import wire
from flow_sdk.providers import sdkwheel
from flow_sdk.wire import signing
from flow_sdk.node.agent import clock
from flow_sdk.node.agent.context import NodeContext
from flow_sdk.node.agent.gang import Gang, OwnNodes, PoolNodes
from flow_sdk.node.agent.generation import Generation
from flow_sdk.node.agent.log import AgentLog
from flow_sdk.node.agent.oom import KernelLog
from flow_sdk.node.agent.records import NodeRecords
from flow_sdk.node.agent.spawn import WarmStart
from flow_sdk.node.agent.forkserver import ForkServer
from flow_sdk.node.agent.timeline import TimelineRecorder
from flow_sdk.node.agent.timers import Deadline
from flow_sdk.node.agent.worker import CALL_CODE_FILE, WARNING_SIGNAL
from flow_sdk.errors import SignatureError
from flow_sdk.wire import BootConfig, NodePhase, TaskRecord, take_node_boot
from flow_sdk.wire.pools import pool_of_task
from flow_sdk.providers import get_provider
from flow_sdk.providers.sdkwheel import PythonMismatchError
from flow_sdk.spec import TaskSpec
from flow_sdk.wire import envvars, runtimecap


class Agent:
    """One node's agent: it checks the task, then runs generations until one ends the task."""

    def __init__(self, boot: BootConfig, instance_id: str, address: str, workdir: Path, *,
                 template: WarmStart | None = None, code_cache: Path | None = None) -> None:
        """``template`` and ``code_cache``: a pool node's warm interpreter (this process,
        forked from it) and its calls' code by digest."""
        provider = get_provider(boot.provider, boot.provider_config)
        secret = signing.secret_from_hex(boot.secret)
        log = AgentLog(provider, boot.task_id, instance_id)
        store = signing.SignedStore(provider.store, secret)  # checks every read
        records = NodeRecords(store, boot.task_id, instance_id, address, log)
        gang: Gang = PoolNodes(provider, store, boot.task_id) if pool_of_task(boot.task_id) \
            else OwnNodes(provider, boot)
        timeline = TimelineRecorder(store, boot.task_id, instance_id, log=log)
        self.node = NodeContext(boot, instance_id, address, workdir, provider, secret, records,
                                log, gang, KernelLog(), timeline, template, code_cache)

    def run(self) -> int:
        """The node's exit status: 0 when the task succeeded or was cancelled (the node
        stopped as asked: a scheduler records its job COMPLETED, not FAILED), else 1."""
        node = self.node
        node.log(f"agent started on {node.instance_id} ({node.address}), task {node.task_id}")
        try:
            record = self._load_task()
            if record is None:
                return 1
            now = time.time()
            clock.mark_up(node.records.store, node.task_id, node.instance_id, now)
            node.timeline.mark("agent_up", at=now)
            phases = os.environ.pop(envvars.BOOT_PHASES_FILE, None)  # the boot's, not a task's
            if phases and not pool_of_task(node.task_id):
                node.timeline.mark_boot_phases(Path(phases))
            spec = TaskSpec.model_validate(record.spec)
            server = self._warm_up(spec, record)
            try:
                return self._run_generations(spec, record, self._runtime_cap(spec, record))
            finally:
                if server is not None:
                    server.close()
        finally:
            node.timeline.mark("end")

    def _warm_up(self, spec: TaskSpec, record: TaskRecord) -> ForkServer | None:
        """Start the node's fork server (``forkserver``: torch imported once, CUDA untouched,
        the workers forked from it) when that saves work: the call's code imports torch,
        torch is installed here, and the node starts more than one worker or may restart
        them. It starts when the first workers do. A pool node's agent has its template
        already; any other task's workers start cold. The server, to close."""
        node = self.node
        if node.template is not None or not record.imports_torch or \
                (spec.slots_per_node < 2 and spec.max_restarts == 0) or \
                importlib.util.find_spec("torch") is None:
            return None
        server = ForkServer(os.environ)
        self.node = dataclasses.replace(node, template=server)
        return server

    def _load_task(self) -> TaskRecord | None:
        """The task record, with the payload written to the work directory; None (the task's
        outcome written) when either is missing or does not check. The record's MAC and the
        payload's digest are checked before either is used."""
        node = self.node
        try:
            raw = node.records.store.get_record(wire.task_key(node.task_id))
            if raw is None:
                node.records.fail(f"node {node.instance_id} found no task record; the launch "
                                  "was incomplete", "infra")
                return None
            record = TaskRecord.from_json(raw)
            blob = self._payload(record.payload_digest, cached=False)
            code = self._payload(record.code_digest, cached=True) if record.code_digest else b""
            sdkwheel.require_python(record.python)
        except (SignatureError, PythonMismatchError) as exc:
            node.records.fail(f"node {node.instance_id} refused to run the task: {exc}", "infra")
            return None
        except FileNotFoundError as exc:
            node.records.fail(str(exc), "infra")
            return None
        (node.workdir / "payload").write_bytes(blob)
        if record.code_digest:
            (node.workdir / CALL_CODE_FILE).write_bytes(code)
        return record

    def _payload(self, digest: str, *, cached: bool) -> bytes:
        """The payload stored under ``digest`` (a digest the signed task record names),
        checked; a call's code comes from the node's cache when it holds it (``cached``).
        Raises FileNotFoundError when the store lacks it."""
        node = self.node
        key = wire.payload_key(digest, pool_of_task(node.task_id))
        kept = node.code_cache / digest if cached and node.code_cache is not None else None
        if kept is not None and kept.is_file():
            return signing.same_digest(key, kept.read_bytes(), digest)
        blob = node.provider.store.get(key)
        if blob is None:
            raise FileNotFoundError(f"payload {digest[:16]} is missing from the store")
        signing.same_digest(key, blob, digest)
        if kept is not None:
            temp = kept.with_name(f".{digest}.{os.getpid()}")
            temp.write_bytes(blob)
            os.replace(temp, kept)
        return blob

    @staticmethod
    def _runtime_cap(spec: TaskSpec, record: TaskRecord) -> Deadline | None:
        """The cap counts from the task's creation, so a replacement node gets only what is
        left; the agents act first (``runtimecap.AGENT``)."""
        at = runtimecap.AGENT.deadline(record.created_at, spec.max_run_time_hours)
        return None if at is None else Deadline(time.monotonic() + at - time.time())

    def _run_generations(self, spec: TaskSpec, record: TaskRecord, cap: Deadline | None) -> int:
        number = self.node.records.current_generation()
        while True:
            ended = Generation(self.node, number, spec, record).run(cap)
            if ended is not NodePhase.RESTARTING:
                return 0 if ended in (NodePhase.DONE, NodePhase.CANCELLED) else 1
            number += 1
            self.node.log.event(f"generation {number} is starting (restart {number} of at "
                                f"most {spec.max_restarts})")


def serve(agent: Agent) -> int:
    """Run ``agent`` in this process: SIGTERM asks it to stop its workers; a scheduler's
    warning before its time limit is noted (``Watch``); a crash is recorded as the task's
    failure. Its exit status."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        agent.node.stop_requested.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(WARNING_SIGNAL, lambda signum, frame: agent.node.warned.set())
    try:
        return agent.run()
    except Exception as exc:  # last resort: record why the node died, then exit non-zero
        agent.node.log("agent crashed:\n" + "".join(traceback.format_exception(exc)))
        agent.node.records.fail(f"node agent on {agent.node.instance_id} crashed: {exc!r}", "sdk")
        return 70


def main() -> int:
    boot, instance_id, address = take_node_boot()  # the secret's traces go with it
    return serve(Agent(boot, instance_id, address,
                       Path(os.environ.get(envvars.NODE_WORKDIR, os.getcwd()))))

