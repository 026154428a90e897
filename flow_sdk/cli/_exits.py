"""The one table of exit codes every ``flow`` command honours, and the one-line form of an
error, phrased in the command line's own options."""

from __future__ import annotations

import re
import sys

import click

from flow_sdk.errors import (
    LaunchDeclinedError,
    PoolNotFoundError,
    SshError,
    TaskCancelledError,
    TaskNotFoundError,
    TaskTimedOutError,
    ValidationError,
)
from flow_sdk.wire import TaskStatus

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_STOPPED = 3
EXIT_SIGNAL_BASE = 128
EXIT_INTERRUPTED = EXIT_SIGNAL_BASE + 2  # SIGINT (Ctrl-C)
EXIT_BROKEN_PIPE = EXIT_SIGNAL_BASE + 13  # SIGPIPE: the reader of the output went away
EXIT_SSH = 255

EXIT_CODES_HELP = """\b
Exit codes (every command):
  0      success: the task SUCCEEDED, or the command did what was asked
  1      the task FAILED, a provider, network or credentials error, or a check found
         problems (`flow doctor`, `flow gc`)
  2      usage or validation error (bad option, unknown task, node, pool or provider);
         nothing was launched
  3      the task was CANCELLED or TIMED_OUT, or you declined the launch
  N      `flow run` of a script that called sys.exit(N)
  128+S  stopped by signal S: 130 Ctrl-C, 129 SIGHUP, 143 SIGTERM; `flow run` cancels
         the task it started (with --detach it leaves it running); 141 when the
         reader of its output went away (`| head`), silently
  255    `flow ssh` could not connect (otherwise the remote command's code)
`flow status TASK` exits with the code of the task's state (0 while it runs).
Add --debug before the command for the full traceback of an error."""

# Decorator argument -> the `flow run` / `flow plan` option that sets it.
_FLAGS = {"internode_interconnect": "--interconnect",
          "availability_timeout_s": "--availability-timeout", "environment": "--env",
          "boot_timeout_s": "--boot-timeout",
          "volumes": "--volume", "mounts": "--mount", "provider_config": "--provider-config",
          "path": "PATH"}
_FIELD_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(.*)$", re.DOTALL)


def exit_code(status: TaskStatus) -> int:
    """The exit code for a task state: 0 running or succeeded, 1 failed, 3 stopped."""
    if status is TaskStatus.FAILED:
        return EXIT_FAILED
    if status in (TaskStatus.CANCELLED, TaskStatus.TIMED_OUT):
        return EXIT_STOPPED
    return EXIT_OK


def error_code(exc: BaseException) -> int:
    """The exit code for an error that ended a command."""
    if isinstance(exc, ValidationError | TaskNotFoundError | PoolNotFoundError):
        return EXIT_USAGE
    if isinstance(exc, TaskCancelledError | TaskTimedOutError | LaunchDeclinedError):
        return EXIT_STOPPED
    if isinstance(exc, SshError):
        return EXIT_SSH
    return EXIT_FAILED


def flag_of(field: str) -> str:
    """``num_instances`` -> ``--num-instances``; ``volumes./x.size_gb`` -> ``--volume /x.size_gb``."""
    match = _FIELD_RE.match(field)
    if match is None:
        return field
    head, rest = match[1], match[2]
    flag = _FLAGS.get(head, "--" + head.replace("_", "-"))
    return flag + (f" {rest.lstrip('.')}" if rest else "")


def one_line(exc: BaseException) -> str:
    """The error as one line (a validation error lists its problems separated by ';')."""
    if isinstance(exc, ValidationError):
        return "; ".join(f"{flag_of(p.field)}: {p.message}" for p in exc.problems)
    return _library_hint(exc) or " ".join(str(exc).split()) or type(exc).__name__


def _library_hint(exc: BaseException) -> str | None:
    """Credentials and network errors of the cloud libraries, with what to do."""
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None:
        if isinstance(exc, botocore.NoCredentialsError | botocore.PartialCredentialsError):
            return ("no AWS credentials found: set AWS_PROFILE (or AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY), or run `aws configure`; see the README's "
                    "'AWS set-up'")
        if isinstance(exc, botocore.NoRegionError):
            return "no AWS region set: pass --region or set AWS_DEFAULT_REGION"
        if isinstance(exc, botocore.EndpointConnectionError):
            return f"network: {exc}; check your connection and the region"
        if isinstance(exc, botocore.ClientError):
            error = exc.response.get("Error", {})
            return f"AWS refused: {error.get('Code', '?')}: {error.get('Message', exc)}"
    if isinstance(exc, ConnectionError | TimeoutError):
        return f"network: {exc}"
    return None


def usage_line(exc: click.UsageError) -> str:
    """A usage error of the command line as one line: the flag (or argument) it is about, what
    is wrong, and the fix (the command's usage, or where its options are listed)."""
    ctx = exc.ctx
    path = ctx.command_path if ctx is not None else "flow"
    usage = (f"{path} {' '.join(ctx.command.collect_usage_pieces(ctx))}" if ctx is not None
             else path)
    helps = f"`{path} --help` lists the options"
    if isinstance(exc, click.NoSuchOption):
        close = f" (did you mean {', '.join(exc.possibilities)}?)" if exc.possibilities else ""
        return f"{exc.option_name}: no such option for `{path}`{close}; {helps}"
    if isinstance(exc, click.MissingParameter):
        name = _param_name(exc.param, ctx) if exc.param is not None else (exc.param_hint or "")
        return f"{name}: missing; write `{usage}`"
    if isinstance(exc, click.BadParameter):
        name = (exc.param_hint if isinstance(exc.param_hint, str) else
                _param_name(exc.param, ctx) if exc.param is not None else path)
        message = " ".join(exc.message.split()).rstrip(".")
        return f"{name}: {message}" + ("" if ";" in message else f"; {helps}")
    message = " ".join(exc.format_message().split()).rstrip(".")
    return message if ";" in message else f"{message}; write `{usage}` ({helps})"


def _param_name(param: click.Parameter, ctx: click.Context | None) -> str:
    """An option's longest flag (``--num-instances``), or an argument's metavar (``PATH``)."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.make_metavar(ctx) if ctx is not None else (param.name or "").upper()
