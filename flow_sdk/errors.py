"""Typed errors. Every message says what went wrong and what to do about it."""

from __future__ import annotations

import errno
import shlex
from dataclasses import dataclass


def install_hint(what: str, *packages: str) -> str:
    """``"SSH needs paramiko: pip install paramiko"``: every hint names the packages as the
    package index knows them (this SDK itself installs from its checkout, not by name)."""
    return f"{what} needs {', '.join(packages)}: pip install {shlex.join(packages)}"


class FlowError(Exception):
    """Base class of every error raised by flow-sdk."""


@dataclass(frozen=True)
class FieldProblem:
    """One rejected field of a user's task description."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class ValidationError(FlowError, ValueError):
    """The task description is invalid. Raised before anything is launched.

    ``problems`` lists every rejected field with the reason and the fix.
    """

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid task specification ({len(self.problems)} problem(s)):\n{lines}")

    @property
    def fields(self) -> list[str]:
        return [p.field for p in self.problems]


class LaunchWarning(UserWarning):
    """A plan that a launch would refuse as it stands (``app.plan`` warns, launching raises)."""


class ProviderWarning(UserWarning):
    """An installed provider plug-in that is left out (it takes a built-in provider's name)."""


class ProviderError(FlowError):
    """A provider could not do what was asked (launch, describe, terminate, store)."""


class ServiceNotRunningError(ProviderError):
    """A provider's own service that holds its state (the simulated account's server) is not
    running, and a command that only reads started none: nothing of it runs."""


class CapacityError(ProviderError):
    """No offer could be launched: every attempt is listed in the message."""


class TaskNotFoundError(FlowError, LookupError):
    """No task with this id is known to this machine's flow data directory."""


class PoolNotFoundError(FlowError, LookupError):
    """No pool of that name was made on this machine (or it is down)."""


class PoolMismatchError(ValidationError):
    """A task that does not fit its pool: each problem names the field that differs and how
    the pool has it."""


class TaskTimeoutError(FlowError, TimeoutError):
    """Waiting for a task took longer than the caller allowed. The task keeps running."""


class TaskError(FlowError):
    """A task ended without a result. ``status`` is its terminal state."""

    def __init__(self, message: str, *, task_id: str, status: str) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.status = status


class TaskFailedError(TaskError):
    """A worker or a node failed. Names the node, rank, exit code or signal, the log tail,
    the failure's label and the later failures it caused."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str,
        node: int | None = None,
        rank: int | None = None,
        exit_code: int | None = None,
        signal_name: str | None = None,
        log_tail: list[str] | None = None,
        label: str | None = None,
        consequences: list[str] | None = None,
    ) -> None:
        super().__init__(message, task_id=task_id, status="FAILED")
        self.node = node
        self.rank = rank
        self.exit_code = exit_code
        self.signal_name = signal_name
        self.log_tail = list(log_tail or [])
        self.label = label  # "user", "infra" or "sdk": whose fault it was
        self.consequences = list(consequences or [])  # the failures it caused


class TaskCancelledError(TaskError):
    """The task was cancelled before it produced a result."""


class TaskTimedOutError(TaskError):
    """The task hit its ``max_run_time_hours`` cap and was stopped on the nodes."""


class RecordError(FlowError, ValueError):
    """A record read from a provider's store is not one this version of flow-sdk wrote: it is
    not JSON, lacks or adds a field, or holds an unknown phase or status. Names the record and
    the value; the fix is to run the same flow-sdk version on the client and the nodes."""


class PayloadError(FlowError):
    """A payload or result could not be serialized, or failed its digest check."""


class RendezvousError(FlowError):
    """Nodes could not find each other or did not all arrive in time."""


class SshError(FlowError):
    """An SSH connection to a node failed, or the node cannot be reached over SSH."""


class SshUnavailableError(SshError):
    """The node has no SSH endpoint (no sshd where it runs, or the node has stopped)."""


class HostKeyMismatchError(SshError):
    """The node presented a host key other than the one pinned at launch: the connection
    was refused before authenticating. Someone may be intercepting it, or the node is not the
    one that was launched."""


class ScriptExitError(FlowError):
    """The script ended with ``sys.exit(code)`` and a non-zero code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[type[ScriptExitError], tuple[str, int]]:
        return type(self), (str(self), self.code)


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised on a node.

    Set as ``__cause__`` of the re-raised exception so it prints below it.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\nRemote traceback:\n{self.text}"


class LaunchDeclinedError(FlowError):
    """The caller answered no when asked to confirm a launch that costs money."""


class SignatureError(PayloadError):
    """An object read from a task's store failed its HMAC-SHA256 or AES-GCM check with the task's
    secret: it was forged, altered, or written for another key. ``key`` names it. Nothing of
    it was unpickled or acted on."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}; it was not written by this task's client or nodes "
                         "(forged or altered), so it was refused before being read. Check who "
                         "else can write to the task's store.")
        self.key = key


class TaskSecretError(FlowError):
    """The task's secret is missing or malformed, so nothing of the task can be trusted."""


class VolumeError(FlowError):
    """A volume or mount could not be created, found, attached, mounted or deleted."""


class VolumeInUseError(VolumeError):
    """The volume is used by a running task (or, for a block volume, attached elsewhere)."""


class ReadOnlyMountError(VolumeError, OSError):
    """A write to a read-only S3 mount. ``errno`` is ``EROFS``, like the kernel's own error."""

    def __init__(self, mount_path: str, source: str, path: str) -> None:
        message = (f"{mount_path} is a read-only mount of {source}; S3 mounts cannot be "
                   "written: write to a volume (volumes={...}) instead")
        OSError.__init__(self, errno.EROFS, message, path)
        self.mount_path = mount_path
        self.source = source

    def __reduce__(self) -> tuple[type[ReadOnlyMountError], tuple[str, str, str]]:
        return (type(self), (self.mount_path, self.source, str(self.filename)))

    def __str__(self) -> str:
        return f"[Errno {errno.EROFS}] {self.strerror}: {self.filename!r}"
