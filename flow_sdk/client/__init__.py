"""What runs on the caller's machine: ``FlowApp`` and ``@app.function``, ``Task`` handles,
launch progress, task logs, SSH, scripts and the client's task records.

Nothing here imports node code (``flow_sdk.node``, its rendezvous included, node-side volume
preparation), and nothing on a node imports this package: a contract in ``pyproject.toml``.
"""
