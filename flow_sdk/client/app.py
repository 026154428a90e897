"""``FlowApp`` and ``@app.function``: the public way to declare and launch a task."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import secrets
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar, overload

from flow_sdk import lifecycle, payload, wire
from flow_sdk.providers import sdkwheel
from flow_sdk.home import tasksecrets
from flow_sdk.client import pools, pooltasks, progress, script_imports, scripts
from flow_sdk.errors import FieldProblem, FlowError, LaunchWarning, ProviderError, ValidationError
from flow_sdk.wire import signing
from flow_sdk.wire import (
    BootConfig,
    GangMember,
    LaunchedNode,
    LaunchRecord,
    MembershipRecord,
    TaskRecord,
    envvars,
)
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import LaunchPlan, LaunchRequest, Provider
from flow_sdk.spec import TaskSpec, build_task_spec
from flow_sdk.client.records import save_client_record
from flow_sdk.client.task import Task

P = ParamSpec("P")
R = TypeVar("R")


def new_task_id(name: str) -> str:
    """``<function>-<yyyymmdd-hhmmss>-<random>``: unique, sortable by start, path-safe."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:24] or "task"
    return f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


class FlowApp:
    """A named group of remote functions sharing a default provider."""

    def __init__(self, name: str = "flow-app", *, provider: str = "local",
                 provider_config: dict[str, Any] | None = None) -> None:
        self.name = name
        self.default_provider = provider
        self._provider_configs: dict[str, dict[str, Any] | None] = {provider: provider_config}
        self._providers: dict[str, tuple[tuple[tuple[str, str], ...], Provider]] = {}

    def provider(self, name: str | None = None) -> Provider:
        """A provider instance for the current environment (e.g. ``FLOW_HOME``, the AWS
        settings) rather than the one at decoration time: built again whenever the ``FLOW_*``
        or ``AWS_*`` environment changed, else reused (building a cloud provider costs API
        calls, which a task on a warm pool would notice)."""
        key = name or self.default_provider
        environment = tuple(sorted((k, v) for k, v in os.environ.items()
                                   if k.startswith((envvars.PREFIX, "AWS_"))))
        cached = self._providers.get(key)
        if cached is None or cached[0] != environment:
            cached = (environment, get_provider(key, self._provider_configs.get(key)))
            self._providers[key] = cached
        return cached[1]

    @overload
    def function(self, fn: Callable[P, R], /) -> RemoteFunction[P, R]: ...

    @overload
    def function(self, fn: None = None, /, **options: Any
                 ) -> Callable[[Callable[P, R]], RemoteFunction[P, R]]: ...

    def function(self, fn: Callable[P, R] | None = None, /, **options: Any
                 ) -> RemoteFunction[P, R] | Callable[[Callable[P, R]], RemoteFunction[P, R]]:
        """Declare a remote function. Options are validated now; bad ones raise
        ``flow_sdk.ValidationError`` naming the field, and nothing is launched. Besides the
        task's options: ``quiet=True`` shows nothing while it starts and runs,
        ``stream="all"`` streams every rank's output (default ``"rank0"``; ``"none"``), and
        ``confirm=False`` launches a paid plan without asking on a terminal."""

        def wrap(func: Callable[P, R]) -> RemoteFunction[P, R]:
            spec_options, caller = progress.split_watch_options(options)
            spec = self._spec_for(getattr(func, "__name__", "task"), spec_options)
            return RemoteFunction(self, func, spec,
                                  progress.WatchOptions(**caller))  # type: ignore[arg-type]

        return wrap(fn) if fn is not None else wrap

    def plan(self, fn: RemoteFunction[..., Any]) -> LaunchPlan:
        """The offer a launch of ``fn`` would try first, its price and its cost at the runtime
        cap, without launching anything. Raises when no offer fits the spec and caps. What
        would refuse the launch itself (the nodes run another Python) is a ``LaunchWarning``
        and the plan's ``warnings``."""
        plan = self.provider(fn.spec.provider).plan(fn.spec)
        for message in plan.warnings:
            warnings.warn(message, LaunchWarning, stacklevel=2)
        return plan

    def _spec_for(self, name: str, options: dict[str, Any]) -> TaskSpec:
        """Validate ``options`` (the app's name, the task's ``name`` and the app's provider
        unless they name their own) and check them with the provider."""
        spec = build_task_spec(**{"app": self.name, "name": name,
                                  "provider": self.default_provider, **options})
        try:
            provider = self.provider(spec.provider)
        except ProviderError as exc:
            raise ValidationError([FieldProblem("provider", str(exc))]) from None
        problems = provider.problems(spec)
        if problems:
            raise ValidationError(problems)
        return spec

    # -- scripts (flow run, submit_file, submit_directory): flow_sdk.client.scripts -------------

    def submit_file(self, path: str | os.PathLike[str], *, args: Sequence[str] = (),
                    **options: Any) -> Task:
        """Run a Python script as a task, like ``flow run FILE.py ARGS...``: its ``__main__``
        runs on every worker of every node with ``sys.argv = [file, *args]`` and the
        rendezvous environment set. ``options`` are the decorator's (``gpu=``,
        ``num_instances=``, ...). The modules it imports from its own directory travel with
        it (see ``flow_sdk.client.script_imports``). Returns the task's handle at once."""
        bundle = scripts.bundle_file(path, args, script_imports.local_module_files(path))
        return self._submit_bundle(bundle, options, script_imports.imported_names(Path(path)))

    def submit_directory(self, directory: str | os.PathLike[str], *, entrypoint: str,
                         args: Sequence[str] = (), **options: Any) -> Task:
        """Ship ``directory`` (without version control, caches and virtual environments) and
        run ``entrypoint``, a path inside it, like ``submit_file``; the script starts in the
        directory's root, so its own modules and files are found."""
        return self._submit_bundle(scripts.bundle_directory(directory, entrypoint, args),
                                   options)

    def _submit_bundle(self, bundle: scripts.ScriptBundle, options: dict[str, Any],
                       imports: Iterable[str] = ()) -> Task:
        """``imports``: the modules the script imports, as far as they are known."""
        spec = self._spec_for(bundle.name, options)
        packed = payload.pack_parts(scripts.RUN_BUNDLE, (bundle,), {}, include=spec.include)
        packed = dataclasses.replace(packed, imports=packed.imports | frozenset(imports))
        return launch_task(self.provider(spec.provider), spec, packed)


class RemoteFunction(Generic[P, R]):
    """A function with a task spec. Call it to run in-process; ``.remote``/``.spawn`` to run
    it as a task on the spec's nodes."""

    def __init__(self, app: FlowApp, fn: Callable[P, R], spec: TaskSpec,
                 watch: progress.WatchOptions | None = None) -> None:
        self.app = app
        self.fn = fn
        self.spec = spec
        self.watch = watch if watch is not None else progress.WatchOptions()
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"RemoteFunction({self.spec.name!r}, nodes={self.spec.num_instances}, " \
               f"provider={self.spec.provider!r})"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def local(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run in this process, like calling the function."""
        return self.fn(*args, **kwargs)

    def with_options(self, **options: Any) -> RemoteFunction[P, R]:
        """A copy with some options replaced (validated like the decorator's)."""
        return self._rebound(self.app, options)

    def _rebound(self, app: FlowApp, options: dict[str, Any]) -> RemoteFunction[P, R]:
        """A copy whose tasks ``app`` launches (its providers and their configuration), with
        ``options`` replacing the spec's, validated like the decorator's."""
        spec_options, caller = progress.split_watch_options(options)
        merged = {**self.spec.model_dump(), **spec_options}
        watch = dataclasses.replace(self.watch, **caller)  # type: ignore[arg-type]
        return RemoteFunction(app, self.fn, app._spec_for(self.spec.name, merged), watch)

    def _build_task_config(self, name: str = "", /, *args: P.args, **kwargs: P.kwargs
                           ) -> TaskConfig:
        """The launch ``spawn(*args, **kwargs)`` would make, as a value ``Flow.run`` takes
        (the name Flow's own SDK gives this). ``name`` names the task, so its id starts with
        it; ``""`` (what Flow's guide passes) keeps the function's name, as ``spawn`` does."""
        function: RemoteFunction[..., Any] = self
        if name:
            function = self._rebound(self.app, {"name": name})
        return TaskConfig(function, args, dict(kwargs))

    def spawn(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """Show the plan (asking first, on a terminal, when it costs money), launch the task
        and return its handle at once."""
        return self._launch(progress.Reporter(self.watch.quiet), args, kwargs)

    def _launch(self, reporter: progress.Reporter, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Task:
        provider = self.app.provider(self.spec.provider)
        refuse_launch(provider, self.spec)  # before the plan asks to confirm it
        if not self.watch.quiet and not pools.pool_is_up(self.spec.pool, provider):
            progress.show_plan(provider.plan(self.spec), reporter, self.watch,
                               notes=provider.notes(self.spec))
        packed = payload.pack_parts(self.fn, args, dict(kwargs), include=self.spec.include)
        return launch_task(provider, self.spec, packed)

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Launch, show each phase and stream rank 0's output (see ``quiet`` and ``stream``
        on the decorator), wait, and return rank 0's value (re-raising a remote exception).
        Interrupting the wait (Ctrl-C) cancels the task."""
        reporter = progress.Reporter(self.watch.quiet)
        task = self._launch(reporter, args, kwargs)
        try:
            progress.watch(task, reporter, "none" if self.watch.quiet else self.watch.stream)
            result: R = task.result()
        except KeyboardInterrupt:
            task.cancel()
            raise
        return result


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """One launch of a remote function, not started yet: the function with its validated
    options (``spec``) and the call's arguments. ``Flow.run`` launches it."""

    function: RemoteFunction[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def spec(self) -> TaskSpec:
        return self.function.spec


class Flow:
    """The client object of code written for Flow: ``Flow().run(config, mounts=...)``
    launches a ``TaskConfig`` (``fn._build_task_config("")``), ``get_task(id)`` re-attaches
    to a task. Without ``provider`` a task runs where its function's ``FlowApp`` sends it;
    with one (and its ``provider_config``, as for ``FlowApp``) it runs there."""

    def __init__(self, provider: str | None = None,
                 provider_config: dict[str, Any] | None = None) -> None:
        self._app = None if provider is None else FlowApp(
            provider=provider, provider_config=provider_config)

    def run(self, task_config: TaskConfig, mounts: dict[str, str] | None = None) -> Task:
        """Launch ``task_config`` as its function's ``spawn`` would and return the task's
        handle at once. ``mounts`` adds read-only S3 mounts (``{"/data": "s3://bucket/p"}``)
        to the function's own (the same path: this one wins), validated like the
        decorator's."""
        function = task_config.function
        options: dict[str, Any] = {}
        if mounts is not None:
            options["mounts"] = ({**function.spec.mounts, **mounts}
                                 if isinstance(mounts, dict) else mounts)
        if self._app is not None:
            options["provider"] = self._app.default_provider
        if options:
            function = function._rebound(self._app or function.app, options)
        return function.spawn(*task_config.args, **task_config.kwargs)

    def get_task(self, task_id: str) -> Task:
        """The handle of a task this machine launched, by id (as ``Task.from_id``)."""
        return Task.from_id(task_id)


def refuse_launch(provider: Provider, spec: TaskSpec) -> None:
    """Raise ``ValidationError`` for what the provider would refuse to launch, though it
    plans it (``Provider.launch_problems``)."""
    problems = provider.launch_problems(spec)
    if problems:
        raise ValidationError(problems)


def launch_task(provider: Provider, spec: TaskSpec, packed: payload.PackedCall) -> Task:
    """Store the call (its code and its arguments, each content-addressed, so unchanged code
    is stored once) and the task record, start the nodes as one gang, then write the gang's
    membership record (every instance id and address), so nodes need not ask the provider
    who their peers are (nodes a scheduler queued have no address yet: their record says so,
    and they ask the provider once they run). The task's secret (which signs every record and
    result) goes to the nodes in their boot config and to a 0600 file on this machine, never
    to the store. A task on a pool (``spec.pool``) runs on the pool's warm nodes instead
    (``pools``)."""
    refuse_launch(provider, spec)
    if spec.pool is not None:
        return pooltasks.launch_on_pool(provider, spec, packed)
    task_id = new_task_id(spec.name)
    secret = signing.new_secret()
    tasksecrets.save_task_secret(task_id, secret)
    signed = signing.SignedStore(provider.store, signing.secret_from_hex(secret))
    store = provider.store
    digests = [payload.digest(packed.args), payload.digest(packed.code)]
    for digest, blob in zip(digests, (packed.args, packed.code)):
        store.put_if_absent(wire.payload_key(digest), blob)
    rdzv_port, master_port = provider.rendezvous_ports()
    record = TaskRecord(task_id, spec.model_dump(mode="json"), digests[0], time.time(),
                        rdzv_port, master_port, python=sdkwheel.python_version(),
                        code_digest=digests[1], imports_torch="torch" in packed.imports)
    signed.put_record(wire.task_key(task_id), record)
    save_client_record(task_id, provider, {"app": spec.app, "name": spec.name,
                                           "created_at": record.created_at})
    boot = BootConfig(task_id, provider.name, provider.node_config(), secret=secret)
    try:
        instances = provider.launch(LaunchRequest(task_id, spec, boot))
    except FlowError as exc:
        lifecycle.record_outcome(signed, task_id, lifecycle.launch_refused(exc))
        raise
    except BaseException as exc:  # Ctrl-C, a signal, a bug: the provider rolled back
        lifecycle.record_outcome(signed, task_id, lifecycle.launch_ended(exc))
        raise
    signed.put_record(wire.membership_key(task_id, 0), MembershipRecord(0, [
        GangMember(i.instance_id, i.address) for i in instances], time.time()))
    launch = LaunchRecord(min(i.launched_at for i in instances), [
        LaunchedNode(i.instance_id, i.instance_type, i.market, i.usd_per_hour, i.zone)
        for i in instances])
    signed.put_record(wire.launch_key(task_id), launch)
    return Task(task_id, provider)
