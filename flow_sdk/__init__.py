"""flow-sdk: turn a decorated Python function into a multi-node GPU job.

    app = FlowApp("train")

    @app.function(gpu="h100:8", num_instances=4)
    def train(lr: float) -> dict: ...

    train.remote(1e-4)        # blocks, returns rank 0's value
    task = train.spawn(1e-4)  # a Task handle

Code written for Flow runs with its import changed: ``Flow().run(train._build_task_config(""),
mounts={"/data": "s3://bucket/prefix"})`` and ``Flow().get_task(task_id)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flow_sdk import _lazy
from flow_sdk._version import __version__ as __version__

if TYPE_CHECKING:  # at run time each name is imported on first use (``_lazy``)
    from flow_sdk.node import current
    from flow_sdk.client.app import Flow, FlowApp, RemoteFunction, TaskConfig
    from flow_sdk.client.pools import Pool, PoolStatus, list_pools, pool_up
    from flow_sdk.errors import (
        CapacityError,
        HostKeyMismatchError,
        ScriptExitError,
        SshError,
        SshUnavailableError,
        FlowError,
        PayloadError,
        PoolMismatchError,
        PoolNotFoundError,
        ProviderError,
        ServiceNotRunningError,
        RemoteTraceback,
        RendezvousError,
        SignatureError,
        TaskCancelledError,
        TaskError,
        TaskFailedError,
        TaskNotFoundError,
        TaskSecretError,
        TaskTimedOutError,
        TaskTimeoutError,
        ValidationError,
    )
    from flow_sdk.wire import TaskStatus
    from flow_sdk.spec import GpuSpec, TaskSpec, VolumeSpec
    from flow_sdk.client.task import Task
    from flow_sdk.volumes import (
        ReadOnlyMountError,
        Volume,
        VolumeError,
        VolumeInfo,
        VolumeInUseError,
        latest_checkpoint,
        load_checkpoint,
        save_checkpoint,
    )

# each public name -> the module that defines it
_WHERE: dict[str, str] = {
    "current": "flow_sdk.node.current",  # a module
    "Flow": "flow_sdk.client.app",
    "FlowApp": "flow_sdk.client.app",
    "RemoteFunction": "flow_sdk.client.app",
    "TaskConfig": "flow_sdk.client.app",
    "Pool": "flow_sdk.client.pools",
    "PoolStatus": "flow_sdk.client.pools",
    "list_pools": "flow_sdk.client.pools",
    "pool_up": "flow_sdk.client.pools",
    "CapacityError": "flow_sdk.errors",
    "HostKeyMismatchError": "flow_sdk.errors",
    "ScriptExitError": "flow_sdk.errors",
    "SshError": "flow_sdk.errors",
    "SshUnavailableError": "flow_sdk.errors",
    "FlowError": "flow_sdk.errors",
    "PayloadError": "flow_sdk.errors",
    "PoolMismatchError": "flow_sdk.errors",
    "PoolNotFoundError": "flow_sdk.errors",
    "ProviderError": "flow_sdk.errors",
    "ServiceNotRunningError": "flow_sdk.errors",
    "RemoteTraceback": "flow_sdk.errors",
    "RendezvousError": "flow_sdk.errors",
    "SignatureError": "flow_sdk.errors",
    "TaskCancelledError": "flow_sdk.errors",
    "TaskError": "flow_sdk.errors",
    "TaskFailedError": "flow_sdk.errors",
    "TaskNotFoundError": "flow_sdk.errors",
    "TaskSecretError": "flow_sdk.errors",
    "TaskTimedOutError": "flow_sdk.errors",
    "TaskTimeoutError": "flow_sdk.errors",
    "ValidationError": "flow_sdk.errors",
    "TaskStatus": "flow_sdk.wire",
    "GpuSpec": "flow_sdk.spec",
    "TaskSpec": "flow_sdk.spec",
    "VolumeSpec": "flow_sdk.spec",
    "Task": "flow_sdk.client.task",
    "ReadOnlyMountError": "flow_sdk.volumes",
    "Volume": "flow_sdk.volumes",
    "VolumeError": "flow_sdk.volumes",
    "VolumeInfo": "flow_sdk.volumes",
    "VolumeInUseError": "flow_sdk.volumes",
    "latest_checkpoint": "flow_sdk.volumes",
    "load_checkpoint": "flow_sdk.volumes",
    "save_checkpoint": "flow_sdk.volumes",
}


__getattr__, __dir__ = _lazy.exports(__name__, globals(), _WHERE)

__all__ = [
    "CapacityError", "Flow", "FlowApp", "FlowError", "GpuSpec", "PayloadError", "ProviderError",
    "ServiceNotRunningError",
    "RemoteFunction", "RemoteTraceback", "RendezvousError", "Task", "TaskCancelledError",
    "TaskConfig", "TaskError", "TaskFailedError", "TaskNotFoundError", "TaskSpec", "TaskStatus",
    "TaskTimedOutError", "TaskTimeoutError", "ValidationError", "VolumeSpec", "current",
    "ReadOnlyMountError", "Volume", "VolumeError", "VolumeInfo", "VolumeInUseError",
    "latest_checkpoint", "load_checkpoint", "save_checkpoint",
    "HostKeyMismatchError", "ScriptExitError", "SshError", "SshUnavailableError",
    "SignatureError", "TaskSecretError",
    "Pool", "PoolMismatchError", "PoolNotFoundError", "PoolStatus", "list_pools", "pool_up",
]
