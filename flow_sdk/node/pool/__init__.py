"""A pool node: the daemon that runs a pool's tasks one after another on a warm node.

Started instead of a task's agent when a node boots for a pool (``BootConfig.role ==
"pool"``; ``python -m flow_sdk.node.pool``). The daemon keeps a warm template (this
interpreter, with the SDK and torch imported and CUDA untouched), watches the pool's signed
assignments for this node, and for each task forks the task's agent from the template (workers
fork from it too), then stops everything the task left and arms the node's idle stop again.
"""
