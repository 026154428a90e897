"""flow-procs: a flow_sdk provider, shipped as a distribution of its own, whose nodes are
processes over a shared directory (``provider_config={"root": ...}``).

Its nodes have nothing installed beyond an interpreter and the SDK's dependencies: each one's
bootstrap (``boot.py``, standard library only) installs the SDK's wheel and this
distribution's wheel from the shared directory, checked by digest, into a folder of its own,
then runs the node agent, which rebuilds this provider by name from the wheel's entry points.
"""
