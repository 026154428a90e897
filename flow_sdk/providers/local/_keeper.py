"""The keeper: the one process that runs beside every local node's agent.

The local provider starts it as ``python -I -S _keeper.py STREAM_FILE INSTANCE_ID [-- SSHD...]``
(standard library only, so it starts in milliseconds and no broken package on the node can stop
it). The keeper:

* reads the node agent's stdout and stderr (its stdin, a pipe) and appends every line,
  time-stamped as it arrives, to the node's ``boot.<instance id>`` log stream (the
  FileLogStore line format), so a node that dies before user code can still be debugged
  through ``task.logs(source="boot")``;
* runs the node's ``sshd -D -e`` as its child (its log lines go to the same stream, prefixed
  ``sshd:``);
* when the agent exits (end of the pipe) stops sshd and every process still carrying the node's
  ``FLOW_INSTANCE_ID`` (SSH sessions, anything a worker left behind), then exits itself;
* holds the task's runtime cap as a cloud node's power-off timer does: past
  ``FLOW_NODE_DEADLINE`` (epoch seconds: the cap and a grace, set by the local provider) with
  the agent still there — frozen, or stuck past its own cap — it stops every process of the
  node, so a cap holds even when no agent can enforce it.

Only the standard library may be imported here. Run by path, it loads ``flow_sdk/system/procs.py`` and
``flow_sdk/wire/envvars.py`` (standard library only too) by their paths, without importing the
``flow_sdk`` package.
"""

from __future__ import annotations

import importlib.util
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import ModuleType

def _sibling(name: str) -> ModuleType:
    """``flow_sdk.<name>`` (a standard-library-only module): imported within the package, else
    loaded from its file."""
    if __package__:
        return importlib.import_module(f"flow_sdk.{name}")
    path = Path(__file__).resolve().parents[2].joinpath(*name.split(".")).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(f"flow_sdk_{name.replace('.', '_')}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load flow_sdk.{name} from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


procs = _sibling("system.procs")
envvars = _sibling("wire.envvars")  # the FLOW_* variables the keeper reads


def stop_node_processes(instance_ids: Collection[str]) -> list[int]:
    """Stop every process that carries one of these nodes' instance ids; returns their PIDs."""
    return list(procs.stop_pids(procs.pids_with_env(envvars.INSTANCE_ID, instance_ids)))


class _StreamFile:
    """Appends ``<epoch seconds>\\t<text>`` lines (the FileLogStore format), one write per batch."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # the user's alone
        self._fh = os.fdopen(fd, "ab", buffering=0)  # closed by close()
        self._partial: dict[str, bytes] = {}

    def feed(self, source: str, chunk: bytes, prefix: str = "") -> None:
        data = self._partial.pop(source, b"") + chunk
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial[source] = rest
        self._write(lines, prefix)

    def finish(self, source: str, prefix: str = "") -> None:
        rest = self._partial.pop(source, b"")
        if rest:
            self._write([rest], prefix)

    def _write(self, lines: list[bytes], prefix: str) -> None:
        if not lines:
            return
        now = f"{time.time():.6f}"
        text = "".join(f"{now}\t{prefix}{raw.decode('utf-8', errors='replace').rstrip(chr(13))}\n"
                       for raw in lines)
        self._fh.write(text.encode("utf-8", errors="replace"))

    def note(self, message: str) -> None:
        self._write([message.encode()], "flow-keeper: ")

    def close(self) -> None:
        self._fh.close()


def _start_sshd(sshd_argv: Sequence[str], out: _StreamFile,
                selector: selectors.BaseSelector) -> subprocess.Popen[bytes] | None:
    """Start sshd with its output on a pipe the selector reads (None when it cannot start)."""
    read_end, write_end = os.pipe()
    try:
        sshd = subprocess.Popen(list(sshd_argv), stdin=subprocess.DEVNULL, stdout=write_end,
                                stderr=write_end,
                                preexec_fn=procs.die_with_parent)  # the keeper has no threads
    except OSError as exc:
        out.note(f"could not start sshd ({' '.join(sshd_argv)}): {exc}")
        os.close(read_end)
        return None
    finally:
        os.close(write_end)
    selector.register(read_end, selectors.EVENT_READ, "sshd")
    return sshd


def _stop_sshd(sshd: subprocess.Popen[bytes] | None) -> None:
    if sshd is None or sshd.poll() is not None:
        return
    sshd.terminate()
    try:
        sshd.wait(2.0)
    except subprocess.TimeoutExpired:
        sshd.kill()
        sshd.wait()


def _on_term(signum: int, frame: object) -> None:
    raise SystemExit(143)


def keep(stream_path: Path, instance_id: str, sshd_argv: Sequence[str]) -> int:
    """Copy stdin (the agent's output) to the boot stream and run sshd until stdin ends;
    then stop sshd and everything else of the node."""
    out = _StreamFile(stream_path)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "node")
    sshd = _start_sshd(sshd_argv, out, selector) if sshd_argv else None
    signal.signal(signal.SIGTERM, _on_term)
    code = 0
    try:
        _pump_within_cap(selector, out, instance_id, _cap_deadline(os.environ))
    except Exception as exc:  # the keeper's stderr goes nowhere: its own failure goes here
        for line in "".join(traceback.format_exception(exc)).splitlines():
            out.note(line)
        code = 70
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish cleaning up (SIGKILL still ends it)
        _stop_sshd(sshd)
        left = stop_node_processes([instance_id])  # SSH sessions, leftovers of the workers
        _pump(selector, out, until="sshd", deadline=time.monotonic() + 1.0)
        out.finish("node")
        out.finish("sshd", "sshd: ")
        if left:
            out.note(f"stopped {len(left)} process(es) the node left behind: {left}")
        out.close()
    return code


def _cap_deadline(environ: Mapping[str, str]) -> float | None:
    """``FLOW_NODE_DEADLINE`` as epoch seconds, or None when the task has no runtime cap."""
    value = environ.get(envvars.NODE_DEADLINE)
    return float(value) if value else None


def _pump_within_cap(selector: selectors.BaseSelector, out: _StreamFile, instance_id: str,
                     cap_at: float | None) -> None:
    """Copy the node's output until its agent ends; past ``cap_at`` with the agent still
    there, stop every process of the node first (the agent's end then closes the pipe)."""
    while cap_at is not None and time.time() < cap_at:
        _pump(selector, out, until="node",
              deadline=time.monotonic() + min(1.0, cap_at - time.time()))
        if not any(key.data == "node" for key in selector.get_map().values()):
            return  # the agent ended within the cap
    if cap_at is not None:
        out.note("the task's runtime cap passed and its agent is still there (frozen or "
                 "stuck): stopping every process of the node")
        stopped = stop_node_processes([instance_id])
        out.note(f"stopped {len(stopped)} process(es) at the runtime cap: {stopped}")
    _pump(selector, out, until="node", deadline=None)


def _pump(selector: selectors.BaseSelector, out: _StreamFile, *, until: str,
          deadline: float | None) -> None:
    """Copy from the registered pipes until ``until`` ends (or ``deadline`` passes)."""
    while any(key.data == until for key in selector.get_map().values()):
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            return
        for key, _ in selector.select(timeout):
            chunk = os.read(key.fd, 65536)
            prefix = "sshd: " if key.data == "sshd" else ""
            if chunk:
                out.feed(key.data, chunk, prefix)
            else:
                selector.unregister(key.fd)
                os.close(key.fd)


def keeper_argv(python: str, stream: Path, instance_id: str, sshd_argv: Sequence[str]
                ) -> list[str]:
    """The command line that starts a node's keeper."""
    return [python, "-I", "-S", str(Path(__file__).resolve()), str(stream), instance_id, "--",
            *sshd_argv]


def main(argv: Sequence[str]) -> int:
    if len(argv) >= 2:
        sshd_argv = list(argv[2:])
        if sshd_argv[:1] == ["--"]:
            sshd_argv = sshd_argv[1:]
        return keep(Path(argv[0]), argv[1], sshd_argv)
    print("usage: _keeper.py STREAM_FILE INSTANCE_ID [-- SSHD_ARGV...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
