"""The Slurm provider (``provider="slurm"``): a task is one batch job on a Slurm cluster."""

from flow_sdk.providers.slurm._provider import SlurmProvider
from flow_sdk.providers.slurm._settings import SlurmSettings

__all__ = ["SlurmProvider", "SlurmSettings"]
