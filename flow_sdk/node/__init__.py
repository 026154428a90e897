"""What runs on a node: the agent (generation loop, watch, recovery, workers), ``current`` (a
worker's place in its task) and the head job.

Nothing here imports client code (``flow_sdk.client``), and nothing on the caller's side
imports this package: a contract in ``pyproject.toml``. The public face re-exports
``current`` as ``flow_sdk.current``.
"""
