"""``flow``: run scripts as multi-node tasks and look after them from the shell.

    flow run -N 2 --workers-per-node 2 train.py --epochs 3
    flow status; flow list; flow logs TASK -f; flow ssh TASK --node 1
    flow cancel TASK; flow plan --gpu h100:8 -N 4 --provider aws; flow gc
    flow pool up dev -N 2 --idle-stop 30m; flow run --pool dev train.py; flow pool down dev
    flow stacks TASK; flow timeline TASK; flow ui

One module per job: ``_main`` (the group, one-line errors), ``_exits`` (the exit-code table),
``_options`` (shared options), ``run``, ``tasks`` (status, list, logs, ssh, cancel, doctor)
``infra`` (plan, gc, volumes, catalog), ``pools`` (pool up, list, down), ``diagnose``
(stacks, timeline) and ``ui`` (the web dashboard).
"""

from __future__ import annotations

from flow_sdk.cli import diagnose, infra, pools, run, tasks, ui
from flow_sdk.cli._exits import EXIT_CODES_HELP, exit_code
from flow_sdk.cli._main import main

__all__ = ["EXIT_CODES_HELP", "diagnose", "exit_code", "infra", "main", "pools", "run",
           "tasks", "ui"]
