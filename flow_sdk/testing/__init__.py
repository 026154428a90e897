"""The provider contract suite, shipped with the SDK: what every provider must do, checked
through the ``Provider`` interface and the public app API only. What a task leaves behind is
found through the provider itself (its instance list and ``flow gc``), never by assuming that
nodes are processes on this machine.

Run it against a provider by name, a built-in or a plug-in from the ``flow_sdk.providers``
entry-point group (pytest must be installed)::

    python -m flow_sdk.testing NAME [--config JSON] [PYTEST OPTIONS...]

which is ``pytest -p flow_sdk.testing.plugin --pyargs flow_sdk.testing.suite --flow-provider
NAME [--flow-provider-config JSON]``. A test suite that sets its provider up itself (a
simulated account, a test cluster) defines a ``provider_under_test`` fixture returning a
``ProviderUnderTest`` and imports the tests (``from flow_sdk.testing.suite import *``).

The suite: a 2-node task end to end (ranks from the launcher's membership record, instances
listed in order, terminate idempotent, nothing left); a launch that gets only part of its gang
starts none of it (the fixture's ``partial_launch`` arranges it; without one that test
fails); ``flow gc`` of an ended task (a dry run first, a running task left alone, nothing
left after); the SSH endpoint of a running node (or the provider's typed refusal); a lost node
replaced through ``add_instances`` (else the provider's typed refusal); a file volume shared
by every node of a task (else, where the provider declares none, the task refused before
launch); object and log store round
trips with their bounds; named volumes (or the provider's typed refusal).
"""

from flow_sdk.testing.target import ProviderUnderTest

__all__ = ["ProviderUnderTest"]
