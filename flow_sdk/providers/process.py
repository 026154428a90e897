"""The process helpers under their old name, for the simulated cloud's modules that still
import them from here; they live in ``flow_sdk.procs``, which no provider owns."""

from __future__ import annotations

from flow_sdk.procs import free_port, is_alive, kill_group, pids_with_env, start_ticks, stop_pids

__all__ = ["free_port", "is_alive", "kill_group", "pids_with_env", "start_ticks", "stop_pids"]
