"""flow-sdk: turn a decorated Python function into a multi-node GPU job.

    app = FlowApp("train")

    @app.function(gpu="h100:8", num_instances=4)
    def train(lr: float) -> dict: ...

    train.remote(1e-4)        # blocks, returns rank 0's value
    task = train.spawn(1e-4)  # a Task handle

Code written for Flow runs with its import changed: ``Flow().run(train._build_task_config(""),
mounts={"/data": "s3://bucket/prefix"})`` and ``Flow().get_task(task_id)``.
"""

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

from flow_sdk._version import __version__

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
