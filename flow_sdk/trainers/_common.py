"""What both trainers share: typed validation, launch options, datasets, waiting for a task.

Everything here goes through the public API (``FlowApp``, ``RemoteFunction``, ``Task``,
``flow_sdk.data``); nothing reaches into providers or agents.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar


from flow_sdk.node import current
from flow_sdk.client.app import FlowApp, RemoteFunction
from flow_sdk.errors import FieldProblem, FlowError, TaskTimeoutError, ValidationError

if TYPE_CHECKING:
    from flow_sdk.data import ShardedDataConnector
    from flow_sdk.client.task import Task

R = TypeVar("R")

DEFAULT_GPU_TYPE = "h100"
_LAST_LINES_S = 5.0  # how long a streamed log may take to print its last lines


class TrainerError(FlowError, RuntimeError):
    """A trainer was used out of order (``get_booster()`` before ``fit()``,
    ``get_context()`` outside a training function) or its workers could not coordinate."""


@dataclass(frozen=True)
class Place:
    """This worker's place in its task, read from ``flow_sdk.current``."""

    task_id: str | None
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    main_ip: str

    @classmethod
    def here(cls) -> Place:
        def number(name: str) -> int:
            value = getattr(current, name)
            assert isinstance(value, int), (name, value)
            return value

        task_id = current.task_id
        return cls(task_id=task_id if isinstance(task_id, str) else None,
                   rank=number("rank"), local_rank=number("local_rank"),
                   world_size=number("world_size"), local_world_size=number("local_world_size"),
                   node_rank=number("node_index"), num_nodes=number("num_nodes"),
                   main_ip=str(current.main_ip))


def problem(field: str, message: str) -> ValidationError:
    """A ``ValidationError`` for one field."""
    return ValidationError([FieldProblem(field, message)])


def check_int(value: object, field: str, *, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; ``ValidationError`` naming ``field``
    otherwise (booleans and floats are refused, not truncated)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise problem(field, f"must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and at most {maximum}" if maximum is not None else ""
        raise problem(field, f"must be at least {minimum}{upper}, got {value}")
    return value


def check_bool(value: object, field: str) -> bool:
    """``value`` if it is a bool; ``ValidationError`` naming ``field`` otherwise."""
    if not isinstance(value, bool):
        raise problem(field, f"must be True or False, got {value!r}")
    return value


def launch_options(derived: Mapping[str, Any], function_options: Mapping[str, Any] | None,
                   ) -> dict[str, Any]:
    """``@app.function`` options: those derived from a scaling config, plus the caller's
    ``function_options`` (volumes, environment, caps, ...). A caller's option that the
    scaling config decides is refused; ``environment`` is merged (the caller's values win)."""
    options = dict(derived)
    extra = dict(function_options or {})
    clashes = sorted(k for k in extra if k in derived and k != "environment")
    if clashes:
        raise ValidationError([FieldProblem(f"function_options.{k}",
                                            "is set by scaling_config; change the scaling "
                                            "config instead") for k in clashes])
    environment = {**dict(derived.get("environment", {})), **dict(extra.pop("environment", {}))}
    options.update(extra)
    if environment:
        options["environment"] = environment
    return options


def declare(app: FlowApp, fn: Callable[..., R], options: Mapping[str, Any]
            ) -> RemoteFunction[..., R]:
    """Declare ``fn`` on ``app`` with ``options``; invalid options raise ``ValidationError``
    now, before anything is launched."""
    remote: RemoteFunction[..., R] = app.function(**options)(fn)
    return remote


def as_sharded(data: object, field: str) -> ShardedDataConnector:
    """A ``ShardedDataConnector`` over ``data``: a connector (sharded or not), a pyarrow
    ``Table``/``RecordBatch`` or a pandas ``DataFrame``."""
    from flow_sdk.data import DataConnector, ShardedDataConnector

    if isinstance(data, ShardedDataConnector):
        return data
    if isinstance(data, DataConnector):
        return ShardedDataConnector.from_connector(data)
    pa = sys.modules.get("pyarrow")
    if pa is not None and isinstance(data, pa.Table | pa.RecordBatch):
        return ShardedDataConnector.from_arrow(data)
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(data, pd.DataFrame):
        return ShardedDataConnector.from_pandas(data)
    raise problem(field, "must be a DataConnector or ShardedDataConnector (or a pyarrow Table "
                         f"or pandas DataFrame), got {type(data).__name__}")


def node_path(path: str | os.PathLike[str], shares_client_filesystem: bool, field: str
              ) -> str:
    """An absolute path for the nodes: a relative path is made absolute when the nodes share
    this machine's file system (but not its working directory: the provider says so) and
    refused otherwise."""
    text = os.fspath(path)
    if not text:
        raise problem(field, "must be a directory path, got an empty string")
    if os.path.isabs(text):
        return os.path.normpath(text)
    if shares_client_filesystem:
        return os.path.abspath(text)
    raise problem(field, f"must be an absolute path on the nodes (e.g. a file volume's "
                         f"mount path), got {text!r}")


def wait_for_results(task: Task, timeout_s: float | None, *, stream: bool = False
                     ) -> list[Any]:
    """Every rank's return value. With ``stream`` the workers' lines are printed here as
    they are written (from a thread, so ``timeout_s`` still holds). A timeout or an interrupt
    cancels the task, so nothing is left running; a remote exception re-raises with its
    type and remote traceback."""
    printer = None
    if stream:
        printer = threading.Thread(target=_print_logs, args=(task,), name="flow-trainer-logs",
                                   daemon=True)
        printer.start()
    try:
        results = task.results(timeout=timeout_s)
    except (KeyboardInterrupt, TaskTimeoutError):
        task.cancel()
        raise
    finally:
        if printer is not None:  # the task has ended (or was cancelled): its last lines
            printer.join(timeout=_LAST_LINES_S)
    return results


def _print_logs(task: Task) -> None:
    for line in task.logs(follow=True):
        print(line, flush=True)
