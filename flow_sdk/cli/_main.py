"""The ``flow`` command group: one-line errors, the exit-code table and ``--debug``."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import click

import flow_sdk
from flow_sdk.cli._exits import (
    EXIT_BROKEN_PIPE,
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    error_code,
    one_line,
    usage_line,
)
from flow_sdk.errors import FlowError


class _FlowGroup(click.Group):
    """Turns any error into one line on stderr and the exit code of the table; ``--debug``
    shows the traceback instead."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:  # the group's own options (`flow --bogus`)
            _exit_one_line(exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.ClickException as exc:  # a command's options and arguments
            _exit_one_line(exc)
        except KeyboardInterrupt:
            click.echo("\nflow: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:  # `flow logs -f | grep -m1 ...`: the reader went away
            _drop_stdout()
            ctx.exit(EXIT_BROKEN_PIPE)
        except Exception as exc:  # the last line of defence: every error becomes one line
            if ctx.meta.get("flow.debug"):
                raise
            line = f"flow: {one_line(exc)}"
            if not isinstance(exc, FlowError) and _is_unexpected(exc):
                line += f" ({type(exc).__name__}: unexpected; `flow --debug ...` shows where)"
            click.echo(line, err=True)
            ctx.exit(error_code(exc) if isinstance(exc, FlowError) else EXIT_FAILED)


def _exit_one_line(exc: click.ClickException) -> NoReturn:
    """Click's own errors as one line on stderr with their exit code (2 for usage errors);
    a bare ``flow`` still prints the help."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        raise exc
    line = usage_line(exc) if isinstance(exc, click.UsageError) else " ".join(
        exc.format_message().split())
    click.echo(f"flow: {line}", err=True)
    raise click.exceptions.Exit(exc.exit_code) from None


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so flushing it at exit raises no second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _is_unexpected(exc: BaseException) -> bool:
    """True for errors that are neither the SDK's nor a known library's credentials or
    network error: those deserve a pointer to ``--debug``."""
    return one_line(exc) == " ".join(str(exc).split()) or not str(exc)


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta["flow.debug"] = value
    return value


@click.group(cls=_FlowGroup, epilog=EXIT_CODES_HELP,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(flow_sdk.__version__, prog_name="flow")
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
              help="Show the full traceback of an error instead of one line.")
def main() -> None:
    """Run Python scripts as multi-node GPU tasks, and watch, reach and stop them."""
