"""One worker process: check the payload, run the function, write its result or its error.

Started by the node agent as ``python -m flow_sdk.node.agent.worker`` with the rendezvous
environment already set. Exit code 0 means a result file was written; 1 means an error file.
"""

from __future__ import annotations

import errno
import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import IO, Any

from flow_sdk import payload
from flow_sdk.wire import tracebacks
from flow_sdk.errors import PayloadError
from flow_sdk.node import collectives, headjob
from flow_sdk.payload import Call, CodeOrigins
from flow_sdk.wire import envvars
from flow_sdk.system import procs

STACKS_SIGNAL = signal.SIGRTMIN + 4  # a worker dumps its stacks on it (faulthandler)
# A scheduler's warning before its time limit (Slurm's ``--signal=USR1@...``), sent to every
# process of the job: a worker ignores it unless the user's code installs a handler.
WARNING_SIGNAL = signal.SIGUSR1
ORIGINS_SUFFIX = ".origins.json"  # beside the stacks file: the files of the call's code
_stacks_file: IO[str] | None = None
CALL_CODE_FILE = "payload-code"  # in the node's working directory, beside "payload"
DEFAULT_MAX_RESULT_BYTES = 1 << 30  # results travel through the object store; 1 GiB at most


def _die_with_agent() -> None:
    """Ask Linux to SIGKILL this process when the agent that started it dies."""
    if not procs.die_with_parent(int(os.environ.get(envvars.AGENT_PID, "0")) or None):
        os._exit(137)  # the agent died before that could take effect


def _write(path: Path, data: bytes) -> None:
    temp = path.with_name(path.name + ".tmp")
    temp.write_bytes(data)
    os.replace(temp, path)


def failure_facts_path(error_path: Path) -> Path:
    """Beside the error file: what the agent reads of a failure (JSON: when, label, summary),
    without unpickling the user's exception."""
    return error_path.with_name(error_path.name + ".json")


def label_of(exc: BaseException) -> str:
    """``infra`` for a full disk or memory exhausted, ``user`` for any other exception."""
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
        return "infra"
    return "user"


def _write_failure(error_path: Path, exc: BaseException, origins: CodeOrigins,
                   label: str) -> None:
    """The error file, then its facts; ``failed_at`` is taken first, before anything slow."""
    failed_at = time.time()
    _write(error_path, _error_blob(exc, origins))
    first = (str(exc).splitlines() or [""])[0][:300]
    facts = {"failed_at": failed_at, "label": label,
             "summary": f"{type(exc).__name__}: {first}" if first else type(exc).__name__}
    _write(failure_facts_path(error_path), json.dumps(facts).encode())


def _error_blob(exc: BaseException, origins: CodeOrigins) -> bytes:
    """The error file: the exception (when it pickles), its traceback as data for the caller
    to render with its own source (``captured``), and as this node renders it."""
    captured = tracebacks.capture(exc, origins)
    text = tracebacks.render(captured)
    print(text, end="", file=sys.stderr)
    info: dict[str, Any] = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": text,
        "captured": captured,
    }
    try:
        return payload.dumps({**info, "exception": exc})
    except PayloadError:  # the exception object itself does not pickle: ship its text
        return payload.dumps(info)


def _stage(name: str) -> None:
    """Tell the agent which stage this worker reached (``wire.records.WORKER_ACTIVITIES``)."""
    path = os.environ.get(envvars.STAGE_PATH)
    if path:
        _write(Path(path), name.encode())


def _run(call: Call) -> Any:
    """The call; in a ``run_on="head"`` task (the agent gave this worker the head job's link
    key) through the head job: rank 0 runs it with its pool open, the others serve the pool."""
    if envvars.HEAD_JOB_KEY in os.environ:
        return headjob.run_head_only(call.fn, call.args, call.kwargs)
    return call.fn(*call.args, **call.kwargs)


def _diagnosable() -> None:
    """Dump every thread's Python stack into ``FLOW_STACKS_PATH`` on ``STACKS_SIGNAL`` (the
    agent asks when a rank stalls, or ``task.stacks()``); default collective timeouts; the
    scheduler's warning ignored unless the user's code catches it."""
    signal.signal(WARNING_SIGNAL, signal.SIG_IGN)  # its default would end the worker
    stacks = os.environ.get(envvars.STACKS_PATH)
    if stacks:
        global _stacks_file
        _stacks_file = open(stacks, "a")  # kept open for the life of the worker
        faulthandler.register(STACKS_SIGNAL, file=_stacks_file, all_threads=True)
    collectives.install_default_timeout()


def _note_origins(origins: CodeOrigins) -> None:
    """Beside the stacks file: where the call's code came from, so the agent names the
    caller's files in this worker's stacks (``tracebacks.caller_file``)."""
    stacks = os.environ.get(envvars.STACKS_PATH)
    if stacks:
        _write(Path(stacks + ORIGINS_SUFFIX), tracebacks.origins_json(origins).encode())


def main() -> int:
    _die_with_agent()
    _diagnosable()
    blob = Path(os.environ[envvars.PAYLOAD_PATH]).read_bytes()
    code_path = os.environ.get(envvars.CALL_CODE_PATH)  # set when the call's code is stored apart
    code = Path(code_path).read_bytes() if code_path else b""
    result_path = Path(os.environ[envvars.RESULT_PATH])
    error_path = Path(os.environ[envvars.ERROR_PATH])
    if payload.digest(blob) != os.environ[envvars.PAYLOAD_DIGEST] or (
            code_path and payload.digest(code) != os.environ[envvars.CALL_CODE_DIGEST]):
        exc = PayloadError("payload does not match the digest it was stored under; refusing "
                           "to unpickle it")
        _write_failure(error_path, exc, {}, "sdk")
        return 1
    limit = int(os.environ.get(envvars.MAX_RESULT_BYTES, DEFAULT_MAX_RESULT_BYTES))
    origins: CodeOrigins = {}
    try:
        _stage("importing your code")  # unpickling the call imports the modules it uses
        call = payload.unpack_parts(code, blob) if code_path else payload.unpack_call(blob)
        origins = call.origins
        _note_origins(origins)
        _stage("running your code")
        result = _run(call)
        data = payload.dumps(result)
        if len(data) > limit:
            raise PayloadError(
                f"the return value of rank {os.environ.get('RANK', '0')} is {len(data):,} bytes "
                f"serialized, above the {limit:,}-byte limit for results; write large outputs to "
                "a volume or object store and return their path (FLOW_MAX_RESULT_BYTES sets "
                "the limit)")
    except Exception as exc:  # the user's code may raise anything: ship it to the caller
        _write_failure(error_path, exc, origins, label_of(exc))
        return 1
    _write(result_path, data)
    return 0


def run_and_exit() -> None:
    """Run, then leave without the interpreter's teardown (``procs.exit_now``): the result or
    the error is written by then. Python's atexit handlers still run."""
    procs.exit_now(main())


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    run_and_exit()
